"""benchmarks/e2e_bench.py's greedy check end to end on CPU, as the GPU ``shapes`` stage runs it
on Qwen3.6's shapes: Qwen3.6-35B-A3B's structure (Gated DeltaNet, gated attention, 256 routed
experts and a shared one) at a CPU's width, served by a real SGLang server, its greedy ids
judged against HF transformers' fp32 reference prompt by prompt. Served in fp32 on CPU there is
no rounding witness: every prompt must equal HF, and the run's exit status is 0. The server's
own top logprobs, asked in a second request, are read from SGLang's real response and set
beside each verdict. (The tiny ``qwen3.5-moe`` preset's served ids against HF are
tests/e2e/test_hybrid_server.py's; the same check here added a server start and nothing else.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

from sglang_fl.sglang_glue.adapters import get_adapter  # noqa: E402

if get_adapter().CPU_HYBRID_MISSING_OPS:
    pytest.skip("this SGLang version's Qwen3.5 module needs sgl_kernel CPU ops that empty mode "
                "does not provide", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import e2e_bench  # noqa: E402

#: Qwen3.6-35B-A3B's structure at a CPU's width: its 256 experts with 8 per token, 16 query
#: heads of 256 over 2 KV heads, Gated DeltaNet with twice the value heads of key heads, and its
#: initialiser (near-uniform routing). On the GPU in bf16 every configuration, SGLang's own
#: kernels included, parts from HF's fp32 ids there (2026-12-05); in fp32 they must not part.
QWEN36_35B_A3B_NARROW = dict(preset="qwen3.6-35b-a3b", dtype="float32", hidden_size=256,
                             num_layers=4, intermediate_size=128, moe_intermediate_size=64,
                             shared_expert_intermediate_size=64, vocab_size=8192)


def test_served_moe_hybrid_equals_hf_through_the_benchmarks_greedy_check(tmp_path, monkeypatch):
    from sglang_fl.models import make_tiny_model

    model = make_tiny_model(tmp_path / "model", **QWEN36_35B_A3B_NARROW)
    monkeypatch.setattr(e2e_bench, "SERVER_ARGS", list(e2e_bench.SERVER_ARGS))
    out = tmp_path / "out" / "e2e.json"
    doc = e2e_bench.main(["--model", str(model), "--out", str(out), "--log-dir", str(tmp_path / "logs"),
                          "--configs", "fl-defaults", "--repeats", "0", "--server-args", "--dtype float32",
                          "--greedy-prompts", "3", "--greedy-tokens", "8"])
    greedy = json.loads(out.read_text())["greedy"]
    print(json.dumps(greedy["verdicts"], indent=1))
    assert doc["start_errors"] == {}
    assert greedy["hf_reference"]["served_dtype"] == "float32"
    assert greedy["hf_reference"]["witness"] is None and greedy["hf_reference"]["device"] == "cpu"
    rows = greedy["verdicts"]["fl-defaults"]
    assert [r["verdict"] for r in rows] == ["equal"] * 3, rows
    # the server's own top logprobs (a second request, same ids) say how far its logits sit
    # from HF's: fp32 against fp32 here, so next to nothing, over every step's top tokens
    assert all(r["noise_pairs"] >= 8 * 4 and r["served_noise"] < 1e-3 for r in rows), rows
    assert all(len(top) == 8 for top in greedy["served_top_logprobs"]["fl-defaults"])
    assert greedy["servers"]["fl-defaults"] == greedy["hf_transformers"]
    assert all(len(ids) == 8 for ids in greedy["hf_transformers"])
    assert e2e_bench.exit_status(doc) == 0
