"""The Triton source of `sglang_fl.kernels.rope` (imported there at the first launch, so only
hosts that run it need Triton). See that module for the design; the invariant to keep when
editing: each program loads both inputs of every pair it owns before storing that pair, and
owns every pair it loads.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotate_tile(x_ptr, stride_h, stride_d, heads, head0, cos, sin,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """Rotate heads ``[head0, head0 + BLOCK_HEADS)`` of one token (``x_ptr``) in place."""
    h = head0 + tl.arange(0, BLOCK_HEADS)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < heads) & (i < HALF)
    if INTERLEAVED:
        d1 = 2 * i
        d2 = 2 * i + 1
    else:
        d1 = i
        d2 = i + HALF
    p1 = x_ptr + h.to(tl.int64) * stride_h + d1 * stride_d
    p2 = x_ptr + h.to(tl.int64) * stride_h + d2 * stride_d
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    tl.store(p1, out1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(p2, out2.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_inplace_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr,
                        q_stride_t, q_stride_h, q_stride_d, k_stride_t, k_stride_h, k_stride_d,
                        pos_stride, cos_stride_p, cos_stride_d, sin_stride_p, sin_stride_d,
                        q_heads, k_heads, q_blocks,
                        HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                        BLOCK_HEADS: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Grid ``(tokens, q_blocks + k_blocks)``: program ``(t, b)`` rotates block ``b`` of the
    q heads of token ``t``, or block ``b - q_blocks`` of its k heads."""
    token = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    pos = tl.load(pos_ptr + token * pos_stride).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(cos_ptr + pos * cos_stride_p + i * cos_stride_d, mask=i < HALF,
                  other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * sin_stride_p + i * sin_stride_d, mask=i < HALF,
                  other=0.0).to(tl.float32)
    if block < q_blocks:
        _rotate_tile(q_ptr + token * q_stride_t, q_stride_h, q_stride_d, q_heads,
                     block * BLOCK_HEADS, cos, sin, HALF, BLOCK_HALF, BLOCK_HEADS, INTERLEAVED)
    else:
        _rotate_tile(k_ptr + token * k_stride_t, k_stride_h, k_stride_d, k_heads,
                     (block - q_blocks) * BLOCK_HEADS, cos, sin, HALF, BLOCK_HALF, BLOCK_HEADS,
                     INTERLEAVED)
