"""Qwen3.5/3.6 hybrids served on CPU through the plugin (``make-tiny-model --preset qwen3.5`` and
``qwen3.5-moe``: Gated DeltaNet linear attention and gated full attention alternating, partial
interleaved mRoPE, the MoE one with a shared expert): greedy ids equal HF transformers' (fp32),
every GDN kernel SGLang calls ran on sglang-fl's ops (reference backend), no stand-in was called,
and the CPU server defaults keep the whole server under 3 GB RSS (SGLang alone would size the
state cache from host RAM: 7-8 GB). One server start per preset.
"""

from __future__ import annotations

import psutil
import pytest
from e2e_support import dispatch_lines, greedy_ids, serve, standin_calls_in

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e


def _missing_ops() -> tuple[str, ...]:
    from sglang_fl.sglang_glue.adapters import get_adapter

    return get_adapter().CPU_HYBRID_MISSING_OPS


if _missing_ops():
    pytest.skip(f"this SGLang version's Qwen3.5 module needs sgl_kernel CPU ops that empty mode "
                f"does not provide yet: {', '.join(_missing_ops())}", allow_module_level=True)

#: What the GDN layers route (besides the norms, rotary and MLP/MoE classes of every model).
GDN_DISPATCH = [
    "[OOT-DISPATCH] RMSNormGated → reference(reference)",
    "[OOT-DISPATCH] causal_conv1d_fn_cpu → reference(reference)",
    "[OOT-DISPATCH] causal_conv1d_update_cpu → reference(reference)",
    "[OOT-DISPATCH] chunk_gated_delta_rule_cpu → reference(reference)",
    "[OOT-DISPATCH] fused_gdn_gating_cpu → reference(reference)",
    "[OOT-DISPATCH] fused_sigmoid_gating_delta_rule_update_cpu → reference(reference)",
    "[OOT-DISPATCH] GemmaRMSNorm → reference(reference)",  # Qwen3.5's norms (1 + weight)
    "[OOT-DISPATCH] MRotaryEmbedding → reference(reference)",  # partial interleaved mRoPE
]
RSS_LIMIT = 3 * 1024**3


@pytest.fixture(scope="module")
def run_dir(hybrid_model, tmp_path_factory):
    return tmp_path_factory.mktemp(hybrid_model.name)


@pytest.fixture(scope="module")
def server(hybrid_model, run_dir):
    with serve(hybrid_model, run_dir, timeout=400) as srv:
        yield srv


def _server_rss(server) -> int:
    root = psutil.Process(server.process.pid)
    procs = [root, *root.children(recursive=True)]
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def test_hybrid_greedy_ids_equal_hf_transformers(server, hybrid_prompt_ids, hybrid_hf_ids):
    assert greedy_ids(server, hybrid_prompt_ids) == hybrid_hf_ids


def test_hybrid_gdn_kernels_ran_on_sglang_fl_ops(server, run_dir, hybrid_model):
    lines = dispatch_lines(run_dir)
    assert set(GDN_DISPATCH) <= set(lines), lines
    moe = "moe" in hybrid_model.name
    assert ("[OOT-DISPATCH] TopK → reference(reference)" in lines) == moe
    assert not [line for line in lines if "left to SGLang" in line]


def test_hybrid_served_run_never_called_a_standin(server):
    assert standin_calls_in(server.log_text()) == []


def test_hybrid_cpu_server_defaults_bound_memory(server):
    log = server.log_text()
    assert "server default: max_mamba_cache_size=128" in log
    assert "server default: mamba_ssm_dtype='float32'" in log
    assert "SGLANG_MAMBA_CONV_DTYPE=float32" in log
    rss = _server_rss(server)
    assert rss < RSS_LIMIT, f"server RSS {rss / 1024**3:.2f} GB over all its processes"
