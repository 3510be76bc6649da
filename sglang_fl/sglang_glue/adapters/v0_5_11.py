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
    jit_builds,
)

_ROPE_GRID = tuple((neox, dim, dtype) for neox in (True, False) for dim in (64, 128)
                   for dtype in ("bfloat16", "float16"))
_INDEX_DTYPES = (("int32",), ("int64",))


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

    # What SGLang's own CUDA path and vendor.cuda build on a dense Qwen2/Llama: fused RoPE (both
    # styles, rotary dims 64/128), SiLU-and-mul, the KV-cache store (rows of kv_heads * head_dim
    # * 2 bytes: Qwen2.5-0.5B 2x64, Qwen3-30B-A3B 4x128, Llama-3-8B 8x128), clamp_position and
    # resolve_future_token_ids. Built by tvm-ffi into TVM_FFI_CACHE_DIR.
    JIT_PREBUILD = (
        *jit_builds("sglang.jit_kernel.rope", "_jit_fused_rope_module", *_ROPE_GRID,
                    e2e=[(True, 64, "bfloat16")]),
        *jit_builds("sglang.jit_kernel.activation", "_jit_activation_module",
                    ("bfloat16",), ("float16",), e2e=[("bfloat16",)]),
        *jit_builds("sglang.jit_kernel.kvcache", "_jit_kvcache_module", (256,), (1024,), (2048,),
                    e2e=[(256,)]),
        *jit_builds("sglang.jit_kernel.clamp_position", "_jit_clamp_position_module",
                    *_INDEX_DTYPES, e2e=_INDEX_DTYPES),
        *jit_builds("sglang.jit_kernel.resolve_future_token_ids",
                    "_jit_resolve_future_token_ids_module", *_INDEX_DTYPES, e2e=_INDEX_DTYPES),
    )


ADAPTER = SGLang0511()
