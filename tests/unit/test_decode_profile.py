"""benchmarks/decode_profile.py's readers, on a synthetic trace and py-spy output (the GPU run
itself needs the H200: benchmarks/gpu_session.sh profile)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import decode_profile  # noqa: E402


def test_trace_steps_takes_the_union_of_kernel_time_per_graph_launch(tmp_path):
    events = [{"ph": "X", "name": "cudaGraphLaunch", "ts": t, "dur": 5} for t in (0, 100)]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "ts": s, "dur": d}
               for s, d in ((10, 30), (20, 30), (110, 40), (150, 10))]  # overlap, then a gap
    with gzip.open(tmp_path / "x.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    got = decode_profile.trace_steps(tmp_path)
    assert got["graph_launches"] == 2
    assert got["wall_us_per_step"] == (160 - 10) / 2
    assert got["gpu_busy_us_per_step"] == (40 + 50) / 2
    assert got["host_wait_us_per_step"] == (150 - 90) / 2


def test_trace_steps_says_when_there_is_nothing(tmp_path):
    assert "error" in decode_profile.trace_steps(tmp_path)


def test_pyspy_summary_counts_each_function_once_per_sample(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("main (a.py:1);loop (a.py:2);replay (g.py:3) 6\n"
                   "main (a.py:1);loop (a.py:2);process (s.py:4);loop (a.py:2) 4\n")
    got = decode_profile.pyspy_summary(raw)
    assert got["samples"] == 10
    assert dict(got["inclusive_pct"]) == {"main": 100.0, "loop": 100.0, "replay": 60.0,
                                          "process": 40.0}
    assert dict(got["leaf_pct"]) == {"replay": 60.0, "loop": 40.0}
