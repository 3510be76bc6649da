"""A Qwen3-MoE served on CPU through the plugin (``make-tiny-model --preset qwen3-moe``: 128
experts, top-8, every layer sparse): greedy ids equal HF transformers' (fp32), and the router
and the experts really ran on sglang-fl's ``topk`` / ``fused_moe`` ops (reference backend).
One server start."""

from __future__ import annotations

import pytest
from e2e_support import dispatch_lines, greedy_ids, serve, standin_calls_in

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

EXPECTED_MOE_DISPATCH = sorted([
    "[OOT-DISPATCH] RMSNorm → reference(reference)",  # layer norms and Qwen3's q/k norms
    "[OOT-DISPATCH] RotaryEmbedding → reference(reference)",
    "[OOT-DISPATCH] TopK → reference(reference)",
    "[OOT-DISPATCH] UnquantizedFusedMoEMethod → reference(reference)",  # FusedMoE's experts
])


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("moe")


@pytest.fixture(scope="module")
def server(moe_model, run_dir):
    with serve(moe_model, run_dir) as srv:
        yield srv


def test_moe_greedy_ids_equal_hf_transformers(server, moe_prompt_ids, moe_hf_ids):
    assert greedy_ids(server, moe_prompt_ids) == moe_hf_ids


def test_moe_dispatch_log_names_the_moe_classes(server, run_dir):
    """Each routed class once per process, every one on the route it took (a layer the bridge
    handed back would show "left to SGLang"); no dense MLP (SiluAndMul) in an all-sparse model."""
    assert dispatch_lines(run_dir) == EXPECTED_MOE_DISPATCH


def test_moe_served_run_never_called_a_standin(server):
    assert standin_calls_in(server.log_text()) == []
