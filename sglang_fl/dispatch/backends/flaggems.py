"""FlagGems (kind ``flagos``): Triton kernels, available when ``flag_gems`` imports and finds a
device it supports."""

from __future__ import annotations

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.types import BackendImplKind


class FlagGemsBackend(Backend):
    name = "flagos"
    kind = BackendImplKind.FLAGOS

    def __init__(self) -> None:
        self._gems = None

    def is_available(self) -> bool:
        try:
            import flag_gems
        except Exception as exc:  # noqa: BLE001 - FlagGems raises RuntimeError without a device
            self.unavailable_reason = f"import flag_gems failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
            return False
        self._gems = flag_gems
        return True

    def silu_and_mul(self, obj, x):
        d = x.shape[-1] // 2
        return self._gems.silu_and_mul(x[..., :d], x[..., d:])

    def rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        shape, weight, eps = [x.shape[-1]], obj.weight, obj.variance_epsilon
        if residual is None:
            return self._gems.rms_norm(x, shape, weight, eps)
        if post_residual_addition is None:  # the kernel adds x + residual in fp32 itself
            return self._gems.fused_add_rms_norm(x, residual, shape, weight, eps)
        total, rest = self.residual_sum_parts(x, residual, post_residual_addition)
        out, _ = self._gems.fused_add_rms_norm(rest, total.clone(), shape, weight, eps)
        return out, total

    def gemma_rms_norm(self, obj, x, residual=None, post_residual_addition=None):
        # FlagGems has no Gemma norm: scale by 1 + weight (in fp32, as forward_native), formed
        # per call since nothing tells us when a weight loader rewrites obj.weight.
        weight = obj.weight.float() + 1.0
        if residual is None:
            return self._gems.rms_norm(x, [x.shape[-1]], weight, obj.variance_epsilon)
        if post_residual_addition is not None:  # in x's dtype, as GemmaRMSNorm.forward_native
            residual = residual + post_residual_addition
        return self._gems.fused_add_rms_norm(x, residual, [x.shape[-1]], weight, obj.variance_epsilon)

    def rotary_embedding(self, obj, query, key, cos, sin, position_ids,
                         rotary_interleaved=False, inplace=True):
        # FlagGems 5.0.2's in-place RoPE kernel races (no barrier between the warps that read a
        # rotation partner and those that overwrite it): 20-30 % of calls at head 128 x 1024
        # tokens return wrong elements on an H200. Its out-of-place kernel is exact, so in-place
        # is done as out-of-place + copy into q/k (compat ledger entry ``flaggems:rope-inplace``;
        # reproducer: tools/repro_flaggems_rope_race.py).
        head_size, rot_dim = obj.head_size, 2 * cos.shape[-1]
        tokens = position_ids.numel()
        q = query.view(tokens, -1, head_size)[..., :rot_dim]
        k = key.view(tokens, -1, head_size)[..., :rot_dim]
        q_out, k_out = self._gems.apply_rotary_pos_emb(
            q, k, cos, sin, position_ids.view(tokens), rotary_interleaved=rotary_interleaved,
            inplace=False,
        )
        if inplace:
            q.copy_(q_out)
            k.copy_(k_out)
            return query, key
        if rot_dim == head_size:
            return q_out.reshape(query.shape), k_out.reshape(key.shape)
        import torch

        q_full = torch.cat((q_out, query.view(tokens, -1, head_size)[..., rot_dim:]), -1)
        k_full = torch.cat((k_out, key.view(tokens, -1, head_size)[..., rot_dim:]), -1)
        return q_full.reshape(query.shape), k_full.reshape(key.shape)
