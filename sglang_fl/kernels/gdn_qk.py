"""q and k for FlagGems' chunked Gated DeltaNet kernel, in one pass: L2-normalised over the head
dimension (fp32 math, rounded once to the input's dtype) and expanded from the key heads to the
value heads (value head ``i`` reads key head ``i // (HV // H)``). The prologue of the ``flagos``
backend's ``chunk_gated_delta_rule``.

Why it exists: FlagGems 5.0.2's FLA chunk kernel takes q and k already normalised and with as
many heads as v; SGLang's kernel normalises inside and reads the key heads as they are. In
PyTorch the prologue was a float copy, four element-wise kernels and a reduction per tensor, a
rounding back and a ``repeat_interleave``: some sixteen eager kernels and about 1.3 GB of memory
traffic per call at 8,192 tokens of Qwen3.6-27B's GDN layer (16 key heads of 128 dims, 48 value
heads). This reads each row once and writes its expanded copies once: 628 -> 74 us there on the
H200, the op 1.39x -> 1.03x SGLang's kernel, and FlagGems-only's served 27B-shape prefill from
0.95 of SGLang's kernels (H100) to parity (H200; docs/performance.md, 2026-12-07).

Triton is imported at the first call (`_kernel`), so this module imports without it.
"""

from __future__ import annotations

import functools
import types

import torch

from sglang_fl.kernels import next_power_of_2
from sglang_fl.kernels.launch import launch

_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
#: Elements one program holds at most: a token's heads in blocks of this many values.
_BLOCK_ELEMENTS = 4096
#: The widest head one program takes whole (Qwen3.6's GDN heads have 128 dims).
MAX_HEAD_DIM = 1024


def supports(x, heads_out: int) -> bool:
    """Whether `l2norm_expand` takes ``x``: ``[1, T, H, K]`` in fp16/bf16/fp32 on a device,
    contiguous along K (any stride between tokens and heads), K at most `MAX_HEAD_DIM`, and
    ``heads_out`` a multiple of H."""
    return (x.dim() == 4 and x.shape[0] == 1 and x.dtype in _DTYPES and x.device.type != "cpu"
            and x.shape[-1] <= MAX_HEAD_DIM and x.stride(-1) == 1 and x.shape[2] > 0
            and heads_out % x.shape[2] == 0)


def l2norm_expand(x, heads_out: int, l2norm: bool = True, eps: float = 1e-6):
    """``[1, T, H, K] -> [1, T, heads_out, K]``, contiguous, in ``x``'s dtype: each row
    ``x * rsqrt(sum(x^2) + eps)`` in fp32 (or ``x`` as it is, without ``l2norm``), rounded once,
    written to its ``heads_out // H`` value heads. Call only where `supports` says yes."""
    _, tokens, heads, dim = x.shape
    out = torch.empty(1, tokens, heads_out, dim, dtype=x.dtype, device=x.device)
    if tokens:
        block_h, meta = _geometry(heads, dim, heads_out // heads, bool(l2norm))
        launch(_kernel(), (tokens, -(-heads // block_h)),
               (x, out, x.stride(1), x.stride(2), heads, float(eps)), meta)
    return out


@functools.lru_cache(maxsize=64)
def _geometry(heads: int, dim: int, group: int, l2norm: bool):
    """Heads per program and the launch's meta (one mapping per geometry: `launch` keys on it)."""
    block_k = next_power_of_2(dim)
    block_h = min(next_power_of_2(heads), max(1, _BLOCK_ELEMENTS // block_k))
    warps = max(1, min(8, block_h * block_k // 512))
    return block_h, types.MappingProxyType(dict(GROUP=group, K=dim, BH=block_h, BK=block_k,
                                                L2NORM=l2norm, num_warps=warps))


@functools.cache
def _kernel():
    from sglang_fl.kernels import gdn_qk_triton

    return gdn_qk_triton.l2norm_expand_kernel
