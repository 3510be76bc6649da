"""SGLang's Gated DeltaNet kernel entry points, served by sglang-fl's GDN ops.

Two ways in, one per kind of platform, both ending in the op's resolved implementation:

- accelerators (`install_kernel_routes`, ledger ``route:gdn-kernels``): SGLang's GDN attention
  backend calls its ``TritonGDNKernel`` (``extend``, ``decode``, ``packed_decode``) and the
  module globals ``fused_gdn_gating`` / ``causal_conv1d_fn`` / ``causal_conv1d_update`` of
  ``gdn_backend``, bound at import to its own kernels. Those methods and globals are replaced,
  after their modules run, by the functions below, which call the ops
  ``chunk_gated_delta_rule``, ``recurrent_gated_delta_rule``,
  ``packed_recurrent_gated_delta_rule``, ``gdn_gating``, ``causal_conv1d`` and
  ``causal_conv1d_update``; so a vendor folder or FlagGems supplies them there too. A call the
  standard op cannot express (speculative verification windows, ReplaySSM rings, paged conv
  states, and on SGLang 0.5.11 the extra-buffer radix cache's per-chunk states) goes to SGLang's
  own function, logged once as ``left to SGLang``. On 0.5.23 that cache asks the kernel class
  for a state snapshot instead (``track_state``), which the routed extend writes.
- CPU (below):

On CPU, SGLang's GDN attention backend (Qwen3-Next, Qwen3.5/3.6) calls sgl_kernel's CPU build:
``sgl_kernel.mamba.causal_conv1d_fn_cpu`` / ``causal_conv1d_update_cpu`` /
``chunk_gated_delta_rule_cpu`` as functions, and ``torch.ops.sgl_kernel.fused_gdn_gating_cpu``
/ ``fused_sigmoid_gating_delta_rule_update_cpu``, which it looks up at import. In empty mode
(no sgl_kernel) the compat layer puts the functions below in their place (ledger entry
``ops:sgl_kernel-gdn-cpu``): each takes SGLang's call as it is written, checks what the standard
op cannot express, and calls the op's resolved implementation (``sglang-fl ops``), which logs
its ``[OOT-DISPATCH]`` line on the first call as a layer route does. obj is None: these ops
have no layer.
"""

from __future__ import annotations

import functools
import itertools

#: torch.library schemas of the sgl_kernel ops SGLang looks up at import (empty mode).
TORCH_OP_SCHEMAS = {
    "fused_gdn_gating_cpu": "fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, "
                            "Tensor dt_bias) -> (Tensor, Tensor)",
    "fused_sigmoid_gating_delta_rule_update_cpu": (
        "fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, "
        "Tensor k, Tensor v, Tensor a, Tensor b, Tensor(a!) initial_state_source, "
        "Tensor initial_state_indices, Tensor cu_seqlens, bool use_qk_l2norm_in_kernel=True, "
        "float softplus_beta=1.0, float softplus_threshold=20.0, float? scale=None) -> Tensor"),
}


@functools.cache
def _slot(op_name: str, entry: str):
    """The entry's slot, made on its first call (after start-up resolved the op)."""
    from sglang_fl.config import get_settings
    from sglang_fl.dispatch import get_manager

    return make_slot(get_manager(), op_name, entry, get_settings().dispatch_log)


def make_slot(manager, op_name: str, entry: str, log_path):
    """The op's routes by token count, as a layer route has them (`bridges.make_slot`): one
    impl where every token bucket resolves alike, else the bucket's own impl per call, picked
    by the op's token dimension (`OpSpec.size_arg`). Until 2026-12-06 these entries took the
    op-wide order only, so a per-bucket order (cuda.yaml's ``decode:`` / ``prefill:`` for the
    delta rule) was not served: the platform's ``prefer`` kind came first instead."""
    from sglang_fl.dispatch.ops import op_spec
    from sglang_fl.sglang_glue import bridges

    return bridges.make_slot(manager.resolve_by_size(op_name), entry, log_path, op_spec(op_name))


def _call(op_name: str, entry: str, *args):
    slot = _slot(op_name, entry)
    try:
        return slot.fn(None, *args)
    except Exception as exc:  # noqa: BLE001 - non-strict fallback to the next impl
        return slot.call_after_failure(exc, None, *args)


def _refuse_extras(entry: str, extras: dict) -> None:
    given = sorted(k for k, v in extras.items() if v is not None and v is not False)
    if given:
        raise ValueError(
            f"{entry}: {', '.join(given)} (speculative-decoding verification) is not supported by "
            f"sglang-fl's GDN ops; serve this model without speculative decoding on this platform")


def causal_conv1d_fn_cpu(x, weight, bias=None, conv_states=None, query_start_loc=None,
                         seq_lens_cpu=None, cache_indices=None, has_initial_state=None,
                         activation="silu", **extras):
    extras.pop("pad_slot_id", None)
    extras.pop("validate_data", None)
    _refuse_extras("causal_conv1d_fn_cpu", extras)
    if conv_states is None:
        raise ValueError("causal_conv1d_fn_cpu: conv_states is required (the per-slot windows)")
    return _call("causal_conv1d", "causal_conv1d_fn_cpu", x, weight, bias, conv_states,
                 query_start_loc, cache_indices, has_initial_state, activation, seq_lens_cpu)


def causal_conv1d_update_cpu(x, conv_state, weight, bias=None, activation=None,
                             cache_seqlens=None, conv_state_indices=None, **extras):
    extras.pop("pad_slot_id", None)
    extras.pop("validate_data", None)
    extras.pop("metadata", None)
    _refuse_extras("causal_conv1d_update_cpu", {"cache_seqlens": cache_seqlens, **extras})
    return _call("causal_conv1d_update", "causal_conv1d_update_cpu", x, conv_state, weight, bias,
                 activation, conv_state_indices)


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, scale=None, initial_state=None,
                               output_final_state=True, cu_seqlens=None, head_first=False,
                               use_qk_l2norm_in_kernel=False, initial_state_indices=None,
                               **extras):
    """-> (out, final_state, None): SGLang's CPU extend takes a third value (per-chunk states,
    which only its state tracking for the radix cache's extra buffer reads).

    SGLang 0.5.11 passes the sequences' states (``ssm_states[cache_indices]``) and writes the
    final ones back itself; 0.5.23 passes the whole pool with ``initial_state_indices`` and
    expects it updated in place, as the kernel's GPU twin does."""
    extras.pop("inplace_update", None)  # the CPU kernel always writes back (SGLang checks it)
    _refuse_extras("chunk_gated_delta_rule_cpu", extras)
    if head_first:
        raise ValueError("chunk_gated_delta_rule_cpu: head_first=True is not supported; "
                         "q/k/v must be [1, T, heads, dim]")
    pool = None
    if initial_state_indices is not None:
        pool, initial_state = initial_state, initial_state[initial_state_indices.long()]
    out, final = _call("chunk_gated_delta_rule", "chunk_gated_delta_rule_cpu", q, k, v, g, beta,
                       initial_state, cu_seqlens, scale, bool(use_qk_l2norm_in_kernel))
    if pool is not None:
        pool[initial_state_indices.long()] = final.to(pool.dtype)
    return out, (final if output_final_state else None), None


def fused_gdn_gating_cpu(A_log, a, b, dt_bias):  # noqa: N803 - SGLang's names
    return _call("gdn_gating", "fused_gdn_gating_cpu", A_log, a, b, dt_bias)


def fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, a, b,  # noqa: N803
                                               initial_state_source, initial_state_indices,
                                               cu_seqlens, use_qk_l2norm_in_kernel=True,
                                               softplus_beta=1.0, softplus_threshold=20.0,
                                               scale=None):
    return _call("recurrent_gated_delta_rule", "fused_sigmoid_gating_delta_rule_update_cpu",
                 q, k, v, a, b, A_log, dt_bias, initial_state_source, initial_state_indices,
                 cu_seqlens, scale, use_qk_l2norm_in_kernel, softplus_beta, softplus_threshold)


#: sgl_kernel.mamba functions SGLang's CPU path imports.
MAMBA_FUNCTIONS = {
    "causal_conv1d_fn_cpu": causal_conv1d_fn_cpu,
    "causal_conv1d_update_cpu": causal_conv1d_update_cpu,
    "chunk_gated_delta_rule_cpu": chunk_gated_delta_rule_cpu,
}
TORCH_OPS = {
    "fused_gdn_gating_cpu": fused_gdn_gating_cpu,
    "fused_sigmoid_gating_delta_rule_update_cpu": fused_sigmoid_gating_delta_rule_update_cpu,
}


# ---------------------------------------------------------------------------------------------
# Accelerators: SGLang's TritonGDNKernel and gdn_backend globals (ledger route:gdn-kernels)
# ---------------------------------------------------------------------------------------------


def _given(kwargs: dict) -> list[str]:
    """Keyword arguments that ask for more than the standard op does (None/False: not asked)."""
    return sorted(k for k, v in kwargs.items() if v is not None and v is not False)


def _left_to_sglang(entry: str, why: str) -> None:
    from sglang_fl.config import get_settings
    from sglang_fl.sglang_glue.dispatch_log import log_left_to_sglang

    log_left_to_sglang(entry, why, get_settings().dispatch_log)


@functools.cache
def _chunk_states_needed() -> bool:
    """Whether this server's mamba radix cache keeps per-chunk states (extra buffer) that only
    SGLang's chunk kernel can give: where the version's kernel class takes a state snapshot
    instead (the adapter's ``GDN_TRACK_STATE_SNAPSHOT``), the routed extend writes that."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    return not adapter.GDN_TRACK_STATE_SNAPSHOT and adapter.mamba_extra_buffer()


#: The chunk (tokens) in which SGLang counts ``track_chunk_idx``: FLA's chunk, which its GDN
#: kernels and the per-chunk state grid use.
TRACK_CHUNK = 64


def _snapshot_states(q, k, v, g, beta, states, query_start_loc, track_chunk_idx, track_state):
    """SGLang's ``track_state`` contract (its FLA chunk kernel's): for each batch row ``i``
    with ``track_chunk_idx[i] >= 0``, ``track_state[i]`` (fp32) is the row's state at the
    start of that chunk, i.e. after ``track_chunk_idx[i] * 64`` tokens of this extend. The
    extra-buffer radix cache keeps it for a prefix that does not end on the chunk grid. Here:
    one more call of the chunk op, on those prefixes, from the same initial ``states``. One
    host read of the two small index tensors; only prefills that track a prefix pay it."""
    import torch

    rows = track_chunk_idx.shape[0]
    host = torch.cat((query_start_loc.reshape(-1).to(torch.int64),
                      track_chunk_idx.reshape(-1).to(torch.int64))).tolist()
    starts, chunks = host[:rows + 1], host[rows + 1:]
    picked, spans = [], []
    for i, c in enumerate(chunks):
        if c < 0:
            continue
        length = min(c * TRACK_CHUNK, starts[i + 1] - starts[i])
        if length == 0:
            track_state[i] = states[i].float()
        else:
            picked.append(i)
            spans.append((starts[i], length))
    if not picked:
        return
    tokens = torch.cat([torch.arange(s, s + n, device=q.device) for s, n in spans])
    cu = torch.tensor([0, *itertools.accumulate(n for _, n in spans)],
                      dtype=query_start_loc.dtype, device=query_start_loc.device)
    _, final = _call("chunk_gated_delta_rule", "TritonGDNKernel.extend", q[:, tokens],
                     k[:, tokens], v[:, tokens], g[:, tokens], beta[:, tokens],
                     states[picked], cu, None, True)
    track_state[picked] = final.float()


def _routed_extend(original):
    def extend(self, q, k, v, g, beta, *, ssm_states, cache_indices, query_start_loc, **kwargs):
        if kwargs.get("inplace_update", True) is False or _chunk_states_needed():
            _left_to_sglang("TritonGDNKernel.extend", "multi-item scoring (inplace_update=False)"
                            if kwargs.get("inplace_update", True) is False else
                            "the extra-buffer mamba radix cache reads the kernel's per-chunk states")
            # (SGLang passes no track_state to these: multi-item scoring never tracks, and
            # without GDN_TRACK_STATE_SNAPSHOT the class does not ask for one.)
            return original(self, q, k, v, g, beta, ssm_states=ssm_states,
                            cache_indices=cache_indices, query_start_loc=query_start_loc, **kwargs)
        states = ssm_states[cache_indices]
        track_state, track_chunk_idx = kwargs.get("track_state"), kwargs.get("track_chunk_idx")
        if track_state is not None and track_chunk_idx is not None:
            _snapshot_states(q, k, v, g, beta, states, query_start_loc, track_chunk_idx,
                             track_state)
        out, final = _call("chunk_gated_delta_rule", "TritonGDNKernel.extend", q, k, v, g, beta,
                           states, query_start_loc, None, True)
        ssm_states[cache_indices] = final.to(ssm_states.dtype)
        return out, None, None

    return extend


def _routed_decode(original):
    def decode(self, q, k, v, a, b, *, A_log, dt_bias, ssm_states, cache_indices,  # noqa: N803
               query_start_loc, **kwargs):
        extra = _given(kwargs)
        if extra:
            _left_to_sglang("TritonGDNKernel.decode", ", ".join(extra))
            return original(self, q, k, v, a, b, A_log=A_log, dt_bias=dt_bias,
                            ssm_states=ssm_states, cache_indices=cache_indices,
                            query_start_loc=query_start_loc, **kwargs)
        return _call("recurrent_gated_delta_rule", "TritonGDNKernel.decode", q, k, v, a, b, A_log,
                     dt_bias, ssm_states, cache_indices, query_start_loc)

    return decode


def _routed_packed_decode(original):
    def packed_decode(self, mixed_qkv, a, b, *, A_log, dt_bias, scale, ssm_states,  # noqa: N803
                      cache_indices, num_v_heads, head_v_dim, **kwargs):
        extra = _given(kwargs)
        if extra:
            _left_to_sglang("TritonGDNKernel.packed_decode", ", ".join(extra))
            return original(self, mixed_qkv, a, b, A_log=A_log, dt_bias=dt_bias, scale=scale,
                            ssm_states=ssm_states, cache_indices=cache_indices,
                            num_v_heads=num_v_heads, head_v_dim=head_v_dim, **kwargs)
        return _call("packed_recurrent_gated_delta_rule", "TritonGDNKernel.packed_decode",
                     mixed_qkv, a, b, A_log, dt_bias, ssm_states, cache_indices, scale)

    return packed_decode


def _routed_gating(original):
    def fused_gdn_gating(A_log, a, b, dt_bias, *args, **kwargs):  # noqa: N803 - SGLang's names
        if args or _given(kwargs):
            _left_to_sglang("gdn_backend.fused_gdn_gating", "softplus parameters")
            return original(A_log, a, b, dt_bias, *args, **kwargs)
        return _call("gdn_gating", "gdn_backend.fused_gdn_gating", A_log, a, b, dt_bias)

    return fused_gdn_gating


def _routed_conv(original):
    def causal_conv1d_fn(x, weight, bias=None, conv_states=None, query_start_loc=None,
                         seq_lens_cpu=None, cache_indices=None, has_initial_state=None,
                         activation="silu", **kwargs):
        extra = _given(kwargs)
        if extra or conv_states is None or query_start_loc is None:
            _left_to_sglang("gdn_backend.causal_conv1d_fn",
                            ", ".join(extra) or "no per-slot conv states")
            return original(x, weight, bias, conv_states=conv_states,
                            query_start_loc=query_start_loc, seq_lens_cpu=seq_lens_cpu,
                            cache_indices=cache_indices, has_initial_state=has_initial_state,
                            activation=activation, **kwargs)
        return _call("causal_conv1d", "gdn_backend.causal_conv1d_fn", x, weight, bias, conv_states,
                     query_start_loc, cache_indices, has_initial_state, activation, seq_lens_cpu)

    return causal_conv1d_fn


def _routed_conv_update(original):
    def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, *args, **kwargs):
        indices = kwargs.pop("conv_state_indices", None)
        extra = _given(kwargs)
        if args or extra:
            _left_to_sglang("gdn_backend.causal_conv1d_update",
                            ", ".join(extra) or "positional extras")
            return original(x, conv_state, weight, bias, activation, *args,
                            conv_state_indices=indices, **kwargs)
        return _call("causal_conv1d_update", "gdn_backend.causal_conv1d_update", x, conv_state,
                     weight, bias, activation, indices)

    return causal_conv1d_update


def _routed_fused_conv_update_check(original):
    """SGLang 0.5.23 fuses the decode's QKVZ/BA unpack with the conv1d update into one kernel
    of its own when this check says eligible (CUDA; seen on the 27B shape, 2026-12-03), so
    ``causal_conv1d_update`` is never called. That kernel is SGLang's, i.e. vendor.cuda's
    family: where the op's route is vendor.cuda the fused one runs (one kernel less per layer)
    and the route is logged as taken through it; any other route (FlagGems, another vendor,
    the reference) gets the unfused path, whose conv1d update then goes through the op."""
    logged = []  # the route line is written once; the check runs per eager decode step

    def can_use_fused_qkvzba_causal_conv1d_update_contiguous(*args, **kwargs):
        eligible, why = original(*args, **kwargs)
        if not eligible:
            return eligible, why
        # Every token bucket's route counts: the fused kernel would take the calls of all.
        impls = {i.impl_id: i for i in _slot("causal_conv1d_update",
                                               "gdn_backend.causal_conv1d_update").bucket_impls}
        impl = impls.get("vendor.cuda") if len(impls) == 1 else None
        if impl is not None:
            if not logged:
                from sglang_fl.config import get_settings
                from sglang_fl.sglang_glue.dispatch_log import log_dispatch

                logged.append(impl)
                log_dispatch("gdn_backend.causal_conv1d_update",
                             f"{impl.label} (SGLang's fused QKVZ/BA unpack + conv1d update)",
                             get_settings().dispatch_log)
            return eligible, why
        return False, f"sglang-fl routes causal_conv1d_update to {', '.join(sorted(impls))}"

    return can_use_fused_qkvzba_causal_conv1d_update_contiguous


#: What `install_kernel_routes` replaces: (attribute of the kernel class, or global of the
#: backend module) -> the function making its replacement from SGLang's original.
KERNEL_METHODS = {"extend": _routed_extend, "decode": _routed_decode,
                  "packed_decode": _routed_packed_decode}
BACKEND_GLOBALS = {"fused_gdn_gating": _routed_gating, "causal_conv1d_fn": _routed_conv,
                   "causal_conv1d_update": _routed_conv_update,
                   "can_use_fused_qkvzba_causal_conv1d_update_contiguous":
                       _routed_fused_conv_update_check}
#: Globals only some versions and hosts have (`_replace` skips an absent one): the fused decode
#: check exists in 0.5.23, imported on CUDA/HIP/XPU hosts only.
OPTIONAL_BACKEND_GLOBALS = frozenset({"can_use_fused_qkvzba_causal_conv1d_update_contiguous"})


def _replace(owner, name: str, make) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "__sglang_fl_routed__", False):
        return
    routed = functools.wraps(original)(make(original))
    routed.__sglang_fl_routed__ = True
    setattr(owner, name, routed)


def install_kernel_routes(adapter) -> None:
    """Route SGLang's GDN kernel calls through the GDN ops once their modules have run (the
    adapter names the class and module; both are imported only when a hybrid model is built)."""
    from sglang_fl.compat.module_hooks import add_hook

    module_name, class_name = adapter.GDN_KERNEL_CLASS.split(":")

    def route_class(module):
        cls = getattr(module, class_name)
        for name, make in KERNEL_METHODS.items():
            _replace(cls, name, make)
        if adapter.GDN_TRACK_STATE_SNAPSHOT:  # then SGLang hands extend a snapshot buffer
            cls.supports_track_state_snapshot = True

    def route_globals(module):
        for name, make in BACKEND_GLOBALS.items():
            _replace(module, name, make)

    add_hook(module_name, after=route_class)
    add_hook(adapter.GDN_BACKEND_MODULE, after=route_globals)
