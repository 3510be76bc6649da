"""The four Dockerfiles (three vendors and the CPU image CI builds): hadolint clean, and the
product's own rules (base image a build argument pinned by tag, the shared build steps of
docker/build_steps.sh with the install script in two cached phases, platform YAML from ARG PLATFORM, FlagCX path, entrypoint, HEALTHCHECK, OCI labels,
non-root where possible, proxy/mirror build options, no BuildKit-only syntax, no secrets)
checked on the parsed instructions. `nox -s image-cpu` builds and runs the CPU one for real."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex

import pytest
from pkg_helpers import PLATFORMS, ROOT, run, tool

SECRET_NAME = re.compile(r"(TOKEN|PASSWORD|PASSWD|SECRET|API_?KEY|CREDENTIAL|ACCESS_KEY)", re.I)


def instructions(vendor: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs: comments dropped, continuation lines joined."""
    out, buf = [], ""
    for line in (ROOT / "docker" / vendor / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        full = (buf + stripped).strip()
        buf = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not buf, "Dockerfile ends inside a continuation"
    return out


def args_of(ins, name):
    return [rest for word, rest in ins if word == name]


def arg_defaults(ins) -> dict[str, str]:
    defaults = {}
    for rest in args_of(ins, "ARG"):
        key, sep, value = rest.partition("=")
        if sep:  # a later bare `ARG NAME` (re-declared in the stage) keeps the default
            defaults[key] = value.strip('"')
    return defaults


def env_values(ins) -> dict[str, str]:
    """ENV KEY=VALUE pairs (the form every Dockerfile here uses)."""
    values = {}
    for rest in args_of(ins, "ENV"):
        for item in shlex.split(rest):
            key, sep, value = item.partition("=")
            assert sep, f"ENV {rest!r}: use KEY=VALUE"
            values[key] = value
    return values


def test_hadolint_clean():
    files = [ROOT / "docker" / v / "Dockerfile" for v in PLATFORMS]
    files.append(ROOT / "docker" / "cuda" / "substitute-base.Dockerfile")
    result = run([tool("hadolint"), *map(str, files)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_base_image_pinned_by_tag(vendor):
    ins = instructions(vendor)
    assert ins[0][0] == "ARG" and ins[0][1].startswith("BASE_IMAGE="), "BASE_IMAGE ARG comes first"
    assert args_of(ins, "FROM") == ["${BASE_IMAGE}"], "one stage, FROM the pinned base"
    base = arg_defaults(ins)["BASE_IMAGE"]
    name, _, tag = base.rpartition(":")
    assert name and tag and "/" not in tag, f"{base}: no tag"
    assert tag != "latest" and not tag.startswith("latest"), f"{base}: floating tag"
    expected = {"cuda": "pytorch/pytorch:2.11.0-cuda13.0", "ascend": "quay.io/ascend/cann:8.5.0",
                "musa": "registry.mthreads.com/mcconline/musa-pytorch-release-public:rc5.1.0",
                "cpu": "debian:12."}
    assert base.startswith(expected[vendor])


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_installs_through_the_shared_steps_in_two_cached_phases(vendor):
    ins = instructions(vendor)
    runs = args_of(ins, "RUN")
    steps = " ".join(runs)
    for step in ("system", "deps", "plugin"):
        assert steps.count(f"docker/build_steps.sh {step}") == 1, f"{vendor}: one {step} step"
    deps = [r for r in runs if "docker/build_steps.sh deps" in r]
    plugin = [r for r in runs if "docker/build_steps.sh plugin" in r]
    # the deps phase sees only the stack files; the whole tree is copied after it
    copies = [(i, rest) for i, (w, rest) in enumerate(ins) if w == "COPY"]
    (tree,) = [i for i, rest in copies if rest == ". ."]
    assert ins.index(("RUN", deps[0])) < tree < ins.index(("RUN", plugin[0]))
    before = {rest for i, rest in copies if i < tree}
    assert before == {"docker/ docker/", "pyproject.toml ./", "requirements/ requirements/"}
    # nothing installs Python packages behind the shared steps' back
    assert re.search(r"pip[3]? install|install_stack", steps) is None
    assert (ROOT / "docker" / "stacks" / f"{vendor}.ini").is_file()
    env = env_values(ins)
    assert {"SGLANG_FL_PLATFORM", "SGLANG_FL_PYTHON"} <= set(env), "what the shared steps read"
    assert ins.index(("ENV", next(r for w, r in ins if w == "ENV"))) < ins.index(("RUN", deps[0]))


def build_steps(tmp_path, *args, **env):
    """docker/build_steps.sh as the image runs it, with a python that records its argv and
    PIP_CERT instead of installing anything."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "PIP_CERT=$PIP_CERT" > "$ARGV_OUT"\n'
                    'printf \'%s\\n\' "$@" >> "$ARGV_OUT"\n')
    fake.chmod(0o755)
    # The in-process integration fixture pins SGLANG_FL_* in this pytest process: none leaks in.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")
             and k not in ("FLAGCX_PATH", "FLAGCX_REPO", "VENDOR_INDEX_URL", "SGLANG_VERSION")}
    result = run([str(ROOT / "docker" / "build_steps.sh"), *args], cwd=ROOT,
                 env={**clean, "SGLANG_FL_PYTHON": str(fake), "ARGV_OUT": str(tmp_path / "argv"),
                      **env})
    argv = (tmp_path / "argv").read_text().splitlines() if (tmp_path / "argv").exists() else []
    return result, argv


def test_the_shared_deps_step_runs_the_install_script_with_the_images_settings(tmp_path):
    r, argv = build_steps(tmp_path, "deps", SGLANG_FL_PLATFORM="cuda", FLAGCX_PATH="/opt/flagcx",
                          FLAGCX_REPO="https://mirror/flagcx.git", VENDOR_INDEX_URL="")
    assert r.returncode == 0, r.stderr
    # pip trusts the system store, where docker/ca-certificates/*.crt were added
    assert argv[0] == "PIP_CERT=/etc/ssl/certs/ca-certificates.crt"
    assert argv[1:] == ["docker/install_stack.py", "--platform", "cuda", "--python",
                        str(tmp_path / "python"), "--phase", "deps", "--sglang=",
                        "--pip-arg=--no-cache-dir", "--flagcx-dir", "/opt/flagcx",
                        "--flagcx-repo=https://mirror/flagcx.git", "--vendor-index-url="]
    # CPU: no FlagCX (no FLAGCX_PATH), the stack's vendor index (VENDOR_INDEX_URL unset), and
    # the image's SGLANG_VERSION
    r, argv = build_steps(tmp_path, "deps", SGLANG_FL_PLATFORM="cpu", SGLANG_VERSION="0.5.23")
    assert r.returncode == 0, r.stderr
    assert argv[1:] == ["docker/install_stack.py", "--platform", "cpu", "--python",
                        str(tmp_path / "python"), "--phase", "deps", "--sglang=0.5.23",
                        "--pip-arg=--no-cache-dir"]


def test_the_shared_steps_refuse_what_they_cannot_do(tmp_path):
    r, _ = build_steps(tmp_path, "dep", SGLANG_FL_PLATFORM="cpu")
    assert r.returncode == 2
    assert "unknown step 'dep'; accepted: system [PACKAGE...], deps, plugin" in r.stderr
    r, _ = build_steps(tmp_path, "deps")
    assert r.returncode == 2 and "SGLANG_FL_PLATFORM is not set" in r.stderr
    r, _ = build_steps(tmp_path, "deps", SGLANG_FL_PLATFORM="cpu", SGLANG_FL_PYTHON="/no/python")
    assert r.returncode == 2 and "SGLANG_FL_PYTHON=/no/python: no such interpreter" in r.stderr


def test_the_shared_steps_trust_the_ca_folder_install_the_entrypoint_and_check_the_yaml():
    """(system and plugin write to the image's system folders: read, not run, here.)"""
    text = (ROOT / "docker" / "build_steps.sh").read_text()
    system = text[text.index("system() {"):text.index("install_stack() {")]
    assert "docker/ca-certificates -maxdepth 1 -name '*.crt'" in system
    assert "/usr/local/share/ca-certificates/sglang-fl/" in system
    assert "update-ca-certificates" in system and "rm -rf /var/lib/apt/lists/*" in system
    assert "git make g++ nlohmann-json3-dev" in system  # FlagCX's build, where FLAGCX_PATH
    plugin = text[text.index("    plugin)"):]
    assert "install -m 0755 docker/entrypoint.sh /usr/local/bin/sglang-fl-entrypoint" in plugin
    assert "sglang-fl config" in plugin  # the platform YAML, by the real Settings loader
    assert (ROOT / "docker" / "build_steps.sh").stat().st_mode & 0o111


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_proxy_and_mirror_build_options(vendor):
    ins = instructions(vendor)
    declared = {rest.split("=")[0] for rest in args_of(ins, "ARG")}
    assert {"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST",
            "VENDOR_INDEX_URL"} <= declared
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "VENDOR_INDEX_URL"):
        assert name not in arg_defaults(ins), f"{name} has no default: unset unless given"
        assert name not in env_values(ins), f"{name} must not stay in the image's environment"
    # docker/ca-certificates/ arrives with `COPY docker/ docker/`, before the first step
    assert args_of(ins, "COPY")[0] == "docker/ docker/"
    assert "docker/build_steps.sh system" in args_of(ins, "RUN")[0]
    assert (ROOT / "docker" / "ca-certificates" / "README.md").is_file()
    text = (ROOT / "docker" / vendor / "Dockerfile").read_text()
    # a `# syntax=` line makes BuildKit fetch a frontend from Docker Hub (air-gapped: fails)
    assert "# syntax=" not in text and "--mount=" not in text


def test_labels_come_last_so_versions_keep_the_install_cache():
    for vendor in PLATFORMS:
        ins = instructions(vendor)
        words = [w for w, _ in ins]
        assert words.index("LABEL") > max(i for i, w in enumerate(words) if w == "RUN")


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_platform_yaml_flagcx_and_entrypoint(vendor):
    ins = instructions(vendor)
    assert arg_defaults(ins)["PLATFORM"] == vendor
    assert (ROOT / "sglang_fl" / "config" / f"{vendor}.yaml").is_file()
    env = env_values(ins)
    assert env["SGLANG_FL_PLATFORM"] == "${PLATFORM}"
    assert env.get("FLAGCX_PATH") == (None if vendor == "cpu" else "/opt/flagcx")
    # installed and the platform YAML validated by the shared plugin step (its test above)
    assert "docker/build_steps.sh plugin" in " ".join(args_of(ins, "RUN"))
    assert args_of(ins, "ENTRYPOINT") == ['["sglang-fl-entrypoint"]']
    (health,) = args_of(ins, "HEALTHCHECK")
    assert health.endswith('CMD ["sglang-fl-entrypoint", "healthcheck"]')
    assert "--start-period=" in health
    assert args_of(ins, "EXPOSE") == ["30000"]


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_oci_labels(vendor):
    labels = " ".join(args_of(instructions(vendor), "LABEL"))
    for key in ("title", "description", "version", "revision", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels
    # BASE_IMAGE is declared before FROM: the stage must declare it again to use it
    ins = instructions(vendor)
    stage = ins[[w for w, _ in ins].index("FROM"):]
    assert "BASE_IMAGE" in [rest.split("=")[0] for w, rest in stage if w == "ARG"]


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_no_secrets(vendor):
    ins = instructions(vendor)
    names = list(arg_defaults(ins)) + list(env_values(ins))
    assert not [n for n in names if SECRET_NAME.search(n)]
    text = (ROOT / "docker" / vendor / "Dockerfile").read_text()
    assert not re.search(r"(login|--password|Authorization:)", text)


def test_user_is_non_root_on_cuda_and_cpu_and_explained_elsewhere():
    for vendor in ("cuda", "cpu"):
        users = args_of(instructions(vendor), "USER")
        assert users and users[-1].split(":")[0] not in ("0", "root")
    for vendor in ("ascend", "musa"):
        assert not args_of(instructions(vendor), "USER")
        text = (ROOT / "docker" / vendor / "Dockerfile").read_text()
        assert "# Stays root:" in text, f"{vendor}: say why the image runs as root"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore semantics for the plain patterns used here (no '!' rules)."""
    for pat in patterns:
        pat = pat.rstrip("/")
        if pat.startswith("**/"):
            if any(fnmatch.fnmatch(part, pat[3:]) for part in path.split("/")):
                return True
        elif fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
            return True
    return False


def test_dockerignore_keeps_what_the_build_needs_and_drops_the_rest():
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")]
    needed = ["pyproject.toml", "README.md", "docker/install_stack.py", "docker/entrypoint.sh",
              "docker/build_steps.sh",
              "docker/stacks/cuda.ini", "docker/stacks/common.txt", "sglang_fl/__init__.py",
              "sglang_fl/config/cuda.yaml", "sglang_fl/models/tiny.py",
              "sglang_fl/smoke/checks.py", "requirements/sglang-0.5.11-cpu.txt",
              "docker/ca-certificates/README.md", "docker/stacks/cpu.ini"]
    assert [p for p in needed if _ignored(p, patterns)] == []
    dropped = [".git/config", ".venv/bin/python", ".env", ".env.local", "certs/server.key",
               "sglang_fl/__pycache__/x.pyc", ".nox/tests/bin/python", "tests/unit/test_x.py",
               "compose.yaml", "compose.cpu.yaml", "deploy/kubernetes/render.py",
               "docker/host_engine.py", "docker/image_tests.py", "docker/cuda/Dockerfile",
               "docker/cuda/substitute-base.Dockerfile"]
    assert [p for p in dropped if not _ignored(p, patterns)] == []
