"""``silu(x[..., :d]) * x[..., d:]`` on a Triton device: the ``silu_and_mul`` op for the
``flagos`` backend.

Why it exists: FlagGems 5.0.2's ``silu_and_mul(a, b)`` takes the two halves as separate
(strided) tensors and goes through its generic pointwise code path, which on the H100
(2026-12-05, benchmarks/op_bench.py and the prefill profile in docs/performance.md) cost
~145 us per eager call whatever the size (sgl-kernel: ~22 us) and 288 us of host time per call
inside a prefill forward, the largest single gap between FlagGems-only and SGLang's kernels in
eager prefill; under a CUDA graph its kernel also ran at 0.4-0.77x of sgl-kernel's. This one
reads the fused row directly, one program per (token, block of channels), in fp32 like
SGLang's own kernels, and is launched with one plain Triton call.

Triton is imported at the first call (`_kernel`), so this module imports without it.
"""

from __future__ import annotations

import functools
import types

import torch

from sglang_fl.kernels import next_power_of_2
from sglang_fl.kernels.launch import launch

#: The dtypes the kernel computes as SGLang's does (in fp32, rounded once); others go to FlagGems.
_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})

#: Channels per program: 8 per thread at 4 warps (one 16-byte load per half at bf16).
_BLOCK = 1024


def silu_and_mul(x):
    """``[..., 2d] -> [..., d]``, in ``x``'s dtype. ``x``'s last dimension must be contiguous
    (any stride between rows): `supports` says whether this kernel can take ``x``."""
    d = x.shape[-1] // 2
    flat = x.dim() == 2  # what SGLang passes: no view to make on the hot path
    rows = x if flat else x.reshape(-1, x.shape[-1])
    out = torch.empty(rows.shape[0], d, dtype=x.dtype, device=x.device)
    if rows.shape[0] and d:
        block, meta = _geometry(d)
        launch(_kernel(), (rows.shape[0], -(-d // block)), (rows, out, d, rows.stride(0), d), meta)
    return out if flat else out.view(*x.shape[:-1], d)


def supports(x) -> bool:
    """Whether `silu_and_mul` takes ``x``: fp16/bf16/fp32, an even last dimension, contiguous,
    on a device (the backend's: FlagGems' device, on which Triton launches)."""
    return (x.dtype in _DTYPES and x.device.type != "cpu" and x.shape[-1] % 2 == 0
            and x.stride(-1) == 1)


@functools.lru_cache(maxsize=64)
def _geometry(d: int):
    """Channels per program and the launch's meta (one mapping per width: `launch` keys on
    it), for rows of ``2 * d``."""
    block = min(_BLOCK, next_power_of_2(d))
    return block, types.MappingProxyType(dict(BLOCK=block, num_warps=max(1, min(4, block // 256))))


@functools.cache
def _kernel():
    from sglang_fl.kernels import silu_mul_triton

    return silu_mul_triton.silu_and_mul_kernel
