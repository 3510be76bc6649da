"""The offline Engine path and the ``sglang-fl demo`` command, each in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_support import (
    EXPECTED_DISPATCH,
    MAX_NEW_TOKENS,
    dispatch_lines,
    hermetic_env,
    process_env,
    standin_calls_in,
)

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent



def test_offline_engine_with_the_plugin(tiny_model, prompt_ids, hf_ids, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(HERE / "engine_probe.py"), str(tiny_model), str(MAX_NEW_TOKENS),
         json.dumps(prompt_ids)],
        env=process_env(tmp_path), capture_output=True, text=True, timeout=400)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    result = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    assert json.loads(result[len("RESULT "):]) == hf_ids
    assert dispatch_lines(tmp_path) == sorted(EXPECTED_DISPATCH.values())
    assert standin_calls_in(output) == []


def test_demo_command_end_to_end(tiny_model, tmp_path):
    script = Path(sys.executable).with_name("sglang-fl")  # the installed console script
    command = [str(script)] if script.exists() else [sys.executable, "-m", "sglang_fl.cli"]
    proc = subprocess.run(
        [*command, "demo", "--model-dir", str(tiny_model),
         "--max-tokens", "8", "--log", str(tmp_path / "demo-server.log")],
        env=process_env(tmp_path), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = proc.stdout
    assert "assistant: " in out
    for cls in EXPECTED_DISPATCH:
        assert f"{cls:<16} -> reference(reference)" in out
    assert "tok/s" in out and "server stopped" in out
    assert standin_calls_in((tmp_path / "demo-server.log").read_text()) == []


def test_demo_ctrl_c_while_starting_stops_the_whole_server(tiny_model, tmp_path):
    import signal
    import time

    import psutil

    script = Path(sys.executable).with_name("sglang-fl")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "sglang_fl.cli"]
    proc = subprocess.Popen([*command, "demo", "--model-dir", str(tiny_model)], env=process_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        descendants: dict[int, psutil.Process] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(descendants) < 2:  # launch_server + a child
            for child in psutil.Process(proc.pid).children(recursive=True):
                descendants.setdefault(child.pid, child)
            time.sleep(0.5)
        assert descendants, "the demo never started a server"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted; server stopped" in out
    _, alive = psutil.wait_procs(list(descendants.values()), timeout=15)
    assert alive == [], [p.pid for p in alive]


def test_launcher_reports_a_server_that_cannot_start(tmp_path):
    import pytest

    from sglang_fl.serving import ServerStartError, launched_server

    with pytest.raises(ServerStartError, match="exited with code") as err:
        with launched_server(tmp_path / "no-such-model", env=hermetic_env(tmp_path), timeout=120):
            pass
    assert "no-such-model" in str(err.value)  # the log tail says what went wrong
