"""benchmarks/gpu_session.sh's ``pack`` waits (up to ``PACK_WAIT`` s) for an e2e_bench that a
timeout around the whole device call signalled, so the JSON it writes while stopping goes into
results.tgz; it never waits past ``PACK_WAIT``, or the call's own limit would lose everything.
A stand-in process named like e2e_bench plays the signalled run."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Sleeps argv[1] seconds, then writes argv[2]: an e2e_bench that writes its JSON on the way out.
LATE_WRITER = "import sys, time; time.sleep(float(sys.argv[1])); open(sys.argv[2], 'w').write('{}')"


def pack(out, wait):
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "pack"], cwd=ROOT,
                          env={**os.environ, "OUT": str(out), "PACK_WAIT": str(wait)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(out / "results.tgz") as tar:
        names = sorted(tar.getnames())
    return names, time.monotonic() - t0, proc.stdout


def late_writer(out, seconds):
    return subprocess.Popen([sys.executable, "-c", LATE_WRITER, str(seconds), str(out / "e2e.json"),
                             "benchmarks/e2e_bench.py"])


def test_pack_takes_the_json_a_stopping_e2e_bench_writes_after_it_started(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "e2e.log").write_text("# stopped: SIGTERM received\n")
    writer = late_writer(out, 2)
    try:
        names, _, text = pack(out, 60)
    finally:
        writer.kill()
    assert "e2e.json" in names and "e2e.log" in names, names
    assert "pack: waited" in text


def test_pack_waits_no_longer_than_pack_wait(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "e2e.log").write_text("x\n")
    writer = late_writer(out, 300)
    try:
        names, seconds, _ = pack(out, 1)
    finally:
        writer.kill()
    assert names == ["e2e.log"] and seconds < 60
