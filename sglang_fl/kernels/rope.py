"""In-place rotary embedding (RoPE) on a Triton device: the ``rotary_embedding`` op's
``inplace=True`` case for the ``flagos`` backend.

Why it exists: FlagGems 5.0.2's in-place ``apply_rotary_pos_emb`` has each lane load its element
and its rotation partner and store its element, with no barrier between one warp's loads and
another warp's stores, so a partner is sometimes read after it was overwritten (H200: 55 of 300
calls wrong at fp16, 1024 tokens, head 128; tools/repro_flaggems_rope_race.py). Its
out-of-place kernel is exact, but out of place + a copy back costs 1.25-1.9x per call under a
CUDA graph (docs/performance.md). This kernel is in place and race-free by construction: every
element is read once and written once by the same program, and a pair's two outputs are stored
only after both of its inputs were loaded (the compat ledger entry ``flaggems:rope-inplace``
says when it can go).

How: the (token, head) rows of q, then of k, are cut into blocks of `_TILE` // (rotary_dim / 2)
rows, one program per block, each row rotated with its own token's position. (Until 2026-12-05
a program took one token's heads; on Qwen2.5-0.5B's 14 q / 2 k heads of 64 that made eight
one-warp programs per token, 28 us per prefill call of 16,384 tokens against SGLang's 5.5 us on
the H200: 87 % of FlagGems-only prefill's extra GPU time.) A program loads the ``x1`` and ``x2``
halves of every rotation pair of its tile (NeoX: channels ``i`` and ``i + rotary_dim // 2``;
GPT-J: ``2i`` and ``2i + 1``) as two tiles of the same shape, computes
``x1 cos - x2 sin`` and ``x2 cos + x1 sin`` in fp32 and stores both, in the input's dtype.
No program touches another's elements, and within a program the two tiles share one layout, so
the thread that stores a pair is one that loaded both of its elements, before, in its own
program order (a thread holding a replica of a pair loads it too but does not store it; tiles
are sized to at least one element per thread anyway). Channels past ``rotary_dim`` (a partial
rotary) are neither read nor written.

Triton is imported at the first call (`_kernel`), so this module imports without it.
"""

from __future__ import annotations

import functools
import types

from sglang_fl.kernels import next_power_of_2
from sglang_fl.kernels.launch import launch

#: Elements of one half-tile ([rows, rotary_dim // 2]) a program aims for: 8 per thread at 4
#: warps, i.e. 2 KiB (fp16) to 4 KiB (fp32) per load.
_TILE = 1024


def rotary_embedding_inplace(query, key, cos, sin, position_ids, head_size,
                             rotary_interleaved=False):
    """Rotate the first ``2 * cos.shape[-1]`` channels of every head of ``query`` and ``key``
    in place, as the ``rotary_embedding`` op with ``inplace=True`` (sglang_fl/dispatch/ops.py):
    query ``[tokens, q_heads * head_size]`` and key ``[tokens, k_heads * head_size]`` (views of
    a fused qkv buffer are fine: any token stride), cos/sin ``[max_positions, rotary_dim // 2]``
    of any float dtype, position_ids ``[tokens]``. Returns ``(query, key)``."""
    plan = launch_plan(query, key, cos, sin, position_ids, head_size, rotary_interleaved)
    if plan is not None:
        launch(_kernel(), *plan)
    return query, key


def launch_plan(query, key, cos, sin, position_ids, head_size, rotary_interleaved=False):
    """The kernel's ``(grid, args, meta)`` for this call (None: no tokens), checked as
    `rotary_embedding_inplace` documents; benchmarks/launch_cost.py launches the same plan by
    other paths.

    It runs on every eager call, so it is lean (H100 host, 2026-12-05: the wrapper cost 16 us
    over the bare launch of 24 us): the tile geometry is computed once per layer shape
    (`_geometry`), and 2-D q/k and 1-D positions, what SGLang passes, are described by their
    own strides instead of through new views."""
    tokens = position_ids.numel()
    half = cos.shape[-1]
    if tokens == 0:
        _check(half, head_size, tuple(cos.shape), tuple(sin.shape))
        return None
    if query.dim() == 2 and key.dim() == 2 and position_ids.dim() == 1:
        q, k, pos = query, key, position_ids
        q_heads, rem_q = divmod(query.shape[1], head_size)
        k_heads, rem_k = divmod(key.shape[1], head_size)
        if rem_q or rem_k or query.shape[0] != tokens or key.shape[0] != tokens:
            raise ValueError(f"query {tuple(query.shape)} / key {tuple(key.shape)} are not "
                             f"[{tokens}, heads * {head_size}]")
        qs_t, qs_d = query.stride()
        ks_t, ks_d = key.stride()
        q_strides = (qs_t, head_size * qs_d, qs_d)
        k_strides = (ks_t, head_size * ks_d, ks_d)
        pos_stride = position_ids.stride(0)
    else:
        q = query.view(tokens, -1, head_size)
        k = key.view(tokens, -1, head_size)
        pos = position_ids.reshape(tokens)
        q_heads, k_heads = q.shape[1], k.shape[1]
        q_strides, k_strides, pos_stride = q.stride(), k.stride(), pos.stride(0)
    rows, meta = _geometry(half, head_size, bool(rotary_interleaved), tuple(cos.shape),
                           tuple(sin.shape))
    q_rows, k_rows = tokens * q_heads, tokens * k_heads
    q_blocks = -(-q_rows // rows)
    args = (q, k, cos, sin, pos, *q_strides, *k_strides, pos_stride, *cos.stride(),
            *sin.stride(), q_heads, k_heads, q_rows, k_rows, q_blocks)
    return (q_blocks - (-k_rows // rows),), args, meta


@functools.lru_cache(maxsize=256)
def _geometry(half, head_size, interleaved, cos_shape, sin_shape):
    """``(rows per program, meta)`` of one layer shape, checked once."""
    _check(half, head_size, cos_shape, sin_shape)
    block_half = next_power_of_2(half)
    # Rows per tile: up to _TILE elements, and at least one element per thread of one warp.
    rows = max(1, _TILE // block_half, 32 // block_half)
    num_warps = max(1, min(4, rows * block_half // 256))
    meta = types.MappingProxyType(dict(HALF=half, BLOCK_HALF=block_half, BLOCK_ROWS=rows,
                                       INTERLEAVED=interleaved, num_warps=num_warps))
    return rows, meta


def _check(half, head_size, cos_shape, sin_shape) -> None:
    if 2 * half > head_size:
        raise ValueError(f"rotary_dim {2 * half} exceeds head_size {head_size}")
    if sin_shape != cos_shape:
        raise ValueError(f"cos {cos_shape} and sin {sin_shape} differ")


@functools.cache
def _kernel():
    from sglang_fl.kernels import rope_triton

    return rope_triton.rope_inplace_kernel
