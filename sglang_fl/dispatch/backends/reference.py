"""Pure-PyTorch implementations of every op: always available, any device.

They follow SGLang's own ``forward_native`` arithmetic step for step (same dtype casts, same
operation order) so a served model gives the same tokens with or without the plugin.
The MoE math (`select_experts`, `experts_forward`) is module-level so that a backend whose
kernels cover only some routing variants can run the others exactly as the reference does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.backends import reference_gdn as gdn
from sglang_fl.dispatch.types import BackendImplKind


class GDNReference:
    """The Gated DeltaNet ops (math in `reference_gdn`)."""

    def gdn_gating(self, obj, A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0):  # noqa: N803
        return gdn.gdn_gating(A_log, a, b, dt_bias, softplus_beta, softplus_threshold)

    def chunk_gated_delta_rule(self, obj, q, k, v, g, beta, initial_state, cu_seqlens, scale=None,
                               use_qk_l2norm=True):
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, cu_seqlens, scale,
                                          use_qk_l2norm)

    def recurrent_gated_delta_rule(self, obj, q, k, v, a, b, A_log, dt_bias, state, state_indices,  # noqa: N803
                                   cu_seqlens, scale=None, use_qk_l2norm=True, softplus_beta=1.0,
                                   softplus_threshold=20.0):
        return gdn.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, state, state_indices,
                                              cu_seqlens, scale, use_qk_l2norm, softplus_beta,
                                              softplus_threshold)

    def packed_recurrent_gated_delta_rule(self, obj, mixed_qkv, a, b, A_log, dt_bias, state,  # noqa: N803
                                          state_indices, scale=None, use_qk_l2norm=True):
        return gdn.packed_recurrent_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state,
                                                     state_indices, scale, use_qk_l2norm)

    def causal_conv1d(self, obj, x, weight, bias, conv_states, query_start_loc, cache_indices,
                      has_initial_state, activation="silu", seq_lens_cpu=None):
        return gdn.causal_conv1d(x, weight, bias, conv_states, query_start_loc, cache_indices,
                                 has_initial_state, activation, seq_lens_cpu)

    def causal_conv1d_update(self, obj, x, conv_state, weight, bias=None, activation=None,
                             conv_state_indices=None):
        return gdn.causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices)

    def rms_norm_gated(self, obj, x, z, eps, group_size=None, norm_before_gate=True):
        return gdn.rms_norm_gated(x, obj.weight, z, eps, group_size, norm_before_gate)


class ReferenceBackend(GDNReference, Backend):
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

    def topk(self, obj, hidden_states, router_logits, top_k, renormalize=True,
             scoring_func="softmax", correction_bias=None, num_expert_group=None, topk_group=None):
        return select_experts(router_logits, top_k, renormalize=renormalize, scoring_func=scoring_func,
                              correction_bias=correction_bias, num_expert_group=num_expert_group,
                              topk_group=topk_group)

    def fused_moe(self, obj, hidden_states, topk_weights, topk_ids):
        return experts_forward(hidden_states, obj.w13_weight, obj.w2_weight, topk_weights, topk_ids)


def select_experts(router_logits, top_k, *, renormalize=True, scoring_func="softmax",
                   correction_bias=None, num_expert_group=None, topk_group=None):
    """The ``topk`` op's routing: ``(weights float32 [T, k], ids int32 [T, k])``.

    Scores (softmax or sigmoid of the logits) are taken in fp32. Experts are chosen by
    ``scores + correction_bias`` but weighted by the scores alone. With ``num_expert_group``
    the experts are split into that many equal groups and only the ``topk_group`` best groups
    compete, a group scoring its best expert (no bias: DeepSeek-V2) or the sum of its best two
    biased scores (with a bias: DeepSeek-V3), as SGLang's ``grouped_topk`` and
    ``biased_grouped_topk`` do.
    """
    logits = router_logits.float()
    if scoring_func == "softmax":
        scores = logits.softmax(dim=-1)
    elif scoring_func == "sigmoid":
        scores = logits.sigmoid()
    else:
        raise ValueError(f"scoring_func={scoring_func!r}: accepted softmax, sigmoid")
    choice = scores if correction_bias is None else scores + correction_bias.float()
    if num_expert_group:
        tokens, experts = choice.shape
        groups = choice.view(tokens, num_expert_group, experts // num_expert_group)
        if correction_bias is None:
            group_scores = groups.max(dim=-1).values
        else:
            group_scores = groups.topk(min(2, groups.shape[-1]), dim=-1).values.sum(dim=-1)
        best = group_scores.topk(topk_group, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
        choice = choice.masked_fill(~keep.repeat_interleave(groups.shape[-1], dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def experts_forward(hidden_states, w13, w2, topk_weights, topk_ids):
    """The ``fused_moe`` op: ``sum_k weight[t, k] * down(silu(gate(x_t)) * up(x_t))`` over the
    experts ``topk_ids[t, k]``, for ``w13 [E, 2I, H]`` (gate rows first) and ``w2 [E, H, I]``.

    Each expert's MLP runs in the input dtype on its tokens (as SGLang's ``moe_forward_native``
    does); the weighted sum over k is fp32, rounded once. Ids outside ``[0, E)`` (``-1``: an
    expert another expert-parallel rank holds) contribute nothing. The expert loop reads the
    routing on the host, so it cannot be captured in a device graph.
    """
    tokens, k = topk_ids.shape
    hidden = hidden_states.shape[-1]
    flat = topk_ids.reshape(-1).long()
    source = torch.arange(tokens * k, device=flat.device) // k  # the token of each (t, k) slot
    out = hidden_states.new_zeros(tokens * k, hidden)
    valid = (flat >= 0) & (flat < w13.shape[0])
    for expert in flat[valid].unique().tolist():
        slots = (flat == expert).nonzero().squeeze(1)
        gate, up = F.linear(hidden_states[source[slots]], w13[expert]).chunk(2, dim=-1)
        out[slots] = F.linear(F.silu(gate) * up, w2[expert])
    weighted = out.view(tokens, k, hidden).float() * topk_weights.float().unsqueeze(-1)
    return weighted.sum(dim=1).to(hidden_states.dtype)


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
