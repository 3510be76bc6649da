"""The three vendor Dockerfiles: hadolint clean, and the product's own rules (pinned base,
shared install script, platform YAML from ARG PLATFORM, FlagCX path, entrypoint, HEALTHCHECK,
OCI labels, non-root where possible, no secrets) checked on the parsed instructions."""

from __future__ import annotations

import fnmatch
import re
import shlex

import pytest
from pkg_helpers import ROOT, VENDORS, run, tool

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
        key, _, value = rest.partition("=")
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
    result = run([tool("hadolint"), *(str(ROOT / "docker" / v / "Dockerfile") for v in VENDORS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("vendor", VENDORS)
def test_base_image_pinned_by_tag(vendor):
    ins = instructions(vendor)
    assert ins[0][0] == "ARG" and ins[0][1].startswith("BASE_IMAGE="), "BASE_IMAGE ARG comes first"
    assert args_of(ins, "FROM") == ["${BASE_IMAGE}"], "one stage, FROM the pinned base"
    base = arg_defaults(ins)["BASE_IMAGE"]
    name, _, tag = base.rpartition(":")
    assert name and tag and "/" not in tag, f"{base}: no tag"
    assert tag != "latest" and not tag.startswith("latest"), f"{base}: floating tag"
    expected = {"cuda": "pytorch/pytorch:2.11.0-cuda13.0", "ascend": "quay.io/ascend/cann:8.5.0",
                "musa": "registry.mthreads.com/mcconline/musa-pytorch-release-public:rc5.1.0"}
    assert base.startswith(expected[vendor])


@pytest.mark.parametrize("vendor", VENDORS)
def test_installs_through_the_shared_script(vendor):
    ins = instructions(vendor)
    runs = " ".join(args_of(ins, "RUN"))
    assert f"docker/install_stack.py --platform {vendor} " in runs
    assert "--flagcx-dir /opt/flagcx" in runs
    assert "--skip-flagcx" not in runs
    # nothing else installs Python packages behind the script's back
    assert re.search(r"pip[3]? install", runs) is None
    assert (ROOT / "docker" / "stacks" / f"{vendor}.ini").is_file()


@pytest.mark.parametrize("vendor", VENDORS)
def test_platform_yaml_flagcx_and_entrypoint(vendor):
    ins = instructions(vendor)
    assert arg_defaults(ins)["PLATFORM"] == vendor
    assert (ROOT / "sglang_fl" / "config" / f"{vendor}.yaml").is_file()
    env = env_values(ins)
    assert env["SGLANG_FL_PLATFORM"] == "${PLATFORM}"
    assert env["FLAGCX_PATH"] == "/opt/flagcx"
    # the platform YAML is validated at build time with the real Settings loader
    assert 'SGLANG_FL_PLATFORM="${PLATFORM}" sglang-fl config' in " ".join(args_of(ins, "RUN"))
    assert args_of(ins, "ENTRYPOINT") == ['["sglang-fl-entrypoint"]']
    assert "install -m 0755 docker/entrypoint.sh /usr/local/bin/sglang-fl-entrypoint" in " ".join(
        args_of(ins, "RUN"))
    (health,) = args_of(ins, "HEALTHCHECK")
    assert health.endswith('CMD ["sglang-fl-entrypoint", "healthcheck"]')
    assert "--start-period=" in health
    assert args_of(ins, "EXPOSE") == ["30000"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_oci_labels(vendor):
    labels = " ".join(args_of(instructions(vendor), "LABEL"))
    for key in ("title", "description", "version", "revision", "licenses", "base.name"):
        assert f"org.opencontainers.image.{key}=" in labels


@pytest.mark.parametrize("vendor", VENDORS)
def test_no_secrets(vendor):
    ins = instructions(vendor)
    names = list(arg_defaults(ins)) + list(env_values(ins))
    assert not [n for n in names if SECRET_NAME.search(n)]
    text = (ROOT / "docker" / vendor / "Dockerfile").read_text()
    assert not re.search(r"(login|--password|Authorization:)", text)


def test_user_is_non_root_on_cuda_and_explained_elsewhere():
    users = args_of(instructions("cuda"), "USER")
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
              "docker/stacks/cuda.ini", "docker/stacks/common.txt", "sglang_fl/__init__.py",
              "sglang_fl/config/cuda.yaml", "sglang_fl/models/tiny.py",
              "sglang_fl/smoke/checks.py", "requirements/sglang-0.5.11-cpu.txt"]
    assert [p for p in needed if _ignored(p, patterns)] == []
    dropped = [".git/config", ".venv/bin/python", ".env", ".env.local", "certs/server.key",
               "sglang_fl/__pycache__/x.pyc", ".nox/tests/bin/python", "tests/unit/test_x.py"]
    assert [p for p in dropped if not _ignored(p, patterns)] == []
