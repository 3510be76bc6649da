"""The Triton source of `sglang_fl.kernels.gdn_qk` (imported there at the first launch, so only
hosts that run it need Triton)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    """The sum's combine, spelled here (not ``tl.sum``) so that Triton's interpreter can run the
    kernel in the CPU tests."""
    return a + b


@triton.jit
def l2norm_expand_kernel(x_ptr, out_ptr, stride_t, stride_h, heads, eps, GROUP: tl.constexpr,
                         K: tl.constexpr, BH: tl.constexpr, BK: tl.constexpr,
                         L2NORM: tl.constexpr):
    """Grid ``(tokens, cdiv(heads, BH))``: program ``(t, b)`` reads key heads
    ``[b * BH, (b + 1) * BH)`` of token ``t`` (rows of K values), normalises each in fp32 when
    L2NORM, rounds once and stores it to value heads ``h * GROUP .. h * GROUP + GROUP - 1`` of the
    contiguous output ``[tokens, heads * GROUP, K]``."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)[:, None]
    i = tl.arange(0, BK)[None, :]
    mask = (h < heads) & (i < K)
    x = tl.load(x_ptr + t * stride_t + h * stride_h + i, mask=mask, other=0.0).to(tl.float32)
    if L2NORM:
        x = x * tl.rsqrt(tl.reduce(x * x, 1, _add) + eps)[:, None]
    y = x.to(out_ptr.dtype.element_ty)
    row = out_ptr + (t * heads + h) * (GROUP * K) + i
    for j in tl.static_range(GROUP):
        tl.store(row + j * K, y, mask=mask)
