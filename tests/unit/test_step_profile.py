"""benchmarks/step_profile.py's readers and arguments, on a synthetic trace and py-spy output (the
GPU runs need the H200: benchmarks/gpu_session.sh profile, prefillprofile)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import step_profile  # noqa: E402


def test_trace_steps_takes_the_union_of_kernel_time_per_graph_launch(tmp_path):
    events = [{"ph": "X", "name": "cudaGraphLaunch", "ts": t, "dur": 5} for t in (0, 100)]
    events += [{"ph": "X", "cat": "kernel", "name": "k", "ts": s, "dur": d}
               for s, d in ((10, 30), (20, 30), (110, 40), (150, 10))]  # overlap, then a gap
    with gzip.open(tmp_path / "x.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    got = step_profile.trace_steps(tmp_path)
    assert got["graph_launches"] == 2
    assert got["wall_us_per_step"] == (160 - 10) / 2
    assert got["gpu_busy_us_per_step"] == (40 + 50) / 2
    assert got["host_wait_us_per_step"] == (150 - 90) / 2


def test_trace_steps_says_when_there_is_nothing(tmp_path):
    assert "error" in step_profile.trace_steps(tmp_path)


def test_pyspy_summary_counts_each_function_once_per_sample(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text("main (a.py:1);loop (a.py:2);replay (g.py:3) 6\n"
                   "main (a.py:1);loop (a.py:2);process (s.py:4);loop (a.py:2) 4\n")
    got = step_profile.pyspy_summary(raw)
    assert got["samples"] == 10
    assert dict(got["inclusive_pct"]) == {"main": 100.0, "loop": 100.0, "replay": 60.0,
                                          "process": 40.0}
    assert dict(got["leaf_pct"]) == {"replay": 60.0, "loop": 40.0}


def test_parse_shapes_reads_batch_by_tokens_and_refuses_the_rest():
    assert step_profile.parse_shapes("1x512, 8X2048") == [(1, 512), (8, 2048)]
    for bad in ("512", "0x512", "1x", "ax2", "1x512x2"):
        with pytest.raises(ValueError, match="BATCHxTOKENS"):
            step_profile.parse_shapes(bad)


def test_arguments_are_checked_before_any_server_starts(capsys):
    args = step_profile.parse_args(["--phase", "prefill", "--model", "m", "--out", "o"])
    assert args.configs == "native-L1off,flagos-L1off" and args.shapes[-1] == (8, 2048)
    decode = step_profile.parse_args(["--model", "m", "--out", "o"])
    assert decode.phase == "decode" and decode.configs == "fl-defaults,flagos-L1off"
    for bad in (["--shapes", "8x"], ["--repeats", "0"], ["--batches", "1,x"], ["--phase", "both"]):
        with pytest.raises(SystemExit):
            step_profile.parse_args(["--model", "m", "--out", "o", *bad])
    assert "8x" in capsys.readouterr().err


def test_prefill_table_lists_cases_top_kernels_and_the_verdict(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": "rms_norm_kernel", "ts": t, "dur": 4,
               "args": {"correlation": t}} for t in (0, 60)]
    events += [{"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": t - 10,
                "dur": 5, "args": {"correlation": t}} for t in (0, 60)]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    case = {"untraced_ms": 1.0, "traced_ms": 1.2,
            "trace": step_profile.analyze_trace_dir(tmp_path)}
    cpu = {"untraced_ms": 1.0, "traced_ms": 1.1, "trace": {"error": "no GPU kernels in the trace"}}
    lines = step_profile.prefill_table({"results": {"native-L1off": {"1x512": cpu},
                                                    "flagos-L1off": {"1x512": case}}}, top=5)
    text = "\n".join(lines)
    assert "no GPU kernels in the trace" in text
    assert "rms_norm_kernel" in text and "flagos-L1off: GPU idle 88%" in text


def test_decode_speed_py_spy_and_trace_never_overlap(tmp_path, monkeypatch):
    """The speed is taken with no tool attached, py-spy samples a generation without the torch
    profiler, and the profiler runs last: the trace's export must not show in py-spy's shares
    nor slow the measured steps (seen on the H200, 2026-12-03: half the samples were gzip)."""
    events, state = [], {"profiling": False, "spying": False}

    def generate(server, ids, new_tokens, timeout=300.0):
        events.append(("generate", new_tokens, state["profiling"], state["spying"]))
        return 0.5, [[0] * new_tokens]

    class Server:
        process = type("P", (), {"pid": 1})()

        def post_json(self, path, body, timeout):
            state["profiling"] = path == "/start_profile"
            events.append((path,))

    spy = tmp_path / "py-spy"
    spy.write_text("#!/bin/sh\nwhile [ \"$1\" != -o ]; do shift; done\n"
                   "echo 'main (a.py:1);loop (a.py:2) 3' > \"$2\"\n")
    spy.chmod(0o755)
    real_run = step_profile.subprocess.run

    def run(cmd, **kw):
        state["spying"] = True
        try:
            return real_run(cmd, **kw)
        finally:
            state["spying"] = False

    monkeypatch.setattr(step_profile, "generate", generate)
    monkeypatch.setattr(step_profile, "scheduler_pid", lambda pid: 2)
    monkeypatch.setattr(step_profile.subprocess, "run", run)
    monkeypatch.setattr(step_profile.time, "sleep", lambda s: None)
    monkeypatch.setattr(step_profile, "trace_steps", lambda d: {"wall_us_per_step": 1.0})
    got = step_profile.profile_one(Server(), 32000, 1, 1, tmp_path, "x", str(spy))
    assert got["pyspy"]["samples"] == 3 and got["trace"] == {"wall_us_per_step": 1.0}
    timed = [e for e in events if e[0] == "generate" and e[1] == 4096]
    assert len(timed) == 3
    assert timed[0][2:] == (False, False), "the speed was measured with a tool attached"
    assert not any(e[0] == "generate" and e[2] and e[3] for e in events), "py-spy saw the profiler"
    assert events.index(("/start_profile",)) > events.index(timed[1])
