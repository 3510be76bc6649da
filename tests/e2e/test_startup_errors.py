"""Start-up errors that name the fix: a plain ``python -m sglang.launch_server`` refuses a
missing model path and a bad ``SGLANG_FL_*`` value within seconds, in the words of the image
entrypoint's preflight (one function, `sglang_fl.preflight`, serves both), on every supported
SGLang version (listed in noxfile's SGLANG_0_5_23_TESTS)."""

from __future__ import annotations

import re
import socket
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


def _listening() -> socket.socket:
    """A socket another process might hold: listening on 0.0.0.0, on a port where SGLang takes
    a ``--port`` (`free_port`: below the ephemeral range, so its gRPC port + 10000 fits)."""
    from sglang_fl.serving import free_port

    for _ in range(20):
        s = socket.socket()
        try:
            s.bind(("0.0.0.0", free_port("0.0.0.0")))
        except OSError:  # taken since free_port looked
            s.close()
            continue
        s.listen()
        return s
    raise RuntimeError("no port to hold")


def test_a_taken_http_port_stops_launch_server_before_it_loads_anything(tmp_path, tiny_model):
    """Without the check SGLang loads the model, fails uvicorn's bind and then waits in its
    warm-up for up to 12 minutes (compat fix:http_port_in_use)."""
    with _listening() as holder:
        port = holder.getsockname()[1]
        r, seconds = launch_server(tmp_path, "--model-path", str(tiny_model), "--host", "0.0.0.0",
                                   "--port", str(port))
        assert r.returncode != 0 and seconds < 30, (r.returncode, seconds, r.stderr[-3000:])
        served = message(r.stderr, "PreflightError: ")
        assert served == (f"--port {port} (--host 0.0.0.0) cannot be served: 0.0.0.0:{port}: "
                          "address already in use, by another process. Stop that process or "
                          "pass another --port"), served
        assert "Load weight" not in r.stderr
        # The image entrypoint's preflight says the same before SGLang starts (status 2).
        e = entrypoint(tmp_path, "--model-path", str(tiny_model), "--port", str(port))
        assert e.returncode == 2, e.stderr
        assert message(e.stderr, "sglang-fl preflight: error: ") == served


#: Runs SGLang's HTTP app under uvicorn as launch_server does, on a port taken after
#: launch_server's check (as while a model loads); first an app of someone else on that port.
LATE_BIND = """
import sys, uvicorn
from sglang.srt.entrypoints import http_server

port = int(sys.argv[1])

async def other_app(scope, receive, send):
    pass

try:
    uvicorn.Server(uvicorn.Config(other_app, host="127.0.0.1", port=port, lifespan="off")).run()
except SystemExit as exc:
    print(f"other app: exit {exc.code}", flush=True)
uvicorn.Server(uvicorn.Config(http_server.app, host="127.0.0.1", port=port)).run()
print("not reached", flush=True)
"""


def test_an_http_port_taken_while_the_model_loads_ends_the_server_with_one_error(tmp_path):
    """uvicorn's start-up of SGLang's app checks the port before SGLang's lifespan starts the
    warm-up thread that would poll the taken port for minutes: the process stops its children
    and exits 1 at once. Another app on the same port keeps uvicorn's own behaviour."""
    with _listening() as holder:
        port = holder.getsockname()[1]
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-c", LATE_BIND, str(port)],
                           env=process_env(tmp_path), capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert re.search(r"other app: exit [1-9]", r.stdout), out[-3000:]  # uvicorn's own status
    assert "not reached" not in r.stdout
    assert (f"cannot serve HTTP on --host 127.0.0.1 --port {port}: 127.0.0.1:{port}: address "
            "already in use, taken by another process while the model loaded") in r.stderr, \
        out[-3000:]
    assert "sglang-fl fix http_port_in_use" in r.stderr
    assert r.stderr.count("fix http_port_in_use") == 1  # the other app was left alone
    assert time.monotonic() - start < 120
