"""benchmarks/step_profile.py's prefill case against a real (CPU) server: SGLang's
``/start_profile`` and ``/stop_profile`` as the tool calls them, a trace written and read back.
A CPU server's trace has no GPU timeline, so the analysis must say so rather than fail; the
kernel analysis itself is tested on synthetic traces (tests/unit/test_trace_analysis.py) and
runs for real on the H200 (benchmarks/gpu_session.sh prefillprofile)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from e2e_support import serve

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import step_profile  # noqa: E402


def test_a_cpu_prefill_profile_is_traced_and_says_it_has_no_gpu_kernels(tiny_model, tmp_path):
    vocab = step_profile.model_vocab(tiny_model)
    with serve(tiny_model, tmp_path) as server:
        got = step_profile.prefill_one(server, vocab, batch=2, tokens=16, repeats=1,
                                       out_dir=tmp_path, tag="cpu-2x16", gap_us=1000)
    assert got["batch"] == 2 and got["untraced_ms"] > 0 and got["traced_ms"] > 0
    trace = got["trace"]
    assert trace["files"], trace  # SGLang wrote the trace where the tool asked
    assert trace["error"].startswith("no GPU kernels in the trace (")
    assert "CPU ops only" in trace["error"]
    assert step_profile.prefill_table({"results": {"native-L1off": {"2x16": got}}}, top=3)[-1] == (
        "native-L1off: no GPU forward analysed (" + trace["error"] + ")")
