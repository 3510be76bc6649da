"""The Triton source of `sglang_fl.kernels.gemma_norm` (imported there at the first launch, so
only hosts that run it need Triton). Each program loads its whole row before it stores into it,
so the in-place writes never race."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    """The combine of the row's sum of squares: what ``tl.sum`` reduces with, spelled here so
    that Triton's interpreter (the CPU tests, which import the kernel after triton.language)
    can run it."""
    return a + b


@triton.jit
def gemma_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, n, x_stride, res_stride, out_stride,
                          eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    """Grid ``(rows,)``: row ``r`` of ``x`` (plus, with a residual, row ``r`` of ``res``, added
    in x's dtype and stored back into ``res``) normalised in fp32 and scaled by
    ``1 + w`` in fp32, stored in x's dtype into ``out``."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + row * x_stride + i, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + i, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_ptr + row * res_stride + i, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.reduce(xf * xf, 0, _add) / n + eps)
    w = tl.load(w_ptr + i, mask=mask, other=0.0).to(tl.float32) + 1.0
    tl.store(out_ptr + row * out_stride + i, (xf * rstd * w).to(out_ptr.dtype.element_ty),
             mask=mask)
