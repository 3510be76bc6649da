"""RMSNorm and Gemma-style RMSNorm (scaled by ``1 + weight``), with or without a residual
added first, on a Triton device: the ``rms_norm`` and ``gemma_rms_norm`` ops for the ``flagos``
backend. One kernel (`rms_norm_triton.rms_norm_kernel`) serves both.

Why it exists:
- ``rms_norm``: FlagGems 5.0.2's ``rms_norm`` / ``fused_add_rms_norm`` cost 114-130 us of host
  time per eager call on the H100 hosts (SGLang's: 44-54 us; docs/performance.md), about 49
  calls per prefill forward of a 24-layer model, the largest FlagGems-only prefill gap left
  once SiLU-and-mul and RoPE were sglang-fl's own. Its fused add also takes only two inputs, so
  ``post_residual_addition`` cost a three-way sum and a split before it (`residual_sum_parts`);
  this kernel adds the third input itself.
- ``gemma_rms_norm``: FlagGems has no Gemma norm, so the backend formed ``weight.float() + 1``
  on every call: two extra kernels per norm, also inside CUDA-graph decode, where Qwen3.5/3.6
  run four or more such norms per layer. The weight cannot be formed once (nothing tells a
  backend when a weight loader rewrites it): the kernel adds the 1 itself.

Numerics follow SGLang's fused CUDA kernels (``fused_add_rmsnorm``, ``gemma_fused_add_rmsnorm``,
what SGLang itself serves on CUDA): ``x + residual (+ post)`` is added in fp32, its rounding to
x's dtype stored as the new residual, and the fp32 sum normalised. (``GemmaRMSNorm.forward_native``
and HF normalise the rounded sum instead: one bf16 rounding more per norm, which
`tests/gpu/test_precision_parity.py` would count against this kernel.) Normalisation and scale
are in fp32, rounded once at the end. Like SGLang's fused kernels,
a residual call writes the normed rows into ``x`` and the sum into ``residual`` (into a new
tensor where ``post_residual_addition`` is given, as SGLang adds that to a new residual first).

Triton is imported at the first call (`_kernel`), so this module imports without it.
"""

from __future__ import annotations

import functools
import types

import torch

from sglang_fl.kernels import next_power_of_2
from sglang_fl.kernels.launch import launch

_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: The widest row one program takes whole (Qwen3.6-27B's hidden is 5120).
MAX_HIDDEN = 16384


def supports(x, weight, residual=None, post_residual_addition=None) -> bool:
    """Whether the kernel takes these: fp16/bf16/fp32 rows of at most `MAX_HIDDEN` channels,
    contiguous along the row and not overlapping, 2-D or viewable as 2-D, on a device, with a
    contiguous weight of one value per channel, and a residual (and post-residual addition) of
    x's shape and dtype, contiguous; all on x's device."""
    n = x.shape[-1]
    if x.dtype not in _DTYPES or x.device.type == "cpu" or n > MAX_HIDDEN:
        return False
    if weight.dtype not in _DTYPES or weight.shape != (n,) or weight.stride(0) != 1:
        return False
    if x.stride(-1) != 1 or (x.dim() != 2 and not x.is_contiguous()):
        return False
    if x.dim() == 2 and x.shape[0] > 1 and x.stride(0) < n:  # rows that overlap (expand)
        return False
    if weight.device != x.device:
        return False
    return all(t is None or (t.shape == x.shape and t.dtype == x.dtype and t.is_contiguous()
                             and t.device == x.device)
               for t in (residual, post_residual_addition))


def rms_norm(x, weight, eps: float, residual=None, post_residual_addition=None):
    """SGLang's ``RMSNorm``: ``x * rsqrt(mean(x^2) + eps) * weight``. Without ``residual``, a
    new tensor. With it, ``x + residual (+ post_residual_addition)`` in fp32 is normalised:
    returns ``(x, sum)``, the normed rows written into ``x`` and the sum, rounded to x's dtype,
    into ``residual`` (into a new tensor with ``post_residual_addition``). Call only where
    `supports` says yes."""
    return _norm(x, weight, eps, residual, post_residual_addition, gemma=False)


def gemma_rms_norm(x, weight, eps: float, residual=None):
    """SGLang's ``GemmaRMSNorm``: ``x * rsqrt(mean(x^2) + eps) * (1 + weight)``; with
    ``residual``, ``x + residual`` in fp32 first, normalised, its rounding to x's dtype written
    into ``residual`` (x + residual in x's dtype, as forward_native) and the normed rows into
    ``x``: returns ``(x, residual)``; without, a new tensor. Call only where `supports` says
    yes."""
    return _norm(x, weight, eps, residual, None, gemma=True)


def _norm(x, weight, eps, residual, post, gemma):
    n = x.shape[-1]
    rows = x if x.dim() == 2 else x.view(-1, n)
    res = None if residual is None else residual.view(-1, n)
    if res is None:
        out = torch.empty_like(rows)
        res_out = None
    else:
        out = rows
        res_out = res if post is None else torch.empty_like(res)
    if rows.shape[0] and n:
        pst = None if post is None else post.view(-1, n)
        launch(_kernel(), (rows.shape[0],), (
            rows, rows if res is None else res, rows if pst is None else pst, weight, out,
            out if res_out is None else res_out, n, rows.stride(0),
            0 if res is None else res.stride(0), 0 if pst is None else pst.stride(0),
            out.stride(0), 0 if res_out is None else res_out.stride(0), eps),
            _meta(n, res is not None, pst is not None, gemma))
    if residual is None:
        return out if x.dim() == 2 else out.view(x.shape)
    return x, (residual if post is None else res_out.view(residual.shape))


@functools.lru_cache(maxsize=256)
def _meta(n: int, residual: bool, post: bool, gemma: bool):
    """The launch's constexprs and options, one mapping per case (`launch` keys on it): the
    whole row in one block, 8 elements per thread, 1 to 16 warps."""
    block = next_power_of_2(n)
    return types.MappingProxyType(dict(HAS_RESIDUAL=residual, HAS_POST=post, GEMMA=gemma,
                                       BLOCK=block, num_warps=max(1, min(16, block // 256))))


@functools.cache
def _kernel():
    from sglang_fl.kernels import rms_norm_triton

    return rms_norm_triton.rms_norm_kernel
