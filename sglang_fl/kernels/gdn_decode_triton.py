"""The Triton source of `sglang_fl.kernels.gdn_decode` (imported there at the first launch, so
only hosts that run it need Triton). See that module for the design; the invariant to keep when
editing: a program owns one (sequence, value head, block of value rows) and is the only one that
reads or writes those rows of that sequence's state slot.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    """The combine of the sums here: what ``tl.sum`` reduces with, spelled here so that
    Triton's interpreter (the CPU tests, which import the kernel after triton.language) can run
    it; ``tl.sigmoid`` is written out for the same reason."""
    return a + b


# No argument is a batch size (the sequences are the grid, the tokens come from cu_seqlens on
# the device), so one compiled variant serves every batch of a layer shape.
@triton.jit
def gdn_recurrent_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr,
                         state_ptr, index_ptr, cu_ptr, out_ptr,
                         q_st, q_sh, q_sk, k_st, k_sh, k_sk, v_st, v_sh, v_sv,
                         a_st, a_sh, b_st, b_sh, s_slot, s_h, s_v, s_k, index_stride,
                         o_st, o_sh, o_sv,
                         scale, softplus_beta, softplus_threshold,
                         GROUP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                         BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr):
    """Grid ``(sequences, value heads, cdiv(V, BV))``: program (n, hv, vb) runs sequence n's
    tokens through rows ``[vb * BV, vb * BV + BV)`` of value head hv's state ``[V, K]``."""
    n = tl.program_id(0)
    hv = tl.program_id(1)
    vb = tl.program_id(2)
    h = hv // GROUP  # the key head value head hv reads
    rk = tl.arange(0, BK)
    rv = vb * BV + tl.arange(0, BV)
    mk = rk < K
    mv = rv < V
    bos = tl.load(cu_ptr + n).to(tl.int64)
    eos = tl.load(cu_ptr + n + 1).to(tl.int64)
    slot = tl.load(index_ptr + n * index_stride).to(tl.int64)
    live = slot >= 0  # a negative index: start from zeros, write nothing
    m2 = (mv[:, None] & mk[None, :]) & live
    s_ptrs = (state_ptr + tl.maximum(slot, 0) * s_slot + hv * s_h
              + rv[:, None] * s_v + rk[None, :] * s_k)
    S = tl.load(s_ptrs, mask=m2, other=0.0).to(tl.float32)
    decay_rate = -tl.exp(tl.load(a_log_ptr + hv).to(tl.float32))
    dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    t = bos
    while t < eos:
        q = tl.load(q_ptr + t * q_st + h * q_sh + rk * q_sk, mask=mk, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + t * k_st + h * k_sh + rk * k_sk, mask=mk, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + t * v_st + hv * v_sh + rv * v_sv, mask=mv, other=0.0).to(tl.float32)
        # Gating as the gdn_gating op: g = -exp(A_log) softplus(a + dt_bias) (torch's softplus
        # with beta and threshold), beta = sigmoid(b) rounded to b's dtype.
        x = tl.load(a_ptr + t * a_st + hv * a_sh).to(tl.float32) + dt_bias
        bx = x * softplus_beta
        softplus = tl.where(bx > softplus_threshold, x,
                            tl.log(1.0 + tl.exp(tl.minimum(bx, softplus_threshold))) / softplus_beta)
        g = decay_rate * softplus
        b = tl.load(b_ptr + t * b_st + hv * b_sh)
        beta = (1.0 / (1.0 + tl.exp(-b.to(tl.float32)))).to(b_ptr.dtype.element_ty).to(tl.float32)
        if L2NORM:  # eps under the root, as the reference's l2norm
            q = q / tl.sqrt(tl.reduce(q * q, 0, _add) + 1e-6)
            k = k / tl.sqrt(tl.reduce(k * k, 0, _add) + 1e-6)
        q = q * scale
        S = S * tl.exp(g)
        delta = (v - tl.reduce(S * k[None, :], 1, _add)) * beta
        S = S + delta[:, None] * k[None, :]
        o = tl.reduce(S * q[None, :], 1, _add)
        tl.store(out_ptr + t * o_st + hv * o_sh + rv * o_sv, o.to(out_ptr.dtype.element_ty),
                 mask=mv)
        t += 1
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=m2)
