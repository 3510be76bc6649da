"""Gemma-style RMSNorm (scaled by ``1 + weight`` in fp32), with or without a residual added
first, on a Triton device: the ``gemma_rms_norm`` op for the ``flagos`` backend.

Why it exists: FlagGems 5.0.2 has no Gemma norm, so the backend formed ``weight.float() + 1``
on every call and ran FlagGems' plain norm with it: two extra kernels per norm, also inside
CUDA-graph decode, where Qwen3.5/3.6 run four or more such norms per layer (the Qwen3.6 shapes'
FlagGems-only decode was 0.94-0.98x of SGLang's kernels on the H200, 2026-12-05). The weight
cannot be formed once: nothing tells a backend when a weight loader rewrites it. This kernel
reads the checkpoint's weight and adds the 1 itself, one launch per norm, and follows
``GemmaRMSNorm.forward_native``: the residual add in x's dtype (stored into ``residual``, as
SGLang's fused kernels do), the normalisation and the scale in fp32, one rounding at the end.

Triton is imported at the first call (`_kernel`), so this module imports without it.
"""

from __future__ import annotations

import functools

import torch

from sglang_fl.kernels import next_power_of_2

_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: The widest row one program takes whole (Qwen3.6-27B's hidden is 5120).
MAX_HIDDEN = 16384


def supports(x, weight, residual=None) -> bool:
    """Whether `gemma_rms_norm` takes ``x``, ``weight`` and ``residual``: fp16/bf16/fp32 rows of
    at most `MAX_HIDDEN` channels, contiguous along the row, 2-D or viewable as 2-D, on a
    device, with a contiguous weight of one value per channel."""
    n = x.shape[-1]
    if x.dtype not in _DTYPES or x.device.type == "cpu" or n > MAX_HIDDEN:
        return False
    if weight.dtype not in _DTYPES or weight.shape != (n,) or weight.stride(0) != 1:
        return False
    if x.stride(-1) != 1 or (x.dim() != 2 and not x.is_contiguous()):
        return False
    return residual is None or (residual.shape == x.shape and residual.dtype == x.dtype
                                and residual.is_contiguous())


def gemma_rms_norm(x, weight, eps: float, residual=None):
    """``x * rsqrt(mean(x^2) + eps) * (1 + weight)``; with ``residual``, ``x + residual`` (in
    x's dtype) first, written into ``residual``, and the normed rows written into ``x``:
    returns ``(x, residual)``; without, a new tensor. Call only where `supports` says yes."""
    n = x.shape[-1]
    rows = x if x.dim() == 2 else x.view(-1, n)
    res = None if residual is None else residual.view(-1, n)
    out = rows if res is not None else torch.empty_like(rows)
    if rows.shape[0] and n:
        block, warps = _geometry(n)
        _kernel()[(rows.shape[0],)](
            rows, rows if res is None else res, weight, out, n, rows.stride(0),
            0 if res is None else res.stride(0), out.stride(0), eps,
            HAS_RESIDUAL=res is not None, BLOCK=block, num_warps=warps)
    if residual is not None:
        return x, residual
    return out if x.dim() == 2 else out.view(x.shape)


@functools.lru_cache(maxsize=64)
def _geometry(n: int) -> tuple[int, int]:
    """The row's block and warps: 8 elements per thread, 1 to 16 warps."""
    block = next_power_of_2(n)
    return block, max(1, min(16, block // 256))


@functools.cache
def _kernel():
    from sglang_fl.kernels import gemma_norm_triton

    return gemma_norm_triton.gemma_rms_norm_kernel
