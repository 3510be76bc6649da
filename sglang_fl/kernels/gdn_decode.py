"""Gated DeltaNet decode on a Triton device, in place on SGLang's state pool: the
``recurrent_gated_delta_rule`` op (and the packed decode, which is the same on views) for the
``flagos`` backend.

Why it exists: FlagGems 5.0.2's fused recurrent kernel keeps states as ``[K, V]``, the pool is
``[slots, HV, V, K]``, and calls of more than 64 tokens go to another FlagGems kernel that
silently reads ``[V, K]``. Serving the pool through it took a gather of every sequence's state,
two transposes, the kernel in 64-token windows and an accumulating scatter back: on the H100
(`sglang-fl tune`, 2026-12-05, Qwen3.6 27B + 35B-A3B shapes, under a CUDA graph) 213 us at one
sequence and 3,417 us at 64, against 10 and 240 us for SGLang's kernel. For chips whose only
kernels are FlagGems', that is the whole decode step of a hybrid model.

How: one program per (sequence, value head, block of ``BV`` value rows of the ``[V, K]``
state). It loads its rows of the sequence's slot once (zeros where the slot index is negative),
runs the sequence's tokens through them in fp32 (gating, q/k l2 norm and scale fused, as the op
contract writes the recurrence) and stores them back once, in the pool's dtype, in place. No two
programs share a state element, so there is nothing to race. Nothing here syncs with the host,
and the launch depends only on the tensors' shapes: it captures in a CUDA graph. Every tensor is
described by its strides (SGLang passes q/k/v as views of one projection).

Triton is imported at the first call (`_kernel`), so this module imports without it.
"""

from __future__ import annotations

import functools

from sglang_fl.kernels import next_power_of_2

#: Value rows per program: a [32, 128] fp32 tile is 32 values per thread at 4 warps.
_BV = 32


def recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, state, state_indices,  # noqa: N803
                               cu_seqlens, scale=None, use_qk_l2norm=True, softplus_beta=1.0,
                               softplus_threshold=20.0):
    """The ``recurrent_gated_delta_rule`` op (sglang_fl/dispatch/ops.py): q, k ``[1, T, H, K]``,
    v ``[1, T, HV, V]``, a, b ``[T, HV]`` (any leading 1s), A_log and dt_bias ``[HV]``, state
    ``[slots, HV, V, K]`` updated in place at ``state_indices[n]`` for sequence n of
    ``cu_seqlens`` (None: one sequence). Returns the output ``[1, T, HV, V]`` in q's dtype."""
    import torch

    if q.dim() != 4 or q.shape != k.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"q, k [1, T, H, K] and v [1, T, HV, V] expected; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    total, heads, dk = q.shape[1], q.shape[2], q.shape[3]
    hv, dv = v.shape[2], v.shape[3]
    if state.dim() != 4 or tuple(state.shape[1:]) != (hv, dv, dk):
        raise ValueError(f"state [slots, {hv}, {dv}, {dk}] expected; got {tuple(state.shape)}")
    if hv % heads:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({heads})")
    if cu_seqlens is None:  # one sequence of every token, as the reference reads it
        cu_seqlens = torch.tensor([0, total], dtype=torch.int32, device=q.device)
    sequences = cu_seqlens.numel() - 1
    if state_indices.numel() != sequences:
        raise ValueError(f"{state_indices.numel()} state indices for {sequences} sequences")
    a2, b2 = a.reshape(total, hv), b.reshape(total, hv)
    out = torch.empty(1, total, hv, dv, dtype=q.dtype, device=q.device)
    if total == 0 or sequences <= 0:
        return out
    index = state_indices.reshape(-1)
    scale = dk ** -0.5 if scale is None else float(scale)
    bk, bv = next_power_of_2(dk), min(_BV, next_power_of_2(dv))
    grid = (sequences, hv, -(-dv // bv))
    _kernel()[grid](
        q, k, v, a2, b2, A_log.contiguous(), dt_bias.contiguous(), state, index,
        cu_seqlens.contiguous(), out,
        *q.stride()[1:], *k.stride()[1:], *v.stride()[1:], *a2.stride(), *b2.stride(),
        *state.stride(), index.stride(0), *out.stride()[1:],
        scale, float(softplus_beta), float(softplus_threshold),
        GROUP=hv // heads, K=dk, V=dv, BK=bk, BV=bv, L2NORM=bool(use_qk_l2norm), num_warps=4)
    return out


@functools.cache
def _kernel():
    from sglang_fl.kernels import gdn_decode_triton

    return gdn_decode_triton.gdn_recurrent_kernel
