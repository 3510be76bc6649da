"""Architectures beyond the Qwen family served on CPU through the plugin, greedy ids equal HF
transformers' (fp32): Llama 3 RoPE scaling and YaRN (RotaryEmbedding subclasses the plugin
routes with their own cos/sin cache), Qwen2-MoE (top-k without renormalisation, a gated shared
expert), Gemma 2 (GemmaRMSNorm routed; its final-logit soft-capping,
a Triton kernel in SGLang, runs through the CPU swap ``swap:fused_softcap``: without it the first
request kills the server), and Gemma 3, whose norms, GeLU and RoPE the plugin does not route (its
MultiPlatformOps keep SGLang's forward; nothing is logged as routed). One server start per
architecture."""

from __future__ import annotations

import pytest
from e2e_support import dispatch_lines, greedy_ids, hf_greedy_ids, serve, standin_calls_in
from other_models import ARCHITECTURES, make_other_model

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

COMMON_DISPATCH = ["[OOT-DISPATCH] RMSNorm → reference(reference)",
                   "[OOT-DISPATCH] SiluAndMul → reference(reference)"]
EXPECTED_DISPATCH = {
    "llama3": sorted(COMMON_DISPATCH + ["[OOT-DISPATCH] Llama3RotaryEmbedding → reference(reference)"]),
    "llama-yarn": sorted(COMMON_DISPATCH + ["[OOT-DISPATCH] YaRNScalingRotaryEmbedding → reference(reference)"]),
    "qwen2-moe": sorted(COMMON_DISPATCH + [  # SiluAndMul: the shared expert's MLP
        "[OOT-DISPATCH] RotaryEmbedding → reference(reference)",
        "[OOT-DISPATCH] TopK → reference(reference)",
        "[OOT-DISPATCH] UnquantizedFusedMoEMethod → reference(reference)"]),
    "gemma2": ["[OOT-DISPATCH] GemmaRMSNorm → reference(reference)",
               "[OOT-DISPATCH] RotaryEmbedding → reference(reference)"],
    "gemma3": [],
}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def served(request, tiny_model, prompt_ids, tmp_path_factory):
    name = request.param
    work = tmp_path_factory.mktemp(name)
    model = make_other_model(name, work / "model", tiny_model)
    expected = hf_greedy_ids(model, prompt_ids)
    run_dir = work / "run"
    run_dir.mkdir()
    with serve(model, run_dir, timeout=300) as srv:
        yield name, srv, run_dir, expected


def test_greedy_ids_equal_hf_transformers(served, prompt_ids):
    _, server, _, expected = served
    assert greedy_ids(server, prompt_ids) == expected


def test_dispatch_log_names_the_classes_the_model_built(served):
    name, _, run_dir, _ = served
    assert dispatch_lines(run_dir) == EXPECTED_DISPATCH[name]


def test_no_standin_was_called(served):
    assert standin_calls_in(served[1].log_text()) == []
