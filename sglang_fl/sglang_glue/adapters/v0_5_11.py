"""SGLang 0.5.11.

Fused ops subclass ``MultiPlatformOp``, whose ``__init__`` stores
``self._forward_method = self.dispatch_forward()`` and whose ``forward`` calls it: the AROUND hook
on ``dispatch_forward`` binds each layer instance once, at construction. The JIT CUDA kernels
live in ``sglang.jit_kernel``; ``clamp_position`` and ``_resolve_future_token_ids`` are
hard-wired to them under ``is_cuda()`` and have native twins in the same modules.
"""

from __future__ import annotations

from sglang_fl.sglang_glue.adapters.base import (
    NativeSwap,
    SGLangAdapter,
    _jit_store_cache_unavailable,
)


class SGLang0511(SGLangAdapter):
    version = "0.5.11"
    # sigterm_watchdog ends with kill_process_tree(os.getpid(), include_parent=True).
    SIGTERM_STOP_KILLS_ITSELF = True
    DISPATCH_HOOK_TARGET = "sglang.srt.layers.utils.multi_platform.MultiPlatformOp.dispatch_forward"
    KERNELS = {
        **SGLangAdapter.KERNELS,
        "apply_rope_with_cos_sin_cache_inplace":
            "sglang.jit_kernel.rope:apply_rope_with_cos_sin_cache_inplace",
        "triton_mrope_fused": "sglang.srt.layers.rotary_embedding.triton_kernels:triton_mrope_fused",
        # Gated DeltaNet (FLA Triton kernels, Triton causal conv1d)
        "chunk_gated_delta_rule": "sglang.srt.layers.attention.fla.chunk:chunk_gated_delta_rule",
        "fused_sigmoid_gating_delta_rule_update":
            "sglang.srt.layers.attention.fla.fused_sigmoid_gating_recurrent:"
            "fused_sigmoid_gating_delta_rule_update",
        "fused_recurrent_gated_delta_rule_packed_decode":
            "sglang.srt.layers.attention.fla.fused_recurrent:fused_recurrent_gated_delta_rule_packed_decode",
        "fused_gdn_gating": "sglang.srt.layers.attention.fla.fused_gdn_gating:fused_gdn_gating",
        "causal_conv1d_fn": "sglang.srt.layers.attention.mamba.causal_conv1d_triton:causal_conv1d_fn",
        "causal_conv1d_update":
            "sglang.srt.layers.attention.mamba.causal_conv1d_triton:causal_conv1d_update",
        "rms_norm_gated": "sglang.srt.layers.attention.fla.layernorm_gated:rms_norm_gated",
    }
    NATIVE_SWAPS = (
        NativeSwap("sglang.srt.model_executor.forward_batch_info", "clamp_position",
                   "_clamp_position_native"),
        NativeSwap("sglang.srt.managers.overlap_utils", "_resolve_future_token_ids",
                   "_resolve_future_token_ids_native"),
        NativeSwap("sglang.srt.mem_cache.memory_pool", "can_use_store_cache", "",
                   _jit_store_cache_unavailable),
    )


ADAPTER = SGLang0511()
