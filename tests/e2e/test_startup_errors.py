"""Start-up errors that name the fix: a plain ``python -m sglang.launch_server`` refuses a
missing model path and a bad ``SGLANG_FL_*`` value within seconds, in the words of the image
entrypoint's preflight (one function, `sglang_fl.preflight`, serves both), on every supported
SGLang version (listed in noxfile's SGLANG_0_5_23_TESTS)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_support import process_env

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh"

#: What SGLang itself said for a missing local path before the check (0.5.23 and 0.5.11).
SGLANG_OWN_ERROR = "Repo id must be in the form"


def launch_server(tmp_path, *args, **env) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sglang.launch_server", "--port", "1", *args],
                       env=process_env(tmp_path, **env), capture_output=True, text=True,
                       timeout=120)
    return r, time.monotonic() - start


def entrypoint(tmp_path, *args, **env) -> subprocess.CompletedProcess:
    env = process_env(tmp_path, SGLANG_FL_PYTHON=sys.executable,
                      SGLANG_FL_PORT_FILE=str(tmp_path / "port"), **env)
    return subprocess.run([str(ENTRYPOINT), "launch_server", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def message(output: str, prefix: str) -> str:
    """The one-line message after ``prefix`` (the last such line)."""
    found = re.findall(re.escape(prefix) + r"(.*)", output)
    assert found, output[-3000:]
    return found[-1].strip()


def test_a_missing_local_model_path_fails_in_seconds_naming_it_and_the_hub_setting(tmp_path):
    absent = tmp_path / "models" / "Qwen2.5-7B"
    absent.parent.mkdir()
    (absent.parent / "tiny").mkdir()
    r, seconds = launch_server(tmp_path, "--model-path", str(absent))
    assert r.returncode != 0 and seconds < 20, (r.returncode, seconds, r.stderr[-3000:])
    served = message(r.stderr, "PreflightError: ")
    assert served.startswith(f"model path {absent} does not exist; {absent.parent} holds: tiny. "
                             "A local path is never downloaded, whatever the hub-offline setting "
                             "(HF_HUB_OFFLINE unset, downloads on)"), served
    assert SGLANG_OWN_ERROR not in r.stderr
    # The image entrypoint stops before SGLang, with the same words (and status 2).
    e = entrypoint(tmp_path, "--model-path", str(absent))
    assert e.returncode == 2, e.stderr
    assert message(e.stderr, "sglang-fl preflight: error: ") == served

    r, seconds = launch_server(tmp_path, "--model-path", str(absent), HF_HUB_OFFLINE="1")
    assert r.returncode != 0 and seconds < 20, (r.returncode, seconds, r.stderr[-3000:])
    assert "(HF_HUB_OFFLINE=1, downloads off)" in message(r.stderr, "PreflightError: ")


def test_a_bad_sglang_fl_value_is_refused_in_the_preflight_words(tmp_path):
    r, seconds = launch_server(tmp_path, "--model-path", "dummy", SGLANG_FL_PLATFORM="nvidia")
    assert r.returncode != 0 and seconds < 20, (r.returncode, seconds, r.stderr[-3000:])
    served = message(r.stderr, "sglang-fl: ")
    assert served == ("invalid sglang-fl configuration: SGLANG_FL_PLATFORM='nvidia' is not "
                      "accepted; accepted values: cuda, ascend, musa, cpu"), served
    e = entrypoint(tmp_path, "--model-path", "dummy", SGLANG_FL_PLATFORM="nvidia")
    assert e.returncode == 2
    assert message(e.stderr, "sglang-fl preflight: error: ") == served
