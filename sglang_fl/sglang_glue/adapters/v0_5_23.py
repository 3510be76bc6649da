"""SGLang 0.5.23.

What changed for sglang-fl since 0.5.11 (read off the 0.5.23 wheel):

- ``MultiPlatformOp`` became a deprecated alias of ``sglang.kernels.fused_op.BaseFusedOp``, and
  ``dispatch_forward`` is gone: ``BaseFusedOp.forward`` resolves ``_resolve_forward_method()``
  lazily on the first call and caches it in ``_forward_method`` (a subclass ``__init__`` may
  still pin it, as in 0.5.11). The Layer-2 hook wraps ``_resolve_forward_method``; the binder it
  returns is stored and called by SGLang in the same place as before. ``register_oot_forward``
  exists but keys on the exact class and only on an out-of-tree platform; sglang-fl keeps
  SGLang's in-tree platform identity, so it keeps the hook.
- ``RMSNorm.forward`` takes ``quant_linear`` (and models call ``fuse_input_quant``): a norm
  whose consumer is a static per-tensor FP8 linear returns a quantized ``(fp8, scale, dtype)``
  output on CUDA, which the standard op does not express: such calls stay SGLang's.
- ``TopK.forward`` takes ``dynamic_expert_bias`` / ``router_logits_partials`` and resolves
  padded-token masking and EPLB dispatch info itself (``_resolve_routing_inputs``); shared
  experts moved into ``TopKConfig.shared_experts``; routed-experts capture moved to
  ``capture_routed_experts_if_allowed``.
- The JIT CUDA kernels moved from ``sglang.jit_kernel`` to ``sglang.kernels.ops``;
  ``clamp_position`` is now a fused op with a JIT backend, imported into forward_batch_info,
  and ``overlap_utils`` no longer calls a JIT kernel. SiLU-and-mul on CUDA is a fused op whose
  first backend is JIT. The builds are cached under ``SGLANG_JIT_CACHE_DIR`` (default
  ``~/.cache/sglang/jit``), no longer tvm-ffi's ``TVM_FFI_CACHE_DIR``.
- The FLA kernels (``layernorm_gated.RMSNorm``, the GDN output norm) moved from
  ``sglang.srt.layers.attention.fla`` to ``sglang.kernels.ops.attention.fla``.
- ``qwen2_moe`` gates shared experts with a Triton kernel unless the gate is AMX-packed, so on
  a CPU without AMX too: rebound to the unfused math on CPU (``CPU_NATIVE_SWAPS``).
- ``GroupCoordinator.all_gatherv`` takes an ``output`` buffer (CommunicatorFL accepts it).
- ``ServerArgs`` is a msgspec Struct: a hook on its ``__post_init__`` never runs (msgspec binds
  it when the type is made; the start-up checks hook ``resolve_once`` instead), fields are ``msgspec.structs.fields``, and resolution keeps the
  user's input in ``_raw_input`` while it declares defaults (a platform's
  ``apply_server_args_defaults`` gets a recorder that reads through to the record).
- ``--mamba-scheduler-strategy`` became ``--mamba-radix-cache-strategy``, whose ``auto`` picks
  ``extra_buffer`` (unsupported on CPU) whenever overlap scheduling is on.
- ``--disable-piecewise-cuda-graph`` is gone (tc_piecewise removed); prefill CUDA graphs are
  ``--cuda-graph-backend-prefill breakable|full|disabled``.
- ``initialize_model_parallel`` reads the group widths from the published parallel context
  instead of taking ``tensor_model_parallel_size``.
"""

from __future__ import annotations

from sglang_fl.sglang_glue.adapters.base import (
    NativeSwap,
    SGLangAdapter,
    _answer_no,
    _jit_store_cache_unavailable,
    jit_builds,
    shared_expert_gate_add_native,
    shared_expert_gate_native,
)

_ROPE_GRID = tuple((neox, dim, dtype, dtype) for neox in (True, False) for dim in (64, 128)
                   for dtype in ("bfloat16", "float16"))
_INDEX_DTYPES = (("int32",), ("int64",))


def _clamp_position_native(seq_lens):
    """SGLang's own native path of its ``clamp_position`` fused op (the JIT one needs tvm_ffi)."""
    from sglang.kernels.ops.attention.clamp_position import ClampPositionOp

    return ClampPositionOp.forward_native(None, seq_lens)


class SGLang0523(SGLangAdapter):
    version = "0.5.23"
    DISPATCH_HOOK_TARGET = "sglang.kernels.fused_op.BaseFusedOp._resolve_forward_method"
    KERNELS = {
        **SGLangAdapter.KERNELS,
        "apply_rope_with_cos_sin_cache_inplace":
            "sglang.kernels.ops.attention.rope:apply_rope_with_cos_sin_cache_inplace",
        "triton_mrope_fused": "sglang.kernels.ops.attention.rotary_triton:triton_mrope_fused",
        # Gated DeltaNet (FLA Triton kernels, Triton causal conv1d), moved under sglang.kernels
        "chunk_gated_delta_rule": "sglang.kernels.ops.attention.fla.chunk:chunk_gated_delta_rule",
        "fused_sigmoid_gating_delta_rule_update":
            "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent:"
            "fused_sigmoid_gating_delta_rule_update",
        "fused_recurrent_gated_delta_rule_packed_decode":
            "sglang.kernels.ops.attention.fla.fused_recurrent:fused_recurrent_gated_delta_rule_packed_decode",
        "fused_gdn_gating": "sglang.kernels.ops.attention.linear.fused_gdn_gating:fused_gdn_gating",
        "causal_conv1d_fn": "sglang.kernels.ops.mamba.causal_conv1d_triton:causal_conv1d_fn",
        "causal_conv1d_update": "sglang.kernels.ops.mamba.causal_conv1d_triton:causal_conv1d_update",
        "rms_norm_gated": "sglang.kernels.ops.attention.fla.layernorm_gated:rms_norm_gated",
    }
    LAYER_CLASSES = {
        **SGLangAdapter.LAYER_CLASSES,
        # The FLA kernels moved under sglang.kernels.ops.
        "RMSNormGated": "sglang.kernels.ops.attention.fla.layernorm_gated:RMSNorm",
    }
    NATIVE_SWAPS = (
        NativeSwap("sglang.srt.model_executor.forward_batch_info", "clamp_position", "",
                   _clamp_position_native),
        NativeSwap("sglang.srt.mem_cache.memory_pool", "can_use_store_cache", "",
                   _jit_store_cache_unavailable),
        # Qwen2/Llama MLPs build a DualGemm whose mode check asks is_cuda() and then imports
        # its CuTe-DSL (Blackwell) kernel, which needs nvidia-cutlass-dsl: answered no, SGLang
        # keeps the separate gate/up GEMM and SiluAndMul it uses everywhere else (and on Hopper).
        NativeSwap("sglang.srt.layers.dual_gemm", "is_cuda", "", _answer_no, needs="cutlass"),
        # The Triton attention backend asks sgl_kernel whether the GPU supports programmatic
        # dependent launch (CUDA hosts only): answered no, it launches the same kernels without
        # the launch overlap.
        NativeSwap("sglang.srt.layers.attention.triton_backend", "is_arch_support_pdl", "",
                   _answer_no, needs="sgl_kernel", cuda_only=True),
    )
    # Qwen2/3-MoE-style shared experts (Qwen3.5-MoE too) gate their output with a Triton kernel
    # whenever the gate is not AMX-packed, i.e. on every CPU without AMX as well.
    CPU_NATIVE_SWAPS = SGLangAdapter.CPU_NATIVE_SWAPS + (
        NativeSwap("sglang.srt.models.qwen2_moe", "fused_gate_sigmoid_mul", "",
                   shared_expert_gate_native),
        NativeSwap("sglang.srt.models.qwen2_moe", "fused_gate_sigmoid_mul_add", "",
                   shared_expert_gate_add_native),
    )
    # The xgrammar backend applies grammar masks on CPU too (xgrammar's own CPU kernel).
    GRAMMAR_MASK_DEVICES = SGLangAdapter.GRAMMAR_MASK_DEVICES | {"cpu"}
    SERVER_ARGS_POST_INIT = None
    # Construction leaves the record unresolved; launchers call resolve_once, whose pipeline
    # loads the model config (muse_spark_hook) before any platform hook runs.
    SERVER_ARGS_CHECK = "sglang.srt.server_args.ServerArgs.resolve_once"
    # "auto" picks the extra-buffer mamba radix cache whenever overlap scheduling is on, and then
    # refuses it on CPU (no state snapshots there): a hybrid model would not start.
    # no_buffer then needs overlap scheduling off (0.5.11 turns it off on CPU itself).
    CPU_HYBRID_DEFAULTS = {
        "mamba_radix_cache_strategy": ("no_buffer", "the extra-buffer mamba cache needs state "
                                       "snapshots, which SGLang supports on accelerators only"),
        "disable_overlap_schedule": (True, "the no_buffer mamba cache of hybrid models does not "
                                     "support overlap scheduling"),
    }
    # Its GDN backend takes a prefix's state snapshot from the kernel (track_state), so the
    # extra-buffer mamba cache (its default on accelerators) needs no per-chunk states.
    GDN_TRACK_STATE_SNAPSHOT = True
    # Its GPU bundle keeps apache-tvm-ffi (xgrammar needs it), so without sglang-kernel these
    # JIT modules are what SGLang builds on CUDA, empty mode included: the KV-cache store (every
    # server probes it at start: rows of kv_heads * head_dim * dtype bytes, k and v; 256 is the
    # tiny fp32 models' and Qwen2.5-0.5B's, 2048 the 27B-shaped hybrid's) and clamp_position
    # (every decode step); fused RoPE (q and k of one dtype) and SiLU-and-mul where SGLang's own
    # ops run (the "sglang" benchmark configurations, vendor.cuda's RoPE). 0.5.11's
    # resolve_future_token_ids kernel is gone.
    JIT_PREBUILD = (
        *jit_builds("sglang.kernels.ops.attention.rope", "_jit_fused_rope_module", *_ROPE_GRID,
                    e2e=[(True, 64, "bfloat16", "bfloat16")]),
        *jit_builds("sglang.kernels.ops.activation.activation", "activation_module",
                    ("bfloat16",), ("float16",), e2e=[("bfloat16",)]),
        *jit_builds("sglang.kernels.ops.kvcache.kvcache", "_jit_kvcache_module",
                    (256, 256, 0), (1024, 1024, 0), (2048, 2048, 0), e2e=[(256, 256, 0)]),
        *jit_builds("sglang.kernels.ops.attention.clamp_position", "_jit_clamp_position_module",
                    *_INDEX_DTYPES, e2e=_INDEX_DTYPES),
    )
    JIT_CACHE_DIR_ENV = "SGLANG_JIT_CACHE_DIR"
    # intel_amx needs sgl_kernel's CPU build (the plugin's CPU default is torch_native).
    CPU_SPECULATIVE_ATTENTION_BACKENDS = ("intel_amx",)
    CPU_PAGED_KV = True
    # Piecewise CUDA graph (torch.compile) is gone; the prefill phase has its own graph backend.
    PREFILL_GRAPH_OFF = ("cuda_graph_backend_prefill", "disabled")
    # The breakable CUDA graph (SGLang's CUDA default) captures the kernels directly, with eager
    # breaks at attention: no torch.compile, so no custom ops. It needs cuda-python.
    PREFILL_GRAPH_ON = ((), ("--cuda-graph-backend-prefill", "breakable"))
    # The mamba radix-cache strategy resolves itself (extra_buffer where speculation needs it).
    SPECULATIVE_HYBRID_NEEDS_NO_RADIX = False

    def graph_backend_problems(self, server_args) -> list[str]:
        """The breakable CUDA graph queries stream capture through cuda-python (``cuda.bindings``,
        a requirement of SGLang 0.5.23). Without it the capture ends in ``assert graph is not
        None``, which hides the ImportError (H200, 2026-12-03, a bundle without cuda-python)."""
        from sglang_fl.dispatch.backends import real_module_available

        config = getattr(server_args, "cuda_graph_config", None)
        phases = [phase for phase in ("prefill", "decode")
                  if getattr(getattr(config, phase, None), "backend", None) == "breakable"]
        if not phases:
            return []
        ok, why = real_module_available("cuda.bindings.runtime")
        if ok:
            return []
        return [f"the breakable CUDA graph ({', '.join(phases)}) needs cuda-python "
                f"(cuda.bindings), and here {why}: install cuda-python, which SGLang 0.5.23 "
                "requires, or pass " + " ".join(f"--cuda-graph-backend-{p} disabled" for p in phases)]

    def prefill_graph_off_default(self, server_args) -> tuple[str, object] | None:
        """Platform defaults run after SGLang folded ``cuda_graph_backend_prefill`` into the
        resolved ``cuda_graph_config`` (its pipeline: ``handle_cuda_graph_config``, then
        ``handle_platform_defaults``), so setting the option there changes nothing (seen on
        the H200, 2026-12-03: the breakable prefill graph was captured and asserted). The
        default is the resolved config with the prefill phase disabled, unless the user chose
        the prefill backend (SGLang's ``_cuda_graph_config_locked``)."""
        from sglang.srt.model_executor.cuda_graph_config import (
            Backend,
            CudaGraphConfig,
            Phase,
            with_phase,
        )

        config = getattr(server_args, "cuda_graph_config", None)
        if not isinstance(config, CudaGraphConfig):  # not resolved yet: the option still counts
            return self.PREFILL_GRAPH_OFF
        locked = getattr(server_args, "_cuda_graph_config_locked", None) or ()
        if (Phase.PREFILL, "backend") in locked or config.prefill.backend == Backend.DISABLED:
            return None
        return "cuda_graph_config", with_phase(config, Phase.PREFILL, backend=Backend.DISABLED)

    # The radix cache runs on a TreeCore chosen by SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND
    # (default "rust": a Rust extension linked against libtorch, bundled in the wheel).
    TREE_CORE_REGISTRY = "sglang.srt.mem_cache.unified_cache.tree_core_registry"
    TREE_CORE_ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"

    def tree_core_user_choice(self) -> str | None:
        from sglang.srt.environ import envs

        var = envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND
        return var.get() if var.is_set() else None

    def rust_tree_core_insert(self, device: str = "cpu", dtype: str = "int64") -> None:
        from array import array

        import torch
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        core = RustUnifiedTreeCore(CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
            page_size=1, tree_components=(ComponentType.FULL,)))
        core.begin_insert(InsertParams(key=RadixKey(array("q", [1, 2, 3])), value=torch.arange(
            3, dtype=getattr(torch, dtype), device=device)))
        if core.has_ongoing_insert():
            core.end_insert()
        if core.evictable_size() != 3:
            raise RuntimeError(f"after a 3-token insert the tree holds {core.evictable_size()}")

    def rust_tree_core_problem(self, device: str = "cpu") -> str | None:
        """`rust_tree_core_insert` through SGLang's own adapter class: the call that panicked
        on SGLang's first prefill on the H200 image (``UnknownKind(19)`` from tch, torch 2.11).
        The extension in the wheel is compiled against the torch SGLang pins, and it reads
        tensors through that torch's C++ headers: under another torch release whose layouts
        differ it reads garbage. SGLang's own gate checks only the range a source build
        supports (2.11-2.14)."""
        import importlib.metadata

        import torch

        try:
            self.rust_tree_core_insert(device)
            return None
        except Exception as exc:  # noqa: BLE001 - any failure means: do not serve on it
            pins = [r for r in importlib.metadata.requires("sglang") or ()
                    if r.replace(" ", "").startswith("torch==")]
            built = f"built for {pins[0].replace(' ', '')}" if pins else "prebuilt"
            return (f"its bundled extension ({built}) fails a one-key insert on {device} under torch "
                    f"{torch.__version__}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")

    # Split per phase; the old name is now an ambiguous argparse prefix.
    DECODE_GRAPH_MAX_BS = "cuda_graph_max_bs_decode"
    # Without these, an out-of-tree platform gets no decode CUDA graphs (seen on the H200:
    # 28 tok/s at bs1), no Triton KV writers and no PyNccl.
    IN_TREE_PLATFORMS = {
        "CUDA": "sglang.srt.platforms.cuda:CudaSRTPlatform",
        "NPU": "sglang.srt.platforms.npu:NPUSRTPlatform",
        "MUSA": "sglang.srt.platforms.musa:MusaSRTPlatform",
        "CPU": "sglang.srt.platforms.cpu:CpuSRTPlatform",
    }

    def mamba_extra_buffer(self) -> bool:
        # get_global_server_args is retired: the value in effect is in the exec namespace.
        from sglang.srt.runtime_context import get_exec

        return bool(get_exec().mamba.enable_mamba_extra_buffer)

    def ensure_server_args(self) -> None:
        try:
            self._published_server_args()
        except ValueError:
            self.set_server_args(model_path="dummy")  # publishes every namespace its kernels read

    def _published_server_args(self):
        # get_global_server_args is retired (always RuntimeError); this one raises ValueError
        # until a ServerArgs is published.
        from sglang.srt.runtime_context import get_server_args

        return get_server_args()

    def cpu_omp_bind_groups(self, tp_size: int, pp_size: int = 1) -> int:
        # One per worker process, indexed by its gpu_id (pp_rank * tp_size + tp_rank).
        return tp_size * pp_size

    def remember_user_choices(self, server_args) -> None:  # no post-init hook in this version
        return None

    def user_choices(self, server_args) -> frozenset[str] | None:
        import msgspec

        raw = getattr(server_args, "_raw_input", None)
        if raw is None:
            return None
        defaults = {f.name: f.default for f in msgspec.structs.fields(self.module("server_args").ServerArgs)}
        return frozenset(n for n, v in raw.items()
                         if n in defaults and defaults[n] is not msgspec.NODEFAULT and v != defaults[n])

    TOPK_CALL_EXTRAS = (*SGLangAdapter.TOPK_CALL_EXTRAS, "dynamic_expert_bias",
                        "router_logits_partials")

    def initialize_model_parallel(self, tp_size: int = 1, pp_size: int = 1, rank: int = 0) -> None:
        # The widths come from the published context: publish them first, as SGLang's own
        # tests do (sglang.test.test_utils.publish_build_topology), keeping the WORLD group.
        from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context

        ps = self.module("parallel_state")
        reset_context()
        publish(self.module("server_args").ServerArgs(model_path="dummy", tp_size=tp_size,
                                                      pp_size=pp_size),
                role="test", ranks=SpawnRanks(world_rank=rank))
        if ps._WORLD is not None:
            get_parallel().override_permanently(world_group=ps._WORLD)
        ps.initialize_model_parallel()

    def rms_norm_call_unsupported(self, layer, quant_linear) -> str | None:
        from sglang.srt.layers.layernorm import _fp8_static_input_scale

        linear = quant_linear if quant_linear is not None else layer.__dict__.get("_quant_linear")
        if linear is not None and _fp8_static_input_scale(linear) is not None:
            return "fused static FP8 input quantization (quant_linear)"
        return None

    def topk_call_unsupported(self, layer, extras: dict) -> str | None:
        if any(v is not None for v in extras.values()):
            return "calls with expert-location / dynamic-bias routing arguments"
        resolved = layer._resolve_routing_inputs(None, None)
        if any(v is not None for v in resolved):
            return "padded-token masking or EPLB dispatch info of the forward context"
        return None

    def _topk_config_unsupported(self, cfg) -> list[tuple[str, bool]]:
        return [
            ("shared expert slots", cfg.num_shared_topk_slots != 0),
            (f"scoring_func={cfg.scoring_func}", cfg.scoring_func not in ("softmax", "sigmoid")),
            ("sqrtsoftplus_log1p", cfg.sqrtsoftplus_log1p),
            ("fused_gate_packed_ids", cfg.fused_gate_packed_ids),
        ]

    def topk_op_kwargs(self, layer) -> tuple[dict | None, list[str]]:
        kwargs, unsupported = super().topk_op_kwargs(layer)
        if getattr(layer, "enable_waterfill", False):
            return None, [*unsupported, "waterfill"]
        return kwargs, unsupported

    def topk_output(self, layer, topk_weights, topk_ids, router_logits):
        from sglang.srt.eplb.expert_distribution import get_global_expert_distribution_recorder
        from sglang.srt.layers.moe.topk import StandardTopKOutput, capture_routed_experts_if_allowed

        capture_routed_experts_if_allowed(layer.topk_config, layer.layer_id, topk_ids)
        get_global_expert_distribution_recorder().on_select_experts(topk_ids=topk_ids)
        return StandardTopKOutput(topk_weights, topk_ids, router_logits)


    def _pp_tp_rank_ranges(self, server_args):
        # 0.5.23 reads the widths from the published parallel context; only the node is passed.
        from sglang.srt.entrypoints.engine import _calculate_rank_ranges

        pp, tp, _, _ = _calculate_rank_ranges(server_args.node_rank)
        return pp, tp


ADAPTER = SGLang0523()
