"""The Triton source of `sglang_fl.kernels.silu_mul` (imported there at the first launch, so
only hosts that run it need Triton)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, d, x_stride_t, out_stride_t, BLOCK: tl.constexpr):
    """Grid ``(tokens, cdiv(d, BLOCK))``: program ``(t, b)`` writes channels
    ``[b * BLOCK, (b + 1) * BLOCK)`` of token ``t``: ``silu(gate) * up`` in fp32, where gate
    and up are the first and second halves of ``x``'s row."""
    token = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = i < d
    row = x_ptr + token * x_stride_t
    gate = tl.load(row + i, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + d + i, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + token * out_stride_t + i, out.to(out_ptr.dtype.element_ty), mask=mask)
