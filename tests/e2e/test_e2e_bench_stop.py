"""benchmarks/e2e_bench.py stopped by SIGTERM, as a GPU stage's ``timeout`` stops it: it stops
its server, writes what it measured (whole repeats, ``stopped`` saying where) and exits 1.

Why: on the H100 of 2026-12-06 a call's ``timeout`` ended e2e_bench in its second group, and
nothing was written, not even the greedy ids the first group had taken; that device time was
lost. Run here against a real CPU SGLang server in a child process, signalled as ``timeout``
signals it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_support import process_env

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line holds ``text`` (zombies excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def test_sigterm_mid_run_stops_the_server_and_writes_the_whole_repeats(tiny_model, tmp_path):
    out = tmp_path / "out" / "e2e.json"
    env = process_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *sys.path])
    bench = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "e2e_bench.py"), "--model", str(tiny_model),
         "--out", str(out), "--log-dir", str(tmp_path / "logs"), "--configs", "fl-defaults",
         "--repeats", "10000", "--new-tokens", "2", "--server-args", "--dtype float32"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    seen = []
    try:
        for line in bench.stdout:  # the server is up and has finished two whole repeats
            seen.append(line)
            if "repeat 2/10000 done" in line:
                break
        assert bench.poll() is None, "".join(seen[-40:])
        server_log = tmp_path / "logs" / "server-0.log"
        assert processes_naming(str(tiny_model)), "no server process while measuring"
        bench.send_signal(signal.SIGTERM)
        rest, _ = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
    seen.append(rest)
    assert bench.returncode == 1, "".join(seen[-40:])
    assert "# stopped: SIGTERM received in group 1 after" in rest, rest
    doc = json.loads(out.read_text())
    assert doc["stopped"].startswith("SIGTERM received in group 1 after ")
    reps = doc["results"]["fl-defaults"]["prefill_tok_s"]["reps"]
    assert len(reps) >= 2 and reps == list(range(len(reps)))  # whole repeats, none half-done
    assert doc["groups"][0]["reps"] == reps
    assert "no server answered" in doc["greedy"]["hf_error"]  # stopped before its greedy ids
    deadline = time.monotonic() + 30
    while processes_naming(str(tiny_model)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_naming(str(tiny_model)) == [], server_log.read_text()[-2000:]
