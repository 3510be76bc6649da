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


# The demo as a terminal starts it: SIGINT at Python's default, whatever this test inherited (a
# CI job started in the background of a non-interactive shell inherits SIGINT ignored, and so
# would the demo, which then rightly ignores it). ``sys.argv[1]`` is the point of the test:
# with "torch-import" the demo sends itself SIGINT at its first import of numpy, which torch's C
# initialisation runs and whose errors, a KeyboardInterrupt included, it clears.
DEMO_AS_FROM_A_TERMINAL = """
import linecache, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

class SigintAtNumpyImport:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            f = sys._getframe(1)
            while f.f_code.co_filename.startswith("<frozen"):
                f = f.f_back
            line = linecache.getline(f.f_code.co_filename, f.f_lineno).strip()
            print(f"test: SIGINT at the numpy import of: {line}", flush=True)
            os.kill(os.getpid(), signal.SIGINT)

if sys.argv.pop(1) == "torch-import":
    sys.meta_path.insert(0, SigintAtNumpyImport())
from sglang_fl.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("point", ["torch-import", "launch", "workers"])
def test_demo_ctrl_c_while_starting_stops_the_whole_server(point, tiny_model, tmp_path):
    """A Ctrl-C at any point of start-up stops the demo with status 130 and leaves no process.

    torch-import: inside ``import torch`` (platform detection, before the launch), where torch
    drops the KeyboardInterrupt; the demo used to serve on and exit 0. launch: as the demo
    prints its launch line, about when it spawns the server. workers: once launch_server has
    started processes of its own (the scheduler and detokenizer, importing)."""
    import signal
    import threading
    import time
    import uuid

    import psutil

    run = uuid.uuid4().hex  # in the environment of every process the demo starts
    proc = subprocess.Popen([sys.executable, "-u", "-c", DEMO_AS_FROM_A_TERMINAL, point, "demo",
                             "--model-dir", str(tiny_model)],
                            env=process_env(tmp_path, CTRL_C_TEST_RUN=run),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def reached() -> bool:
        if point == "launch":
            return any(line.startswith("launching:") for line in lines)
        try:  # workers: launch_server's children
            return any(len(server.children()) >= 2 for server in psutil.Process(proc.pid).children())
        except psutil.Error:
            return False

    try:
        if point != "torch-import":
            deadline = time.monotonic() + 240
            while proc.poll() is None and not reached():
                assert time.monotonic() < deadline, f"start-up never reached {point!r}:\n{''.join(lines)}"
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
        reader.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    if point == "torch-import":
        assert "test: SIGINT at the numpy import of: from torch._C import" in out, (
            "the SIGINT no longer lands in torch._C's initialisation; point the hook at the "
            f"import that now drops interrupts, or drop this point:\n{out[-3000:]}")
    assert proc.returncode == 130, out[-3000:]
    assert "sglang-fl demo: interrupted" in out, out[-3000:]

    def left() -> list[int]:
        pids = []
        for p in psutil.process_iter():
            try:
                if p.environ().get("CTRL_C_TEST_RUN") == run:
                    pids.append(p.pid)
            except psutil.Error:  # gone, or a zombie
                continue
        return pids

    deadline = time.monotonic() + 30  # the demo waited for the server's group; any straggler
    while (alive := left()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert alive == [], f"processes the demo started are left: {alive}"


def test_launcher_reports_a_server_that_cannot_start(tmp_path):
    import pytest

    from sglang_fl.serving import ServerStartError, launched_server

    with pytest.raises(ServerStartError, match="exited with code") as err:
        with launched_server(tmp_path / "no-such-model", env=hermetic_env(tmp_path), timeout=120):
            pass
    assert "no-such-model" in str(err.value)  # the log tail says what went wrong
