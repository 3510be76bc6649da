"""Everything that depends on the SGLang version, in one place.

SGLang 0.5.11: fused ops subclass ``MultiPlatformOp``, whose ``__init__`` stores
``self._forward_method = self.dispatch_forward()`` and whose ``forward`` calls it. We wrap
``dispatch_forward`` with an AROUND hook, so each layer instance is bound once, at construction.
The layer classes each op serves are declared in the op table (``OpSpec.serves``, paths of
this version); a version whose classes moved maps them here.
SGLang 0.5.23 replaced ``dispatch_forward`` with a lazy ``_resolve_forward_method`` on
``sglang.kernels.fused_op.BaseFusedOp``; supporting it means adding its target and layer table here.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from sglang_fl.dispatch.ops import OPS


@dataclass(frozen=True)
class LayerRoute:
    """An SGLang layer class routed through op ``op_name``; subclasses that keep its forward
    methods (they only change e.g. the RoPE cache) are routed too."""

    class_path: str  # "module:ClassName"
    op_name: str

    @property
    def class_name(self) -> str:
        return self.class_path.rsplit(":", 1)[1]


DISPATCH_HOOK_TARGET = "sglang.srt.layers.utils.multi_platform.MultiPlatformOp.dispatch_forward"

LAYER_ROUTES = tuple(LayerRoute(path, spec.name) for spec in OPS for path in spec.serves)

# Methods a subclass must not override for the base's bridge to stay correct.
FORWARD_METHODS = ("forward", "forward_native", "forward_cuda")

SUPPORTED_VERSIONS = ("0.5.11",)


def sglang_version() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


# -- MoE (SGLang 0.5.11) ------------------------------------------------------------------------
# What the ``topk`` / ``fused_moe`` bridges need to know about SGLang's MoE classes: which
# configurations the standard ops express (the others keep SGLang's forward) and how results
# are handed back.


def _moe_runner_backend():
    from sglang.srt.layers.moe import get_moe_runner_backend

    return get_moe_runner_backend()


def topk_op_kwargs(layer) -> tuple[dict | None, list[str]]:
    """The ``topk`` op's keyword arguments for SGLang's ``TopK`` ``layer``, or ``(None, why)``.

    ``select_experts`` in 0.5.11 picks the scoring from the route, not from ``scoring_func``:
    grouped without a correction bias is softmax (``grouped_topk``), grouped with one is
    sigmoid (``biased_grouped_topk``); ungrouped follows ``scoring_func``.
    """
    cfg = layer.topk_config
    backend = _moe_runner_backend()
    unsupported = [name for name, bad in (
        ("num_fused_shared_experts", cfg.num_fused_shared_experts),
        ("custom_routing_function", cfg.custom_routing_function is not None),
        ("apply_routed_scaling_factor_on_output", cfg.apply_routed_scaling_factor_on_output),
        (f"output_format={cfg.output_format}", cfg.output_format not in (None, _standard_format())),
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


def _standard_format():
    from sglang.srt.layers.moe.topk import TopKOutputFormat

    return TopKOutputFormat.STANDARD


def topk_output(layer, topk_weights, topk_ids, router_logits):
    """What ``TopK.forward`` returns, with the bookkeeping ``select_experts`` does after its
    top-k (routed-experts capture, expert-distribution recording; no-ops unless enabled)."""
    from sglang.srt.eplb.expert_distribution import get_global_expert_distribution_recorder
    from sglang.srt.layers.moe.routed_experts_capturer import get_global_experts_capturer
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    get_global_experts_capturer().capture(layer_id=layer.layer_id, topk_ids=topk_ids)
    get_global_expert_distribution_recorder().on_select_experts(topk_ids=topk_ids)
    return StandardTopKOutput(topk_weights, topk_ids, router_logits)


def fused_moe_unsupported(method, layer) -> list[str]:
    """Why ``UnquantizedFusedMoEMethod`` ``method`` of FusedMoE ``layer`` must keep SGLang's own
    forward (empty: the ``fused_moe`` op expresses it). The op takes SiLU-gated experts with
    ``w13 [E, 2I, H]`` / ``w2 [E, H, I]``, no biases, the routed weights applied after the down
    projection and summed; SGLang re-lays the weights out for some kernels (AMX CPUs, Ascend,
    triton_kernels, flashinfer), and those layers stay native too."""
    from sglang.srt.utils import is_npu

    cfg = method.moe_runner_config
    runner = getattr(getattr(method, "runner", None), "runner_backend", None)
    checks = (
        (f"activation={cfg.activation}", cfg.activation != "silu"),
        ("is_gated=False", not cfg.is_gated),
        ("apply_router_weight_on_input", cfg.apply_router_weight_on_input),
        ("gemm1_alpha/gemm1_clamp_limit", cfg.gemm1_alpha is not None or cfg.gemm1_clamp_limit is not None),
        ("no_combine", cfg.no_combine),
        (f"routed_scaling_factor={cfg.routed_scaling_factor}", cfg.routed_scaling_factor not in (None, 1.0)),
        ("bias", getattr(method, "with_bias", False)),
        (f"runner={getattr(runner, 'value', runner)}", runner is None or not runner.is_triton()),
        ("flashinfer_cutlass", getattr(method, "use_flashinfer_cutlass", False)),
        ("aiter", getattr(method, "_aiter_runner", None) is not None),
        ("AMX-packed weights", getattr(layer, "use_intel_amx_backend", False)),
        ("NPU weight layout", is_npu()),
    )
    return [name for name, bad in checks if bad]


def standard_routing(dispatch_output):
    """``(hidden_states, topk_weights, topk_ids)`` of a standard dispatch, else None."""
    from sglang.srt.layers.moe.topk import TopKOutputChecker

    topk = dispatch_output.topk_output
    if dispatch_output.hidden_states_scale is not None or not TopKOutputChecker.format_is_standard(topk):
        return None
    return dispatch_output.hidden_states, topk.topk_weights, topk.topk_ids


def combine_input(hidden_states):
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    return StandardCombineInput(hidden_states=hidden_states)


# -- attention backends (SGLang 0.5.11) ---------------------------------------------------------
# SGLang keeps its attention backends in ``ATTENTION_BACKENDS`` (name -> factory(model_runner)),
# checks ``--attention-backend`` against the list ``ATTENTION_BACKEND_CHOICES`` (argparse
# choices, extended by ``add_attention_backend_choices``), and asks ``support_triton(name)`` --
# by name, not by backend object -- whether its Triton helper kernels may run beside it.

SUPPORT_TRITON_TARGET = "sglang.srt.utils.common.support_triton"
ATTENTION_BACKEND_OPTIONS = ("attention_backend", "prefill_attention_backend",
                             "decode_attention_backend")


def attention_backend_registry() -> dict:
    """SGLang's own name -> factory table (module-level dict, shared by every caller)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    return ATTENTION_BACKENDS


def add_attention_backend(name: str, factory) -> None:
    """Make ``name`` a backend ``--attention-backend`` accepts and the model runner builds."""
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    attention_backend_registry()[name] = factory
    if name not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([name])


def create_sglang_attention_backend(name: str, model_runner):
    """One of SGLang's own attention backends, built as SGLang builds it (what a vendor backend
    delegates to; the template's example does for ``torch_native``)."""
    return attention_backend_registry()[name](model_runner)


def attention_backend_base():
    """The class every SGLang attention backend derives from."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    return AttentionBackend


# -- a dead server process (SGLang 0.5.11) ------------------------------------------------------
# A scheduler or detokenizer that fails sends SIGQUIT to launch_server, whose handler (this
# method, once the server runs) kills the process tree. ``SubprocessWatchdog`` polls the children
# each second and sends SIGQUIT for one that died without a word (SIGKILL, OOM killer), but a
# peer that noticed the death first (a broken pipeline or collective) usually wins the race, and
# then no line names the dead process.

SIGQUIT_HANDLER_TARGET = ("sglang.srt.managers.tokenizer_manager.SignalHandler."
                          "running_phase_sigquit_handler")


def server_children(signal_handler) -> list[tuple[str, object]]:
    """``(label, multiprocessing.Process)`` of each scheduler and the detokenizer, labelled as
    SGLang's watchdog labels them (``scheduler_1``), plus the stage (``PP1 TP0``) where one
    data-parallel rank runs them all in launch order (pp outer, tp inner)."""
    manager = signal_handler.tokenizer_manager
    watchdog = getattr(manager, "_subprocess_watchdog", None)
    if watchdog is None:
        return []
    names, procs = list(watchdog._names), list(watchdog._processes)
    args = manager.server_args
    if args.dp_size == 1:
        from sglang.srt.entrypoints.engine import _calculate_rank_ranges

        pp_ranks, tp_ranks, _, _ = _calculate_rank_ranges(args.nnodes, args.pp_size, args.tp_size,
                                                           args.node_rank)
        stages = [f"PP{pp} TP{tp}" for pp in pp_ranks for tp in tp_ranks]
        names = [f"{name} ({stages[i]})" if name.startswith("scheduler_") and i < len(stages)
                 else name for i, name in enumerate(names)]
    return list(zip(names, procs, strict=True))
