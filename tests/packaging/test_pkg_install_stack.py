"""docker/install_stack.py: the one install script of every image and of the CPU test venv.

Dry runs for cuda/ascend/musa must print the resolved plan (checked here step by step); a
broken stack file or option fails with a message naming it; and for ``cpu`` the script really
installs into a fresh venv, after which the installed copy serves a request (e2e, slow)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import venv

import pytest
from pkg_helpers import MAKE_FLAG, ROOT, VENDORS, run

sys.path.insert(0, str(ROOT / "docker"))
import host_engine  # noqa: E402 - docker/ is not a package

SCRIPT = ROOT / "docker" / "install_stack.py"
FLAGCX_TAG = "v0.13.0"


def dry_run(platform: str, *extra: str, script=SCRIPT) -> dict:
    result = run([sys.executable, str(script), "--platform", platform, "--dry-run", "--json",
                  *extra])
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def commands(plan: dict, step: str) -> list[list[str]]:
    (found,) = [s for s in plan["steps"] if s["name"] == step]
    return found["commands"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_vendor_plan_order_and_contents(vendor):
    plan = dry_run(vendor, "--python", "/opt/vendor/bin/python3", "--flagcx-dir", "/opt/flagcx")
    names = [s["name"] for s in plan["steps"]]
    assert names == ["python", "vendor", "requirements", "empty-mode", "plugin", "flagcx", "verify"]
    assert "torch" in plan["provided"]

    # requirements are installed under the constraints that freeze the vendor's torch
    (req,) = commands(plan, "requirements")
    assert req[:4] == ["/opt/vendor/bin/python3", "-m", "pip", "install"]
    assert req[req.index("-c") + 1].endswith(".txt")
    assert str(ROOT / "docker" / "stacks" / "common.txt") in req
    (empty,) = commands(plan, "empty-mode")
    assert "--no-deps" in empty
    assert {"sglang==0.5.11", "flag_gems==5.0.2"} <= set(empty)
    assert ("sglang-kernel==0.4.2" in empty) == (vendor == "cuda")
    assert "xgrammar==0.1.32" in empty  # SGLang's default grammar backend, no stock triton

    clone, make, cleanup = commands(plan, "flagcx")
    assert clone[:2] == ["git", "clone"] and clone[clone.index("--branch") + 1] == FLAGCX_TAG
    assert clone[-1] == "/opt/flagcx" and clone[-2] == "https://github.com/flagos-ai/FlagCX.git"
    assert "--recurse-submodules" not in clone  # json from nlohmann-json3-dev; no googletest
    assert make[:3] == ["make", "-C", "/opt/flagcx"] and MAKE_FLAG[vendor] in make
    assert [f for f in MAKE_FLAG.values() if f in make] == [MAKE_FLAG[vendor]]
    assert cleanup[:2] == ["rm", "-rf"]
    assert plan["flagcx"] == {"tag": FLAGCX_TAG, "path": "/opt/flagcx"}

    # only Ascend installs its PyTorch pair itself; the others keep the base image's
    vendor_cmds = commands(plan, "vendor")
    if vendor == "ascend":
        (cmd,) = vendor_cmds
        assert {"torch==2.10.0", "torch-npu==2.10.0"} <= set(cmd)
    else:
        assert vendor_cmds == []


def test_common_requirements_leave_the_vendor_stack_alone():
    names = []
    for line in (ROOT / "docker/stacks/common.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.append(line.split("=")[0].split(">")[0].split("<")[0].strip().lower())
    assert not {"torch", "triton", "numpy", "torchvision", "sglang", "flag_gems"} & set(names)


def test_cuda_nccl_home_resolves_in_the_target_python():
    plan = dry_run("cuda")
    (_, make, _) = commands(plan, "flagcx")
    ccl = [w for w in make if w.startswith("CCL_HOME=")]
    assert ccl and ("nvidia" in ccl[0] and "nccl" in ccl[0])
    assert "CCL_LINK=-l:libnccl.so.2" in make


def test_text_dry_run_prints_every_command():
    result = run([sys.executable, str(SCRIPT), "--platform", "musa", "--dry-run"])
    assert result.returncode == 0
    out = result.stdout
    assert "platform=musa" in out
    assert "$ make -C /opt/flagcx" in out and "USE_MUSA=1" in out
    assert "--no-deps sglang==0.5.11 flag_gems==5.0.2" in out


def test_cpu_plan_uses_the_tested_requirements_and_has_no_flagcx():
    plan = dry_run("cpu")
    assert [s["name"] for s in plan["steps"]] == [
        "python", "vendor", "requirements", "empty-mode", "plugin", "verify"]
    (req,) = commands(plan, "requirements")
    assert str(ROOT / "requirements" / "sglang-0.5.11-cpu.txt") in req
    assert plan["flagcx"] is None
    # PyPI's torch is the CUDA build: the CPU one comes first, from PyTorch's CPU index
    (vendor,) = commands(plan, "vendor")
    assert vendor[-3:] == ["--extra-index-url", "https://download.pytorch.org/whl/cpu",
                           "torch==2.13.0"]
    assert plan["provided"] == ["torch"]


def test_vendor_index_can_be_replaced_or_left_to_pip():
    (vendor,) = commands(dry_run("cpu", "--vendor-index-url", "https://mirror.example/whl/cpu"),
                         "vendor")
    assert vendor[-3:] == ["--extra-index-url", "https://mirror.example/whl/cpu", "torch==2.13.0"]
    (vendor,) = commands(dry_run("cpu", "--vendor-index-url", ""), "vendor")
    assert "--extra-index-url" not in vendor and vendor[-1] == "torch==2.13.0"


@pytest.mark.parametrize("platform", ["cpu", *VENDORS])
def test_phases_split_the_plan_for_a_cached_image_build(platform):
    """deps: everything slow and rarely changing; plugin: freeze again, plugin, verify. Their
    union is the whole plan, and the plugin phase installs no vendor package again."""
    full = [s["name"] for s in dry_run(platform)["steps"]]
    deps = dry_run(platform, "--phase", "deps")
    plugin = dry_run(platform, "--phase", "plugin")
    assert deps["phase"] == "deps" and plugin["phase"] == "plugin"
    deps_names = [s["name"] for s in deps["steps"]]
    plugin_names = [s["name"] for s in plugin["steps"]]
    assert "plugin" not in deps_names and "verify" not in deps_names
    assert plugin_names == ["python", "vendor", "plugin", "verify"]
    assert set(deps_names) | set(plugin_names) == set(full)
    assert commands(plugin, "vendor") == []
    assert ("flagcx" in deps_names) == (platform != "cpu")


def test_flagcx_from_a_mirror():
    plan = dry_run("musa", "--flagcx-repo", "http://127.0.0.1:8000/flagcx.git")
    clone = commands(plan, "flagcx")[0]
    assert clone[-2:] == ["http://127.0.0.1:8000/flagcx.git", "/opt/flagcx"]
    assert clone[clone.index("--branch") + 1] == FLAGCX_TAG


def test_skip_flagcx_and_pip_args():
    plan = dry_run("cuda", "--skip-flagcx", "--pip-arg=--no-cache-dir")
    assert "flagcx" not in [s["name"] for s in plan["steps"]]
    (empty,) = commands(plan, "empty-mode")
    assert empty[4] == "--no-cache-dir"


def test_unknown_platform_is_refused_with_the_choices():
    result = run([sys.executable, str(SCRIPT), "--platform", "rocm", "--dry-run"])
    assert result.returncode == 2
    assert "unknown platform 'rocm'" in result.stderr
    assert "ascend, cpu, cuda, musa" in result.stderr


@pytest.fixture
def script_copy(tmp_path):
    """The script with its own stacks/ folder, so a test can add broken stack files."""
    (tmp_path / "docker").mkdir()
    shutil.copy(SCRIPT, tmp_path / "docker" / "install_stack.py")
    shutil.copytree(ROOT / "docker" / "stacks", tmp_path / "docker" / "stacks")
    shutil.copytree(ROOT / "requirements", tmp_path / "requirements")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    return tmp_path


@pytest.mark.parametrize("body, message", [
    ("[stack]\npython = 3.11\n[python]\nno_deps = sglang==0.5.11\nnodeps = x\n",
     "unknown key(s) ['nodeps'] in [python]"),
    ("[stack]\npython = 3.11\n[extras]\n", "unknown section [extras]"),
    ("[stack]\npython = 3.11\n[python]\nno_deps = sglang\n", "'sglang' is not pinned"),
    ("[stack]\npython = 3.11\n[python]\nno_deps = a==1\nrequirements = nope.txt\n",
     "requirements names nope.txt, which does not exist"),
    ("[stack]\npython = 3.11\n[python]\nno_deps = a==1\n[flagcx]\nrepo = r\ntag = main\nmake = USE_X=1\n",
     "release tag like v0.13.0"),
    ("[stack]\npython = 3.11\n[python]\nno_deps = a==1\n[flagcx]\nrepo = r\ntag = v1.0.0\nmake = CCL_HOME=/x\n",
     "must set the vendor flag"),
    ("[stack]\n[python]\nno_deps = a==1\n", "[stack] python is required"),
])
def test_broken_stack_files_fail_with_the_key(script_copy, body, message):
    (script_copy / "docker" / "stacks" / "broken.ini").write_text(body)
    result = run([sys.executable, str(script_copy / "docker" / "install_stack.py"),
                  "--platform", "broken", "--dry-run"])
    assert result.returncode == 2
    assert message in result.stderr, result.stderr


def test_wrong_python_version_is_refused_before_installing(script_copy):
    (script_copy / "docker" / "stacks" / "old.ini").write_text(
        "[stack]\npython = 3.9\n[python]\nno_deps = a==1\n")
    result = run([sys.executable, str(script_copy / "docker" / "install_stack.py"),
                  "--platform", "old"])
    assert result.returncode == 2
    assert "the old stack supports 3.9" in result.stderr
    assert "pip install" not in result.stdout.split("==> python")[-1]


def test_missing_vendor_torch_is_an_error(script_copy, tmp_path):
    """A stack that expects the base image to provide a package refuses a bare interpreter."""
    (script_copy / "docker" / "stacks" / "bare.ini").write_text(
        f"[stack]\npython = {sys.version_info[0]}.{sys.version_info[1]}\n[vendor]\n"
        "provided = torch-does-not-exist\n[python]\nno_deps = a==1\n")
    result = run([sys.executable, str(script_copy / "docker" / "install_stack.py"),
                  "--platform", "bare", "--project", str(script_copy)])
    assert result.returncode == 2
    assert "expects the vendor base to provide torch-does-not-exist" in result.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_cpu_install_in_a_fresh_venv_then_serve(tmp_path):
    """The image recipe for real: fresh venv, install_stack --platform cpu, then the installed
    copy (not this checkout) launches a server on the tiny model and answers /generate.
    .ci/run leaves it to `nox -s image-cpu` when that runs too: the image build is this recipe
    (install_stack.py into the image's fresh venv, the smoke suite from the installed copy)."""
    if os.environ.get("SGLANG_FL_TEST_IMAGE_CPU_RUNS") == "1":
        pytest.skip("nox -s image-cpu runs this recipe in this CI run (SGLANG_FL_TEST_IMAGE_CPU_RUNS=1)")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    # where this host's own wheel folder has the CPU torch, PyTorch's index is not asked
    local = ["--vendor-index-url", ""] if host_engine.vendor_wheels_are_local("cpu") else []
    result = run([sys.executable, str(SCRIPT), "--platform", "cpu", "--python", python, *local],
                 timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "ok: torch 2.13.0" in result.stdout
    assert "install_stack: cpu stack installed" in result.stdout

    work = tmp_path / "smoke"
    work.mkdir()
    probe = run([python, "-c", "import sglang_fl; print(sglang_fl.__file__)"], cwd=work)
    assert str(env_dir) in probe.stdout, "the fresh venv must use its installed sglang_fl"
    served = run([python, "-m", "sglang_fl.smoke", "--layers", "all", "--workdir", str(work)],
                 cwd=work, timeout=900)
    assert served.returncode == 0, (served.stdout + served.stderr)[-4000:]
    assert "PASSED" in served.stdout and "/generate returned 8 tokens" in served.stdout
