"""The Triton source of `sglang_fl.kernels.rms_norm` (imported there at the first launch, so
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
def rms_norm_kernel(x_ptr, res_ptr, post_ptr, w_ptr, out_ptr, res_out_ptr, n, x_stride,
                    res_stride, post_stride, out_stride, res_out_stride, eps,
                    HAS_RESIDUAL: tl.constexpr, HAS_POST: tl.constexpr, GEMMA: tl.constexpr,
                    BLOCK: tl.constexpr):
    """Grid ``(rows,)``: row ``r`` of ``x``, normalised in fp32 and scaled by ``w`` (``GEMMA``:
    by ``1 + w``) in fp32, stored in x's dtype into ``out``.

    With a residual, row ``r`` of ``res`` (and ``post``) is added first in fp32, the sum's
    rounding to x's dtype stored into ``res_out``, and the fp32 sum normalised: what SGLang's
    fused CUDA kernels do for RMSNorm and GemmaRMSNorm alike (``forward_native`` of the Gemma
    norm normalises the rounded sum, one bf16 rounding more)."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + row * x_stride + i, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + i, mask=mask, other=0.0)
        xf = xf + r.to(tl.float32)
        if HAS_POST:
            p = tl.load(post_ptr + row * post_stride + i, mask=mask, other=0.0)
            xf = xf + p.to(tl.float32)
        tl.store(res_out_ptr + row * res_out_stride + i, xf.to(x_ptr.dtype.element_ty),
                 mask=mask)
    rstd = 1.0 / tl.sqrt(tl.reduce(xf * xf, 0, _add) / n + eps)
    w = tl.load(w_ptr + i, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = w + 1.0
    tl.store(out_ptr + row * out_stride + i, (xf * rstd * w).to(out_ptr.dtype.element_ty),
             mask=mask)
