"""SGLang's CPU Gated DeltaNet kernel entry points, served by sglang-fl's GDN ops.

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
    from sglang_fl.config import get_settings
    from sglang_fl.dispatch import get_manager
    from sglang_fl.sglang_glue.bridges import ImplSlot

    return ImplSlot(get_manager().resolve(op_name), entry, get_settings().dispatch_log)


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
                 query_start_loc, cache_indices, has_initial_state, activation)


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
