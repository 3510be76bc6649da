"""benchmarks/trace_analysis.py on synthetic Kineto traces with known gaps (the real traces
come from the H200: benchmarks/gpu_session.sh prefillprofile)."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import trace_analysis as ta  # noqa: E402


def events(*kernels, spans=()):
    """Kineto-shaped events: per kernel (name, launch_ts, start, dur, api), with the host call
    lasting 5 us and sharing the kernel's correlation id; api None leaves the kernel without."""
    out = [{"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}
           for name, ts, dur in spans]
    for corr, (name, launch, start, dur, api) in enumerate(kernels, 1):
        out.append({"ph": "X", "cat": "kernel", "name": name, "ts": start, "dur": dur,
                    "args": {"correlation": corr} if api else {}})
        if api:
            out.append({"ph": "X", "cat": "cuda_driver" if api.startswith("cu") and not
                        api.startswith("cuda") else "cuda_runtime", "name": api, "ts": launch,
                        "dur": 5, "args": {"correlation": corr}})
    out.append({"ph": "f", "cat": "ac2g", "id": 1, "ts": 0})  # flow events are ignored
    return out


def write(path: Path, evs, gz=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    with (gzip.open(path, "wt") if gz else open(path, "w")) as f:
        json.dump({"traceEvents": evs}, f)


# One launch-bound forward: a cheap Triton kernel after 50 us of host time each, then a
# GEMM queued while the GPU still ran; and a second forward 5 ms later.
LAUNCH_BOUND = [
    ("rms_norm_kernel", 0, 10, 4, "cuLaunchKernel"),       # gap 0 (first of the forward)
    ("rms_norm_kernel", 50, 60, 4, "cuLaunchKernel"),      # gap 46
    ("void gemm<128, 64>(float*)", 100, 110, 40, "cudaLaunchKernel"),  # gap 46
    ("rotary_kernel", 105, 150, 2, "cuLaunchKernelEx"),    # gap 0: queued behind the GEMM
    ("rotary_kernel", 5000, 5010, 2, "cuLaunchKernelEx"),  # forward 2 starts here
    ("silu_kernel", 5060, 5070, 10, "cuLaunchKernel"),     # gap 58
]


def test_gap_split_forwards_wall_busy_idle_and_per_kernel_charges(tmp_path):
    write(tmp_path / "a.trace.json.gz", events(*LAUNCH_BOUND), gz=True)
    got = ta.analyze_trace_dir(tmp_path, gap_us=1000)
    f1, f2 = got["forwards"]
    assert (f1["name"], f1["kernels"], f1["wall_us"], f1["busy_us"], f1["idle_us"]) == (
        "segment 1", 4, 152 - 10, 4 + 4 + 40 + 2, 152 - 10 - 50)
    assert (f2["kernels"], f2["wall_us"], f2["busy_us"], f2["idle_us"]) == (2, 70, 12, 58)
    rows = {r["name"]: r for r in got["kernels"]}
    assert set(rows) == {"rms_norm_kernel", "gemm", "rotary_kernel", "silu_kernel"}
    assert rows["rms_norm_kernel"] == {"name": "rms_norm_kernel", "count": 2, "gpu_us": 8,
                                       "launched": 2, "launch_us": 10, "host_us": 50,
                                       "idle_before_us": 46}
    assert rows["rotary_kernel"]["idle_before_us"] == 0  # neither was behind an idle GPU
    assert rows["rotary_kernel"]["host_us"] == 5  # 105 - 100; forward 2's first has none
    assert rows["silu_kernel"]["host_us"] == 60 and rows["silu_kernel"]["idle_before_us"] == 58
    assert [r["name"] for r in got["kernels"]][:2] == ["silu_kernel", "rms_norm_kernel"]
    assert got["totals"]["idle_us"] == 92 + 58
    assert got["totals"]["idle_share"] == pytest.approx(150 / 212)


def test_step_spans_pick_kernels_by_launch_time_and_leave_the_rest_out(tmp_path):
    spans = [("step[EXTEND bs=1 toks=512]", 0, 120), ("step[EXTEND bs=1 toks=512]", 4990, 100)]
    kernels = [*LAUNCH_BOUND, ("sampling_kernel", 6000, 6005, 3, "cudaLaunchKernel"),
               ("no_correlation", None, 5100, 1, None)]
    write(tmp_path / "t.json", events(*kernels, spans=spans))
    got = ta.analyze_trace_dir(tmp_path, gap_us=1e9)  # spans win over the gap rule
    assert [(f["name"], f["kernels"]) for f in got["forwards"]] == [
        ("step[EXTEND bs=1 toks=512]", 4), ("step[EXTEND bs=1 toks=512]", 2)]
    assert got["outside_forwards"] == {"kernels": 2, "gpu_us": 4}


def test_several_files_pool_and_a_broken_one_is_reported(tmp_path):
    write(tmp_path / "TP-0.trace.json.gz", events(*LAUNCH_BOUND[:4]), gz=True)
    write(tmp_path / "sub" / "TP-1.trace.json", events(*LAUNCH_BOUND[4:]))
    (tmp_path / "cut.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    got = ta.analyze_trace_dir(tmp_path)
    assert len(got["files"]) == 3
    assert len(got["errors"]) == 1 and "cut.trace.json.gz" in got["errors"][0]
    assert [f["file"] for f in got["forwards"]] == ["TP-0.trace.json.gz", "TP-1.trace.json"]
    assert got["totals"]["kernels"] == 6


def test_kernels_without_correlation_are_still_timed(tmp_path):
    write(tmp_path / "x.json", events(*[(n, None, s, d, None) for n, _, s, d, _ in LAUNCH_BOUND]))
    got = ta.analyze_trace_dir(tmp_path)
    assert got["totals"]["launched"] == 0 and got["totals"]["idle_us"] == 150
    assert all(r["host_us"] == 0 and r["launch_us"] == 0 for r in got["kernels"])


def test_no_trace_and_cpu_only_trace_say_why(tmp_path):
    assert "no trace file" in ta.analyze_trace_dir(tmp_path)["error"]
    write(tmp_path / "cpu.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1,
                                   "dur": 2}])
    got = ta.analyze_trace_dir(tmp_path)
    assert got["error"].startswith("no GPU kernels") and "1 CPU ops only" in got["error"]


@pytest.mark.parametrize("name, group", [
    ("void at::native::vectorized_elementwise_kernel<4, at::native::F>(int, F)",
     "at::native::vectorized_elementwise_kernel"),
    ("rms_norm_kernel", "rms_norm_kernel"),
    ("Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD"),
])
def test_kernel_group_drops_templates_and_arguments(name, group):
    assert ta.kernel_group(name) == group


def _analysis(tmp_path, name, kernels):
    write(tmp_path / name / "t.json", events(*kernels))
    return ta.analyze_trace_dir(tmp_path / name)


def test_verdict_splits_the_extra_wall_into_busy_and_idle(tmp_path):
    native = _analysis(tmp_path, "n", [("k", 0, 0, 10, "cudaLaunchKernel"),
                                       ("k", 1, 10, 10, "cudaLaunchKernel")])  # wall 20, no idle
    launch_bound = _analysis(tmp_path, "f", [("t", 0, 0, 10, "cuLaunchKernel"),
                                             ("t", 50, 60, 10, "cuLaunchKernel")])  # +50 idle
    slow_kernels = _analysis(tmp_path, "s", [("t", 0, 0, 40, "cuLaunchKernel"),
                                             ("t", 1, 40, 40, "cuLaunchKernel")])  # +60 busy
    lines = ta.verdict({"native-L1off": {"1x512": native}, "flagos-L1off": {"1x512": launch_bound},
                        "slow": {"1x512": slow_kernels, "8x2048": native}}, "native-L1off")
    assert lines[0].startswith("native-L1off: GPU idle 0%")
    assert lines[1].startswith("flagos-L1off: GPU idle 71%") and "t 100%" in lines[1]
    assert "-> launch-bound" in lines[3] and "GPU idle +0.05 ms" in lines[3]
    assert "-> kernel-bound" in lines[4] and "GPU busy +0.06 ms" in lines[4]
    assert "of 1 shapes" in lines[4]  # 8x2048 has no native counterpart


def test_verdict_names_a_configuration_without_kernels(tmp_path):
    cpu = {"error": "no GPU kernels in the trace"}
    assert ta.verdict({"native-L1off": {"1x8": cpu}}, "native-L1off") == [
        "native-L1off: no GPU forward analysed (no GPU kernels in the trace)"]


def test_prefill_phase_keeps_prefill_spans_only(tmp_path):
    spans = [("step[EXTEND bs=1 toks=512]", 0, 120), ("step[DECODE bs=1]", 4990, 100)]
    write(tmp_path / "t.json", events(*LAUNCH_BOUND, spans=spans))
    got = ta.analyze_trace_dir(tmp_path, phase="prefill")
    assert [f["kernels"] for f in got["forwards"]] == [4]
    assert got["outside_forwards"]["kernels"] == 2
    decode_only = tmp_path / "d"
    write(decode_only / "t.json", events(*LAUNCH_BOUND, spans=spans[1:]))
    assert ta.analyze_trace_dir(decode_only, phase="prefill")["error"] == (
        "6 GPU kernels, none in a prefill forward")


def test_prefill_phase_without_spans_leaves_graph_replays_out(tmp_path):
    """A trace without step spans (an SGLang that does not write them): the decode step after a
    one-token prefill replays the decode CUDA graph right behind the prefill's eager kernels."""
    replay = [("decode_gemm", 160, 160, 5, "cudaGraphLaunch"), ("decode_norm", 160, 166, 1,
                                                                 "cudaGraphLaunch")]
    write(tmp_path / "t.json", events(*LAUNCH_BOUND[:4], *replay))
    got = ta.analyze_trace_dir(tmp_path, phase="prefill")
    assert [(f["name"], f["kernels"], f["wall_us"]) for f in got["forwards"]] == [
        ("segment 1", 4, 142)]
    assert got["outside_forwards"] == {"kernels": 2, "gpu_us": 6}
    assert ta.analyze_trace_dir(tmp_path)["totals"]["kernels"] == 6  # no phase: all count
