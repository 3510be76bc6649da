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


def pack_while_writing(tmp_path, write_after, wait):
    """``pack`` with PACK_WAIT ``wait`` while a stand-in e2e_bench writes e2e.json after
    ``write_after`` s: (names in results.tgz, seconds pack took, its output)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "e2e.log").write_text("# stopped: SIGTERM received\n")
    writer = subprocess.Popen([sys.executable, "-c", LATE_WRITER, str(write_after),
                               str(out / "e2e.json"), "benchmarks/e2e_bench.py"])
    t0 = time.monotonic()
    try:
        proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "pack"], cwd=ROOT,
                              env={**os.environ, "OUT": str(out), "PACK_WAIT": str(wait)},
                              capture_output=True, text=True, timeout=120)
    finally:
        writer.kill()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(out / "results.tgz") as tar:
        names = sorted(tar.getnames())
    return names, time.monotonic() - t0, proc.stdout


def test_pack_takes_the_json_a_stopping_e2e_bench_writes_after_it_started(tmp_path):
    names, _, text = pack_while_writing(tmp_path, 2, 60)
    assert "e2e.json" in names and "e2e.log" in names, names
    assert "pack: waited" in text


def test_pack_waits_no_longer_than_pack_wait(tmp_path):
    names, seconds, _ = pack_while_writing(tmp_path, 300, 1)
    assert names == ["e2e.log"] and seconds < 60
