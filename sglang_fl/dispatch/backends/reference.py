"""Pure-PyTorch implementations of every op: always available, any device.

They follow SGLang's own ``forward_native`` arithmetic step for step (same dtype casts, same
operation order) so a served model gives the same tokens with or without the plugin.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.types import BackendImplKind


class ReferenceBackend(Backend):
    name = "reference"
    kind = BackendImplKind.REFERENCE

    def is_available(self) -> bool:
        return True

    def silu_and_mul(self, obj, x):
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    def rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        if not x.is_contiguous():  # as forward_native: the reduction order follows the layout
            x = x.contiguous()
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        if residual is not None:
            x = x + residual.to(torch.float32)
            if post_residual_addition is not None:
                x = x + post_residual_addition.to(torch.float32)
            residual = x.to(orig_dtype)
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + obj.variance_epsilon)
        x = (x * obj.weight).to(orig_dtype)
        return x if residual is None else (x, residual)

    def gemma_rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        orig_dtype = x.dtype
        if residual is not None:
            if post_residual_addition is not None:
                residual = residual + post_residual_addition
            x = x + residual
            residual = x
        x = x.float()
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + obj.variance_epsilon)
        x = (x * (1.0 + obj.weight.float())).to(orig_dtype)
        return x if residual is None else (x, residual)

    def rotary_embedding(self, obj, query, key, cos, sin, position_ids,
                         rotary_interleaved=False, inplace=True):
        cos = cos.index_select(0, position_ids.flatten()).unsqueeze(-2)
        sin = sin.index_select(0, position_ids.flatten()).unsqueeze(-2)
        return (
            _rotate(query, cos, sin, obj.head_size, rotary_interleaved, inplace),
            _rotate(key, cos, sin, obj.head_size, rotary_interleaved, inplace),
        )


    def mrotary_embedding(self, obj, query, key, cos, sin, positions, mrope_section,
                          mrope_interleaved=False, rotary_interleaved=False, inplace=True):
        cos = _mrope_rows(cos, positions, mrope_section, mrope_interleaved).unsqueeze(-2)
        sin = _mrope_rows(sin, positions, mrope_section, mrope_interleaved).unsqueeze(-2)
        return (
            _rotate(query, cos, sin, obj.head_size, rotary_interleaved, inplace),
            _rotate(key, cos, sin, obj.head_size, rotary_interleaved, inplace),
        )


def _mrope_rows(cache, positions, section, interleaved):
    """Per token, the ``[rotary_dim // 2]`` cache row of mRoPE: each pair from the position of
    its axis (the op table's ``mrotary_embedding`` entry says which)."""
    if positions.ndim == 1:
        return cache.index_select(0, positions)
    if len(section) != 3 or sum(section) != cache.shape[-1]:
        raise ValueError(f"mrope_section {tuple(section)} must be 3 pair counts summing to "
                         f"rotary_dim // 2 = {cache.shape[-1]}")
    rows = cache[positions]  # [3, tokens, rotary_dim // 2]
    if not interleaved:
        parts = rows.split(list(section), dim=-1)
        return torch.cat([part[axis] for axis, part in enumerate(parts)], dim=-1)
    _, h, w = section
    out = rows[0].clone()
    out[..., 1:3 * h:3] = rows[1, ..., 1:3 * h:3]
    out[..., 2:3 * w:3] = rows[2, ..., 2:3 * w:3]
    return out


def _rotate(x, cos, sin, head_size, interleaved, inplace):
    """Rotate the first ``2 * cos.shape[-1]`` channels of every head of ``x``."""
    shape = x.shape
    heads = x.view(cos.shape[0], -1, head_size)
    rot_dim = 2 * cos.shape[-1]
    rot = heads[..., :rot_dim]
    cos = cos.to(x.dtype)
    sin = sin.to(x.dtype)
    if interleaved:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = torch.chunk(rot, 2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    if inplace:
        rot.copy_(out)
        return x
    return torch.cat((out, heads[..., rot_dim:]), dim=-1).reshape(shape)
