"""What sglang-fl needs from an SGLang version, and what the supported versions share.

An adapter is a plain object (one instance per version module, ``ADAPTER``). Its attributes are
SGLang hook targets and ``"module:attr"`` paths; its methods import SGLang lazily, so building
an adapter never imports SGLang. A version module subclasses `SGLangAdapter` and overrides only
what differs; everything here holds for SGLang 0.5.11 and 0.5.23 alike.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LayerRoute:
    """An SGLang layer class routed through op ``op_name``; subclasses that keep its forward
    methods (they only change e.g. the RoPE cache) are routed too."""

    class_path: str  # "module:ClassName"
    op_name: str
    #: The name users and logs know it by, where it differs from the class's own
    #: (SGLang's FLA gated norm is a class named ``RMSNorm``: ``RMSNormGated``).
    name: str = ""

    @property
    def class_name(self) -> str:
        return self.name or self.class_path.rsplit(":", 1)[1]


@dataclass(frozen=True)
class JitBuild:
    """One of SGLang's JIT CUDA modules to build ahead of a GPU run (benchmarks/jit_prebuild.py):
    ``function(*args)`` of ``module``, the cached factory that compiles it. A ``str`` argument
    names a torch dtype (``"bfloat16"``), so that listing builds never imports torch."""

    module: str
    function: str
    args: tuple = ()
    #: Also built by ``jit_prebuild.py --e2e``: what the e2e benchmark's bf16 Qwen2.5-0.5B
    #: servers build (rotary dim 64, 2 KV heads of 64).
    e2e: bool = False

    def describe(self) -> str:
        return f"{self.module.rsplit('.', 1)[-1]}.{self.function}{self.args}"


def jit_builds(module: str, function: str, *arg_sets: tuple, e2e: tuple = ()) -> tuple[JitBuild, ...]:
    """``JitBuild``s of one factory, one per argument tuple; those also in ``e2e`` are marked."""
    return tuple(JitBuild(module, function, args, e2e=args in e2e) for args in arg_sets)


@dataclass(frozen=True)
class NativeSwap:
    """A module global that SGLang hard-wires to a JIT CUDA kernel at import, rebound right
    after the module runs (ledger entries ``swap:*``, compat/swaps.py applies them)."""

    module: str
    attr: str  # the hard-wired global the module's own code calls
    native: str  # SGLang's native twin in the same module, or "" when `replacement` is given
    replacement: Any = None  # a callable used instead of a twin
    #: The package whose absence breaks SGLang's hard-wired path (the swap applies only then).
    needs: str = "tvm_ffi"
    #: SGLang binds the global only on CUDA hosts (``if _is_cuda: from ... import``): elsewhere
    #: its absence is expected, not a sign that the SGLang version moved on.
    cuda_only: bool = False


def shared_expert_gate_native(hidden_states, gate_weight, shared_output):
    """``sigmoid(hidden_states @ gate_weight) * shared_output``: the gated shared-expert output,
    as SGLang's unfused path computes it (``sigmoid(shared_expert_gate(x)) * shared_output``)."""
    import torch.nn.functional as F

    gate = F.linear(hidden_states, gate_weight.reshape(1, -1))
    return F.sigmoid(gate) * shared_output


def softcap_native(full_logits, final_logit_softcapping):
    """In place: ``cap * tanh(logits / cap)``, what SGLang's Triton ``fused_softcap`` computes
    (and its NPU branch writes in torch); returns ``full_logits`` as that kernel does."""
    cap = final_logit_softcapping
    return full_logits.div_(cap).tanh_().mul_(cap)


def shared_expert_gate_add_native(hidden_states, gate_weight, shared_output, final_hidden_states):
    """In place: ``final_hidden_states += shared_expert_gate_native(...)``."""
    final_hidden_states += shared_expert_gate_native(hidden_states, gate_weight, shared_output)


#: Where `SGLangAdapter.remember_user_choices` keeps the options the user set.
USER_CHOICES_ATTR = "_sglang_fl_user_choices"


def _jit_store_cache_unavailable(*row_bytes: int) -> bool:
    """memory_pool asks ``can_use_store_cache`` before its JIT KV-store kernel, which compiles
    through apache-tvm-ffi; without it the answer is no, and SGLang takes its own index-put path
    (the same one it takes for unsupported row sizes) without calling the tvm_ffi stand-in."""
    return False


def _answer_no() -> bool:
    """For a capability question SGLang asks of a package that is absent (the swap's ``needs``):
    no, so SGLang takes the path it takes on devices without that capability. Which questions,
    and why "no" is safe for each, is said where the adapter lists the swap."""
    return False


class SGLangAdapter:
    #: The SGLang release this adapter was written and tested against.
    version: str = ""

    # -- hook targets (SGLang's HookRegistry) --------------------------------------------------
    #: The method whose result becomes a fused-op layer's ``_forward_method`` (Layer 2).
    DISPATCH_HOOK_TARGET: str = ""
    #: Server-args dataclass init: a BEFORE hook records which options the user set (None: the
    #: version keeps the user's input itself, see `user_choices`).
    SERVER_ARGS_POST_INIT: str | None = "sglang.srt.server_args.ServerArgs.__post_init__"
    #: The first ``ServerArgs`` method that runs with the user's arguments and before SGLang
    #: reads the model: a BEFORE hook there makes the start-up checks (model path) of
    #: ``sglang_glue/startup_checks.py``.
    SERVER_ARGS_CHECK: str = "sglang.srt.server_args.ServerArgs.__post_init__"
    #: Layer 3: the collectives of this class are delegated to CommunicatorFL.
    GROUP_COORDINATOR = "sglang.srt.distributed.parallel_state.GroupCoordinator"
    #: Built by SGLang in each process that exports Prometheus metrics (``--enable-metrics``),
    #: after it set PROMETHEUS_MULTIPROC_DIR: AFTER hooks start sglang-fl's export there
    #: (``sglang_glue.metrics_export``). The scheduler's runs the model, the tokenizer's serves HTTP.
    SCHEDULER_METRICS_INIT = "sglang.srt.observability.metrics_collector.SchedulerMetricsCollector.__init__"
    TOKENIZER_METRICS_INIT = "sglang.srt.observability.metrics_collector.TokenizerMetricsCollector.__init__"

    # -- modules --------------------------------------------------------------------------------
    MODULES = {
        "hook_registry": "sglang.srt.plugins.hook_registry",
        "plugins": "sglang.srt.plugins",
        "server_args": "sglang.srt.server_args",
        "parallel_state": "sglang.srt.distributed.parallel_state",
        "platform_interface": "sglang.srt.platforms.interface",
        "platform_enum": "sglang.srt.platforms.device_mixin",
        "tokenizer_manager": "sglang.srt.managers.tokenizer_manager",
        "req_time_stats": "sglang.srt.observability.req_time_stats",
        "xgrammar_backend": "sglang.srt.constrained.xgrammar_backend",
        "http_server": "sglang.srt.entrypoints.http_server",
    }
    #: Device types whose grammar masks SGLang's xgrammar backend applies itself (any other
    #: raises "Unsupported device"; compat fix ``grammar_mask_device`` covers them).
    GRAMMAR_MASK_DEVICES: frozenset[str] = frozenset({"cuda", "xpu", "musa", "npu"})
    #: ``python -m <this>`` starts SGLang's HTTP server.
    LAUNCH_SERVER_MODULE = "sglang.launch_server"

    #: Routed class name (the op table's ``OpSpec.serves``) -> "module:Class" in this version.
    LAYER_CLASSES: dict[str, str] = {
        "SiluAndMul": "sglang.srt.layers.activation:SiluAndMul",
        "RMSNorm": "sglang.srt.layers.layernorm:RMSNorm",
        "GemmaRMSNorm": "sglang.srt.layers.layernorm:GemmaRMSNorm",
        "RotaryEmbedding": "sglang.srt.layers.rotary_embedding.base:RotaryEmbedding",
        "MRotaryEmbedding": "sglang.srt.layers.rotary_embedding.mrope:MRotaryEmbedding",
        "TopK": "sglang.srt.layers.moe.topk:TopK",
        "UnquantizedFusedMoEMethod": "sglang.srt.layers.quantization.unquant:UnquantizedFusedMoEMethod",
        "RMSNormGated": "sglang.srt.layers.attention.fla.layernorm_gated:RMSNorm",
    }
    #: Routed classes that are plain ``nn.Module``s, not fused ops: the dispatch hook never
    #: sees them, so their ``forward`` is wrapped instead (ledger ``route:RMSNormGated``).
    MODULE_ROUTES: tuple[str, ...] = ("RMSNormGated",)
    #: Methods a subclass must not override for the base's bridge to stay correct.
    FORWARD_METHODS = ("forward", "forward_native", "forward_cuda")

    #: SGLang kernels the vendor.cuda backend calls (name -> "module:attr").
    KERNELS: dict[str, str] = {
        "outplace_fused_experts":
            "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe:outplace_fused_experts",
    }

    #: Native swaps applied when apache-tvm-ffi is absent (ledger ``swap:*``).
    NATIVE_SWAPS: tuple[NativeSwap, ...] = ()
    #: Native swaps applied on the CPU platform: module globals SGLang binds to a Triton kernel
    #: that it then calls on CPU too (ledger ``swap:fused_softcap``,
    #: ``swap:fused_gate_sigmoid_mul*``). The logits processor caps the final logits of Gemma 2
    #: (``final_logit_softcapping``) with a Triton kernel on every device but NPU.
    CPU_NATIVE_SWAPS: tuple[NativeSwap, ...] = (
        NativeSwap("sglang.srt.layers.logits_processor", "fused_softcap", "", softcap_native),
    )

    # -- JIT prebuild (benchmarks/jit_prebuild.py) -----------------------------------------------
    #: SGLang's JIT CUDA modules that a GPU session builds before it measures or serves:
    #: first built inside a timed run or by several servers at once, each costs 20-30 s there.
    JIT_PREBUILD: tuple[JitBuild, ...] = ()
    #: Why `JIT_PREBUILD` is empty, where it is (printed by the prebuild, which then does nothing).
    JIT_PREBUILD_NONE_REASON = "this adapter lists no JIT kernels"
    #: The variable naming the directory where this version's JIT builds are cached.
    JIT_CACHE_DIR_ENV = "TVM_FFI_CACHE_DIR"

    #: ``TopK.forward`` keyword arguments of expert-parallel / dynamic routing that the standard
    #: ``topk`` op does not express: a call passing any of them keeps SGLang's forward.
    TOPK_CALL_EXTRAS: tuple[str, ...] = ("num_token_non_padded", "expert_location_dispatch_info")

    # -- generic access -------------------------------------------------------------------------
    def module(self, key: str):
        return importlib.import_module(self.MODULES[key])

    def resolve(self, path: str):
        return pkgutil.resolve_name(path)

    def register_hook(self, target: str, fn, kind: str) -> None:
        """``kind``: ``"before"`` / ``"after"`` / ``"around"`` (SGLang's HookType)."""
        registry = self.module("hook_registry")
        registry.HookRegistry.register(target, fn, registry.HookType[kind.upper()])

    def load_plugins(self) -> None:
        self.module("plugins").load_plugins()

    def srt_platform_class(self) -> type:
        return self.module("platform_interface").SRTPlatform

    #: SGLang's in-tree platform class per ``PlatformEnum`` name whose capability declaration
    #: PlatformFL takes over (from 0.5.23 core reads ``capabilities`` to decide on decode graph
    #: capture, Triton writers and PyNccl; the base class answers "no" to all of them).
    IN_TREE_PLATFORMS: dict[str, str] = {}

    def in_tree_capabilities(self, enum_name: str):
        """The ``capabilities`` of SGLang's own platform for ``enum_name``; None where this
        SGLang version has no such declaration."""
        target = self.IN_TREE_PLATFORMS.get(enum_name)
        return getattr(self.resolve(target), "capabilities", None) if target else None

    def replace_capabilities(self, capabilities, **changes):
        """``capabilities`` with ``changes`` (a frozen msgspec struct in 0.5.23)."""
        import msgspec

        return msgspec.structs.replace(capabilities, **changes)

    def platform_enum(self, name: str):
        return self.module("platform_enum").PlatformEnum[name]

    def set_server_args(self, **kwargs) -> None:
        """Make a global ``ServerArgs`` (what layers read outside a server), e.g. in a smoke."""
        mod = self.module("server_args")
        mod.set_global_server_args_for_scheduler(mod.ServerArgs(**kwargs))

    def ensure_server_args(self) -> None:
        """Publish SGLang's default ``ServerArgs`` where none is published: outside a server
        (``sglang-fl tune``, GPU op tests) SGLang's kernels still read it (0.5.11's fused-MoE
        config reads ``enable_deterministic_inference`` and raises without it). A published one,
        a server's, is kept."""
        mod = self.module("server_args")
        try:
            self._published_server_args()
            return
        except ValueError:
            pass
        # The declared defaults, without __post_init__: in 0.5.11 it resolves a model path.
        args = object.__new__(mod.ServerArgs)
        for f in dataclasses.fields(mod.ServerArgs):
            if f.default is not dataclasses.MISSING:
                setattr(args, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                setattr(args, f.name, f.default_factory())
        mod.set_global_server_args_for_scheduler(args)

    def _published_server_args(self):
        """The published ``ServerArgs``; ValueError where none is."""
        return self.module("server_args").get_global_server_args()

    def layer_class(self, class_name: str) -> type:
        return self.resolve(self.LAYER_CLASSES[class_name])

    def layer_routes(self, ops) -> tuple[LayerRoute, ...]:
        """The routes of the op table ``ops`` in this version."""
        return tuple(LayerRoute(self.LAYER_CLASSES[name], spec.name, name)
                     for spec in ops for name in spec.serves)

    def sglang_forward_choice(self, layer):
        """The forward SGLang itself picks for ``layer``, bypassing sglang-fl's hook (tests and
        diagnostics compare against it)."""
        return self.resolve(self.DISPATCH_HOOK_TARGET).__wrapped__(layer)

    def kernel(self, name: str):
        return self.resolve(self.KERNELS[name])

    # -- Gated DeltaNet (sglang_glue/gdn.py, ledger route:gdn-kernels) ---------------------------
    #: The kernel class SGLang's GDN backend calls on accelerators (extend/decode/packed_decode).
    GDN_KERNEL_CLASS = "sglang.srt.layers.attention.linear.kernels.gdn_triton:TritonGDNKernel"
    #: The backend module whose globals hold its gating and causal-conv1d kernels.
    GDN_BACKEND_MODULE = "sglang.srt.layers.attention.linear.gdn_backend"
    #: Whether this version's GDN backend asks its kernel class for a state snapshot
    #: (``supports_track_state_snapshot``, ``track_state`` / ``track_chunk_idx``) where the
    #: extra-buffer mamba cache tracks a prefix; without it that cache reads the per-chunk states
    #: only SGLang's own chunk kernel returns, and the prefill stays SGLang's.
    GDN_TRACK_STATE_SNAPSHOT = False

    def mamba_extra_buffer(self) -> bool:
        """Whether the server's mamba radix cache is the extra-buffer one (it tracks the chunk
        kernel's per-chunk states)."""
        from sglang.srt.server_args import get_global_server_args

        return bool(get_global_server_args().enable_mamba_extra_buffer())

    # -- radix cache -----------------------------------------------------------------------------
    #: The module whose ``resolve_tree_core_backend(name, params)`` picks the radix cache's
    #: TreeCore (``"rust"`` or ``"python"``); None where this version has one tree only (compat
    #: fix ``rust_tree_core``).
    TREE_CORE_REGISTRY: str | None = None
    #: SGLang's environment variable naming the TreeCore (the user's choice when set).
    TREE_CORE_ENV: str | None = None

    def tree_core_user_choice(self) -> str | None:
        """The TreeCore the user named through `TREE_CORE_ENV`, None when unset."""
        return None

    def rust_tree_core_insert(self, device: str = "cpu", dtype: str = "int64") -> None:
        """Insert one 3-token key, its values a ``dtype`` tensor on ``device``, into a fresh
        Rust TreeCore; raises what the core raises (versions with a TreeCore choice only)."""
        raise NotImplementedError(f"SGLang {self.version} has no Rust TreeCore")

    def rust_tree_core_problem(self, device: str = "cpu") -> str | None:
        """Why SGLang's bundled Rust TreeCore cannot serve a cache on ``device`` in this
        process, None when it can (or when this version has none)."""
        return None

    # -- server defaults -------------------------------------------------------------------------
    #: sgl_kernel CPU ops this version's Qwen3.5/3.6 model module looks up at import that empty
    #: mode does not provide: while any is listed, SGLang skips that model on CPU.
    CPU_HYBRID_MISSING_OPS: tuple[str, ...] = ()
    #: CPU server defaults of this version for hybrid (Mamba/GDN) models: option -> (value, why).
    CPU_HYBRID_DEFAULTS: dict[str, tuple[object, str]] = {}
    #: The environment variable holding the dtype of the GDN/Mamba conv state (no server option).
    MAMBA_CONV_DTYPE_ENV: str | None = "SGLANG_MAMBA_CONV_DTYPE"
    #: The server option (and value) that turns the prefill CUDA graph off (the command-line
    #: spelling; a platform default goes through `prefill_graph_off_default`).
    PREFILL_GRAPH_OFF: tuple[str, object] = ("disable_piecewise_cuda_graph", True)
    #: How a benchmark turns the prefill CUDA graph on (e2e_bench's ``NAME+pcg``): environment
    #: and server flags. Here SGLang's piecewise CUDA graph, built on torch.compile: forced on
    #: (the platform default turns it off), with sglang-fl's ops as opaque custom ops so that
    #: dynamo never traces FlagGems (docs/performance.md, "Custom ops").
    PREFILL_GRAPH_ON: tuple[tuple[tuple[str, str], ...], tuple[str, ...]] = (
        (("SGLANG_FL_CUSTOM_OPS", "1"),), ("--enforce-piecewise-cuda-graph",))
    #: The option capping the batch sizes captured by the decode CUDA graph.
    DECODE_GRAPH_MAX_BS = "cuda_graph_max_bs"
    #: Whether ServerArgs refuses speculative decoding on a recurrent-state (GDN/Mamba) model
    #: while the radix cache is on: 0.5.11 raises "not compatible with radix cache when using
    #: --mamba-scheduler-strategy no_buffer" (its default strategy) on CUDA.
    SPECULATIVE_HYBRID_NEEDS_NO_RADIX = True

    def graph_backend_problems(self, server_args) -> list[str]:
        """Why the CUDA graph backends the resolved ``server_args`` chose cannot run here (none:
        they can). Checked on CUDA after the platform defaults, so that SGLang stops at start
        with the reason, not deep in a capture."""
        return []

    def prefill_graph_off_default(self, server_args) -> tuple[str, object] | None:
        """The field (and value) a platform default writes to turn the prefill CUDA graph
        off, None when it is off already. Here the option itself: 0.5.11 applies platform
        defaults before it reads it."""
        return self.PREFILL_GRAPH_OFF

    #: Attention backends for which this version builds EAGLE/NEXTN (MTP) draft backends on CPU
    #: (its ``DraftBackendFactory`` table); none in 0.5.11, whose table is GPU/NPU kernels only.
    CPU_SPECULATIVE_ATTENTION_BACKENDS: tuple[str, ...] = ()
    #: Attention backends that can build the CPU graph state ``--enable-torch-compile`` asks
    #: for on CPU (``init_cpu_graph_state``; torch_native has none in either version).
    CPU_GRAPH_ATTENTION_BACKENDS: tuple[str, ...] = ("intel_amx",)
    #: Whether the paged KV allocator (``--page-size`` > 1) runs on CPU: 0.5.11's launches a
    #: Triton kernel for every prefill, which has no CPU driver; 0.5.23 has a native path.
    CPU_PAGED_KV: bool = False

    def remember_user_choices(self, server_args) -> None:
        """At ``ServerArgs`` construction: which options differ from their dataclass default."""
        chosen = set()
        for f in dataclasses.fields(server_args):
            if (f.default is not dataclasses.MISSING
                    and getattr(server_args, f.name, f.default) != f.default):
                chosen.add(f.name)
        object.__setattr__(server_args, USER_CHOICES_ATTR, frozenset(chosen))

    def user_choices(self, server_args) -> frozenset[str] | None:
        """The options the user set (None: unknown, e.g. a ServerArgs built before the hook)."""
        return getattr(server_args, USER_CHOICES_ATTR, None)

    # -- Layer 3 --------------------------------------------------------------------------------
    def initialize_model_parallel(self, tp_size: int = 1, pp_size: int = 1, rank: int = 0) -> None:
        """SGLang's model-parallel groups for ``tp_size`` x ``pp_size`` ranks, after
        ``init_distributed_environment`` (smoke, tests)."""
        self.module("parallel_state").initialize_model_parallel(
            tensor_model_parallel_size=tp_size, pipeline_model_parallel_size=pp_size)

    def tensor_dict_parts(self):
        """``(split_tensor_dict, TensorMetadata, P2PWork)`` of SGLang's parallel_state: how a
        tensor dict is split into metadata + tensors, and the async-send handle it returns."""
        ps = self.module("parallel_state")
        return ps._split_tensor_dict, ps.TensorMetadata, ps.P2PWork

    # -- attention backends ---------------------------------------------------------------------
    # SGLang keeps its attention backends in ``ATTENTION_BACKENDS`` (name -> factory(model_runner)),
    # checks ``--attention-backend`` against the list ``ATTENTION_BACKEND_CHOICES`` (argparse
    # choices, extended by ``add_attention_backend_choices``), and asks ``support_triton(name)`` --
    # by name, not by backend object -- whether its Triton helper kernels may run beside it.
    SUPPORT_TRITON_TARGET = "sglang.srt.utils.common.support_triton"
    ATTENTION_BACKEND_OPTIONS = ("attention_backend", "prefill_attention_backend",
                                 "decode_attention_backend")

    def attention_backend_registry(self) -> dict:
        """SGLang's own name -> factory table (module-level dict, shared by every caller)."""
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

        return ATTENTION_BACKENDS

    def add_attention_backend(self, name: str, factory) -> None:
        """Make ``name`` a backend ``--attention-backend`` accepts and the model runner builds."""
        from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

        self.attention_backend_registry()[name] = factory
        if name not in ATTENTION_BACKEND_CHOICES:
            add_attention_backend_choices([name])

    def create_sglang_attention_backend(self, name: str, model_runner):
        """One of SGLang's own attention backends, built as SGLang builds it (what a vendor
        backend delegates to; the template's example does for ``torch_native``)."""
        return self.attention_backend_registry()[name](model_runner)

    def attention_backend_base(self) -> type:
        """The class every SGLang attention backend derives from."""
        from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

        return AttentionBackend

    # -- a dead server process ------------------------------------------------------------------
    # A scheduler or detokenizer that fails sends SIGQUIT to launch_server, whose handler (this
    # method, once the server runs) kills the process tree. ``SubprocessWatchdog`` polls the
    # children each second and sends SIGQUIT for one that died without a word (SIGKILL, OOM
    # killer), but a peer that noticed the death first (a broken pipeline or collective) usually
    # wins the race, and then no line names the dead process.
    SIGQUIT_HANDLER_TARGET = ("sglang.srt.managers.tokenizer_manager.SignalHandler."
                              "running_phase_sigquit_handler")

    def cpu_omp_bind_groups(self, tp_size: int, pp_size: int = 1) -> int:
        """How many ``|``-separated core groups SGLANG_CPU_OMP_THREADS_BIND must hold: here one
        per TP rank (indexed by tp_rank; every pipeline stage reuses them)."""
        return tp_size

    def _pp_tp_rank_ranges(self, server_args):
        """(pp ranks, tp ranks) this node runs, in launch order."""
        from sglang.srt.entrypoints.engine import _calculate_rank_ranges

        pp, tp, _, _ = _calculate_rank_ranges(server_args.nnodes, server_args.pp_size,
                                              server_args.tp_size, server_args.node_rank)
        return pp, tp

    def server_children(self, signal_handler) -> list[tuple[str, object]]:
        """``(label, multiprocessing.Process)`` of each scheduler and the detokenizer, labelled
        as SGLang's watchdog labels them (``scheduler_1``), plus the stage (``PP1 TP0``) where
        one data-parallel rank runs them all in launch order (pp outer, tp inner)."""
        manager = signal_handler.tokenizer_manager
        watchdog = getattr(manager, "_subprocess_watchdog", None)
        if watchdog is None:
            return []
        names, procs = list(watchdog._names), list(watchdog._processes)
        args = manager.server_args
        if args.dp_size == 1:
            pp_ranks, tp_ranks = self._pp_tp_rank_ranges(args)
            stages = [f"PP{pp} TP{tp}" for pp in pp_ranks for tp in tp_ranks]
            names = [f"{name} ({stages[i]})" if name.startswith("scheduler_") and i < len(stages)
                     else name for i, name in enumerate(names)]
        return list(zip(names, procs, strict=True))

    # -- SGLang bug fixes (compat/fixes.py) -----------------------------------------------------
    #: Whether a clean SIGTERM stop ends with SGLang SIGKILLing launch_server itself (status -9;
    #: ledger ``fix:sigterm_exit_status``). 0.5.23 stops the children only, then exits 0.
    SIGTERM_STOP_KILLS_ITSELF: bool = False

    def request_time_stats_class(self) -> type:
        return self.module("req_time_stats").APIServerReqTimeStats

    # -- RMSNorm --------------------------------------------------------------------------------
    #: RMSNorm options the standard ``rms_norm`` op does not express; such layers stay native.
    RMSNORM_UNSUPPORTED = (
        ("variance_size_override", None),
        ("fp32_residual", False),
        ("override_orig_dtype", None),
        ("cast_x_before_out_mul", False),
    )

    def rms_norm_call_unsupported(self, layer, quant_linear) -> str | None:
        """Why this RMSNorm call must run SGLang's forward (a fused quantized output), or None.
        ``quant_linear`` is the forward's argument of that name (SGLang 0.5.23 and later)."""
        return None

    def topk_call_unsupported(self, layer, extras: dict) -> str | None:
        """Why this ``TopK.forward`` call (keyword arguments `TOPK_CALL_EXTRAS`) must run SGLang's
        forward, or None: expert-parallel dispatch (DeepEP) masks padded tokens and maps
        logical to physical expert ids, which the standard op does not."""
        if any(v is not None for v in extras.values()):
            return "calls with expert-location dispatch arguments"
        return None

    # -- MoE --------------------------------------------------------------------------------------
    # What the ``topk`` / ``fused_moe`` bridges need to know about SGLang's MoE classes: which
    # configurations the standard ops express (the others keep SGLang's forward) and how results
    # are handed back.

    def _moe_runner_backend(self):
        from sglang.srt.layers.moe import get_moe_runner_backend

        return get_moe_runner_backend()

    def _standard_topk_format(self):
        from sglang.srt.layers.moe.topk import TopKOutputFormat

        return TopKOutputFormat.STANDARD

    def _topk_config_unsupported(self, cfg) -> list[tuple[str, bool]]:
        return [("num_fused_shared_experts", cfg.num_fused_shared_experts)]

    def topk_op_kwargs(self, layer) -> tuple[dict | None, list[str]]:
        """The ``topk`` op's keyword arguments for SGLang's ``TopK`` ``layer``, or ``(None, why)``.

        ``select_experts`` picks the scoring from the route, not from ``scoring_func``: grouped
        without a correction bias is softmax (``grouped_topk``), grouped with one is sigmoid
        (``biased_grouped_topk``); ungrouped follows ``scoring_func``.
        """
        cfg = layer.topk_config
        backend = self._moe_runner_backend()
        unsupported = [name for name, bad in (
            *self._topk_config_unsupported(cfg),
            ("custom_routing_function", cfg.custom_routing_function is not None),
            ("apply_routed_scaling_factor_on_output", cfg.apply_routed_scaling_factor_on_output),
            (f"output_format={cfg.output_format}",
             cfg.output_format not in (None, self._standard_topk_format())),
            (f"moe_runner_backend={backend.value}", backend.is_triton_kernels()
             or backend.is_flashinfer_trtllm() or backend.is_flashinfer_trtllm_routed()
             or backend.is_flashinfer_mxfp4()),
        ) if bad]
        if unsupported:
            return None, unsupported
        grouped = cfg.use_grouped_topk
        if grouped:
            scoring = "softmax" if cfg.correction_bias is None else "sigmoid"
        else:
            scoring = cfg.scoring_func
        return dict(top_k=cfg.top_k, renormalize=cfg.renormalize, scoring_func=scoring,
                    correction_bias=cfg.correction_bias,
                    num_expert_group=cfg.num_expert_group if grouped else None,
                    topk_group=cfg.topk_group if grouped else None), []

    def topk_output(self, layer, topk_weights, topk_ids, router_logits):
        """What ``TopK.forward`` returns, with the bookkeeping ``select_experts`` does after its
        top-k (routed-experts capture, expert-distribution recording; no-ops unless enabled)."""
        from sglang.srt.eplb.expert_distribution import get_global_expert_distribution_recorder
        from sglang.srt.layers.moe.routed_experts_capturer import get_global_experts_capturer
        from sglang.srt.layers.moe.topk import StandardTopKOutput

        get_global_experts_capturer().capture(layer_id=layer.layer_id, topk_ids=topk_ids)
        get_global_expert_distribution_recorder().on_select_experts(topk_ids=topk_ids)
        return StandardTopKOutput(topk_weights, topk_ids, router_logits)

    def _is_npu(self) -> bool:
        from sglang.srt.utils import is_npu

        return is_npu()

    def fused_moe_unsupported(self, method, layer) -> list[str]:
        """Why ``UnquantizedFusedMoEMethod`` ``method`` of FusedMoE ``layer`` must keep SGLang's
        own forward (empty: the ``fused_moe`` op expresses it). The op takes SiLU-gated experts
        with ``w13 [E, 2I, H]`` / ``w2 [E, H, I]``, no biases, the routed weights applied after
        the down projection and summed; SGLang re-lays the weights out for some kernels (AMX
        CPUs, Ascend, triton_kernels, flashinfer), and those layers stay native too."""
        cfg = method.moe_runner_config
        runner = getattr(getattr(method, "runner", None), "runner_backend", None)
        checks = (
            (f"activation={cfg.activation}", cfg.activation != "silu"),
            ("is_gated=False", not cfg.is_gated),
            ("apply_router_weight_on_input", cfg.apply_router_weight_on_input),
            ("gemm1_alpha/gemm1_clamp_limit",
             cfg.gemm1_alpha is not None or cfg.gemm1_clamp_limit is not None),
            ("no_combine", cfg.no_combine),
            (f"routed_scaling_factor={cfg.routed_scaling_factor}",
             cfg.routed_scaling_factor not in (None, 1.0)),
            ("bias", getattr(method, "with_bias", False)),
            (f"runner={getattr(runner, 'value', runner)}", runner is None or not runner.is_triton()),
            ("flashinfer_cutlass", getattr(method, "use_flashinfer_cutlass", False)),
            ("aiter", getattr(method, "_aiter_runner", None) is not None),
            ("AMX-packed weights", getattr(layer, "use_intel_amx_backend", False)),
            ("NPU weight layout", self._is_npu()),
        )
        return [name for name, bad in checks if bad]

    def standard_routing(self, dispatch_output):
        """``(hidden_states, topk_weights, topk_ids)`` of a standard dispatch, else None."""
        from sglang.srt.layers.moe.topk import TopKOutputChecker

        topk = dispatch_output.topk_output
        if (dispatch_output.hidden_states_scale is not None
                or not TopKOutputChecker.format_is_standard(topk)):
            return None
        return dispatch_output.hidden_states, topk.topk_weights, topk.topk_ids

    def combine_input(self, hidden_states):
        from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

        return StandardCombineInput(hidden_states=hidden_states)
