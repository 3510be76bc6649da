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
