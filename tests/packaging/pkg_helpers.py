"""Packaging checks: the Dockerfiles, compose files, install script, entrypoint, CI files and
nox sessions, with the real tools (hadolint, shellcheck, check-jsonschema, docker-compose).

A tool that is not installed skips its test, except where the environment says the tool is
part of the run: ``SGLANG_FL_TEST_REQUIRE_TOOLS=1`` (set by ``nox -s tests``, which installs
hadolint/shellcheck/check-jsonschema/kubernetes-validate) and ``SGLANG_FL_TEST_REQUIRE_COMPOSE=1``
(set by .ci/run and ci/cpu-pipeline.sh, which install Compose v2 with docker/host_engine.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENDORS = ("cuda", "ascend", "musa")
#: Every image: the vendors' and the CPU image CI builds and runs.
PLATFORMS = ("cpu", *VENDORS)
MAKE_FLAG = {"cuda": "USE_NVIDIA=1", "ascend": "USE_ASCEND=1", "musa": "USE_MUSA=1"}


def tool(name: str, required_by: str = "SGLANG_FL_TEST_REQUIRE_TOOLS") -> str:
    """Path of an installed tool (venv bin first), or skip / fail as the environment says."""
    venv_bin = Path(sys.executable).parent / name
    path = str(venv_bin) if venv_bin.exists() else shutil.which(name)
    if path:
        return path
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{name} is required here ({required_by}=1) but not installed")
    pytest.skip(f"{name} is not installed (nox -s tests / lint install it)")


def compose_command() -> list[str]:
    """Compose v2 (`docker compose`), what every current Docker install has; v1 is not used."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version", "--short"], capture_output=True,
                               text=True)
        if probe.returncode == 0 and probe.stdout.strip().lstrip("v")[:1] >= "2":
            return ["docker", "compose"]
    if os.environ.get("SGLANG_FL_TEST_REQUIRE_COMPOSE") == "1":
        pytest.fail("Compose v2 is required here but `docker compose version` fails")
    pytest.skip("no Compose v2 here (`python3 docker/host_engine.py compose` installs it as root)")


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    kwargs.setdefault("timeout", 120)
    return subprocess.run(cmd, **kwargs)
