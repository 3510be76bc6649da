"""A vendor folder's Gated DeltaNet ops in a served hybrid (CPU): a vendor package, found through
its entry point, supplies ``causal_conv1d_update`` and a ``chunk_gated_delta_rule`` whose kernel
declares it takes bf16 only. Served in fp32, the hybrid runs the vendor's conv update, the chunk
rule's calls are declined by its declared limit and go to the next implementation (the
reference), the dispatch log says both, and the greedy ids equal HF transformers'."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from e2e_support import PROMPT_TEXTS, dispatch_lines, greedy_ids, hf_greedy_ids, serve

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

from sglang_fl.sglang_glue.adapters import get_adapter  # noqa: E402

if get_adapter().CPU_HYBRID_MISSING_OPS:
    pytest.skip("this SGLang version's Qwen3.5 module needs sgl_kernel CPU ops that empty mode "
                "does not provide", allow_module_level=True)

VENDOR_METHODS = '''
def causal_conv1d_update(self, obj, x, conv_state, weight, bias=None, activation=None,
                         conv_state_indices=None):
    return ref.causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices)

@accepts(q=("bfloat16",), why="this chip's chunk kernel is bf16 only")
def chunk_gated_delta_rule(self, obj, q, k, v, g, beta, initial_state, cu_seqlens, scale=None,
                           use_qk_l2norm=True):
    raise AssertionError("the declared limit let a float32 call reach the kernel")
'''


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from transformers import AutoTokenizer

    from sglang_fl.models import make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen3.5", preset="qwen3.5")
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(t)["input_ids"] for t in PROMPT_TEXTS]
    return model, prompts, hf_greedy_ids(model, prompts)


def test_a_vendor_gdn_op_serves_and_a_declared_limit_hands_calls_on(hybrid, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
    from vendor_package import write_vendor_package

    model, prompts, hf = hybrid
    root = write_vendor_package(tmp_path / "site", "acmegdn", VENDOR_METHODS, imports=(
        "from sglang_fl.dispatch.backends import reference_gdn as ref\n"
        "from sglang_fl.dispatch.limits import accepts\n"))
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    with serve(model, tmp_path, timeout=400, PYTHONPATH=path,
               SGLANG_FL_PER_OP="causal_conv1d_update=vendor|reference;"
                                "chunk_gated_delta_rule=vendor|reference") as srv:
        got = greedy_ids(srv, prompts)
        log = srv.log_text()
    lines = dispatch_lines(tmp_path)
    assert got == hf
    assert "[OOT-DISPATCH] causal_conv1d_update_cpu → vendor(vendor.acmegdn)" in lines, lines
    assert ("[OOT-DISPATCH] chunk_gated_delta_rule_cpu → reference(reference) (inputs declined "
            "by vendor.acmegdn)") in lines, lines
    assert not [line for line in lines if "chunk_gated_delta_rule_cpu → vendor" in line], lines
    declines = [line for line in log.splitlines() if "declined the inputs" in line]
    assert declines and "q in bfloat16, not float32" in declines[0], declines
    assert "the declared limit let a float32 call reach the kernel" not in log
