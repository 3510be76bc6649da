"""The Triton source of `sglang_fl.kernels.rope` (imported there at the first launch, so only
hosts that run it need Triton). See that module for the design; the invariant to keep when
editing: each program loads both inputs of every pair it owns before storing that pair, and
owns every pair it loads.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rotate_rows(x_ptr, stride_t, stride_h, stride_d, heads, rows, row0,
                 cos_ptr, sin_ptr, pos_ptr, pos_stride,
                 cos_stride_p, cos_stride_d, sin_stride_p, sin_stride_d,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    """Rotate rows ``[row0, row0 + BLOCK_ROWS)`` of ``x`` in place, row ``r`` being head
    ``r % heads`` of token ``r // heads``, each with its own position's cos/sin."""
    r = row0 + tl.arange(0, BLOCK_ROWS)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    live = r < rows
    mask = live & (i < HALF)
    t = r // heads
    h = r - t * heads
    pos = tl.load(pos_ptr + t * pos_stride, mask=live, other=0).to(tl.int64)
    cos = tl.load(cos_ptr + pos * cos_stride_p + i * cos_stride_d, mask=mask,
                  other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * sin_stride_p + i * sin_stride_d, mask=mask,
                  other=0.0).to(tl.float32)
    if INTERLEAVED:
        d1 = 2 * i
        d2 = 2 * i + 1
    else:
        d1 = i
        d2 = i + HALF
    row = x_ptr + t * stride_t + h * stride_h
    p1 = row + d1 * stride_d
    p2 = row + d2 * stride_d
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    tl.store(p1, out1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(p2, out2.to(x_ptr.dtype.element_ty), mask=mask)


# The row counts change with every batch: specialising on them (==1, %16) would compile a new
# variant for batch sizes that differ only in divisibility.
@triton.jit(do_not_specialize=["q_rows", "k_rows", "q_blocks"])
def rope_inplace_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr,
                        q_stride_t, q_stride_h, q_stride_d, k_stride_t, k_stride_h, k_stride_d,
                        pos_stride, cos_stride_p, cos_stride_d, sin_stride_p, sin_stride_d,
                        q_heads, k_heads, q_rows, k_rows, q_blocks,
                        HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                        BLOCK_ROWS: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Grid ``(q_blocks + k_blocks,)``: program ``b`` rotates the ``b``-th block of
    ``BLOCK_ROWS`` (token, head) rows of q, or block ``b - q_blocks`` of k's."""
    block = tl.program_id(0).to(tl.int64)
    if block < q_blocks:
        _rotate_rows(q_ptr, q_stride_t, q_stride_h, q_stride_d, q_heads, q_rows,
                     block * BLOCK_ROWS, cos_ptr, sin_ptr, pos_ptr, pos_stride,
                     cos_stride_p, cos_stride_d, sin_stride_p, sin_stride_d,
                     HALF, BLOCK_HALF, BLOCK_ROWS, INTERLEAVED)
    else:
        _rotate_rows(k_ptr, k_stride_t, k_stride_h, k_stride_d, k_heads, k_rows,
                     (block - q_blocks) * BLOCK_ROWS, cos_ptr, sin_ptr, pos_ptr, pos_stride,
                     cos_stride_p, cos_stride_d, sin_stride_p, sin_stride_d,
                     HALF, BLOCK_HALF, BLOCK_ROWS, INTERLEAVED)
