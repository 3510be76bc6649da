"""Pure-PyTorch Gated DeltaNet ops (Qwen3-Next, Qwen3.5/3.6 linear attention): the reference
implementations of the op table's GDN entries.

The arithmetic follows HF transformers' torch fallbacks of the same model step for step (fp32
state and accumulation, chunks of 64 tokens, the same l2norm epsilon), so an fp32 model served
through these ops gives HF's tokens. Variable-length batches are sequences concatenated along
the token axis, delimited by ``cu_seqlens``, each with its own state slot, as SGLang and vLLM
pass them. The state layout is ``[slots, HV, V, K]`` (SGLang's mamba pool: the key dimension
contiguous), the transpose of HF's ``[.., K, V]``.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

CHUNK = 64
L2NORM_EPS = 1e-6


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2NORM_EPS)


def _spans(cu_seqlens, total: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, total)]
    bounds = [int(v) for v in cu_seqlens.tolist()]
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != total or any(
            b < a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise ValueError(f"cu_seqlens {bounds} must rise from 0 to the token count {total}")
    return list(zip(bounds, bounds[1:], strict=False))


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    """q/k heads ``[.., H, K]`` -> ``[.., HV, K]``: value head i reads key head i // (HV // H)."""
    h = x.shape[-2]
    if hv % h:
        raise ValueError(f"value heads ({hv}) must be a multiple of key heads ({h})")
    return x.repeat_interleave(hv // h, dim=-2) if hv != h else x


def _check_qkv(q, k, v):
    if q.dim() != 4 or q.shape[0] != 1 or q.shape != k.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"q, k [1, T, H, K] and v [1, T, HV, V] expected; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")


def gdn_gating(A_log, a, b, dt_bias, softplus_beta=1.0, softplus_threshold=20.0):
    """``(g, beta)``, each fp32 ``[1, T, HV]``: g = -exp(A_log) * softplus(a + dt_bias),
    beta = sigmoid(b) rounded to b's dtype."""
    if a.dim() != 2 or a.shape != b.shape or A_log.shape[-1] != a.shape[-1]:
        raise ValueError(f"a, b [T, HV] and A_log, dt_bias [HV] expected; got a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)}, A_log {tuple(A_log.shape)}")
    x = a.float() + dt_bias.float()
    softplus = F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    g = -A_log.float().exp() * softplus
    beta = b.float().sigmoid().to(b.dtype).float()
    return g.unsqueeze(0), beta.unsqueeze(0)


def _chunk_one(q, k, v, g, beta, state):
    """One sequence: q, k [H, T, K], v [H, T, V], g, beta [H, T] (fp32, q scaled), state
    [H, K, V] -> (out [H, T, V], state)."""
    heads, length, dk = k.shape
    pad = (CHUNK - length % CHUNK) % CHUNK
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (length + pad) // CHUNK
    k_beta = k * beta.unsqueeze(-1)
    v_beta = v * beta.unsqueeze(-1)
    q, k, v, k_beta, v_beta = (t.reshape(heads, n, CHUNK, t.shape[-1]) for t in (q, k, v, k_beta, v_beta))
    g = g.reshape(heads, n, CHUNK).cumsum(dim=-1)
    upper = torch.triu(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device), diagonal=0)
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).tril().exp().float().tril()
    attn = -((k_beta @ k.transpose(-1, -2)) * decay).masked_fill(upper, 0)
    for i in range(1, CHUNK):  # (I + A)^-1 by forward substitution, row by row
        row = attn[..., i, :i].clone()
        sub = attn[..., :i, :i].clone()
        attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)
    attn = attn + torch.eye(CHUNK, dtype=attn.dtype, device=attn.device)
    v = attn @ v_beta
    k_cumdecay = attn @ (k_beta * g.exp().unsqueeze(-1))
    out = torch.zeros_like(v)
    strict_upper = torch.triu(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device), diagonal=1)
    for i in range(n):
        q_i, k_i, v_i, g_i = q[:, i], k[:, i], v[:, i], g[:, i]
        intra = (q_i @ k_i.transpose(-1, -2) * decay[:, i]).masked_fill_(strict_upper, 0)
        v_new = v_i - k_cumdecay[:, i] @ state
        out[:, i] = (q_i * g_i[..., None].exp()) @ state + intra @ v_new
        state = (state * g_i[:, -1, None, None].exp()
                 + (k_i * (g_i[:, -1, None] - g_i).exp()[..., None]).transpose(-1, -2) @ v_new)
    return out.reshape(heads, n * CHUNK, -1)[:, :length], state


def chunk_gated_delta_rule(q, k, v, g, beta, initial_state, cu_seqlens, scale=None,
                           use_qk_l2norm=True):
    """Prefill: ``(out [1, T, HV, V] in q's dtype, final_state fp32 [N, HV, V, K])``."""
    _check_qkv(q, k, v)
    total, hv = v.shape[1], v.shape[2]
    spans = _spans(cu_seqlens, total)
    if initial_state is not None and (initial_state.dim() != 4 or initial_state.shape[0] != len(spans)
                                      or initial_state.shape[1:] != (hv, v.shape[-1], k.shape[-1])):
        raise ValueError(f"initial_state [N={len(spans)}, HV={hv}, V={v.shape[-1]}, K={k.shape[-1]}] "
                         f"expected; got {tuple(initial_state.shape)}")
    if g.shape != v.shape[:3] or beta.shape != v.shape[:3]:
        raise ValueError(f"g and beta [1, T, HV] expected; got {tuple(g.shape)}, {tuple(beta.shape)}")
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    qf, kf = q[0].float(), k[0].float()
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf, kf = _expand_heads(qf, hv) * scale, _expand_heads(kf, hv)
    vf, gf, bf = v[0].float(), g[0].float(), beta[0].float()
    out = torch.empty(total, hv, v.shape[-1], dtype=torch.float32, device=v.device)
    finals = []
    for n, (start, end) in enumerate(spans):
        state = (initial_state[n].float().transpose(-1, -2) if initial_state is not None
                 else torch.zeros(hv, k.shape[-1], v.shape[-1], dtype=torch.float32, device=v.device))
        part = slice(start, end)
        o, state = _chunk_one(qf[part].transpose(0, 1), kf[part].transpose(0, 1),
                              vf[part].transpose(0, 1), gf[part].transpose(0, 1),
                              bf[part].transpose(0, 1), state)
        out[part] = o.transpose(0, 1)
        finals.append(state.transpose(-1, -2))
    return out.unsqueeze(0).to(q.dtype), torch.stack(finals)


def recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, state, state_indices, cu_seqlens,
                               scale=None, use_qk_l2norm=True, softplus_beta=1.0,
                               softplus_threshold=20.0):
    """Decode: token by token from ``state[state_indices[n]]`` (zeros where the index is
    negative), gating fused; the final states are written back in place."""
    _check_qkv(q, k, v)
    total, hv = v.shape[1], v.shape[2]
    spans = _spans(cu_seqlens, total)
    if state_indices.numel() != len(spans):
        raise ValueError(f"{state_indices.numel()} state indices for {len(spans)} sequences")
    g, beta = gdn_gating(A_log, a.reshape(total, hv), b.reshape(total, hv), dt_bias,
                         softplus_beta, softplus_threshold)
    scale = k.shape[-1] ** -0.5 if scale is None else scale
    qf, kf = q[0].float(), k[0].float()
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf, kf = _expand_heads(qf, hv) * scale, _expand_heads(kf, hv)
    vf = v[0].float()
    out = torch.empty(total, hv, v.shape[-1], dtype=torch.float32, device=v.device)
    for n, (start, end) in enumerate(spans):
        slot = int(state_indices[n])
        h = (state[slot].float().transpose(-1, -2) if slot >= 0
             else torch.zeros(hv, k.shape[-1], v.shape[-1], dtype=torch.float32, device=v.device))
        for t in range(start, end):
            h = h * g[0, t].exp()[:, None, None]
            kv_mem = (h * kf[t].unsqueeze(-1)).sum(dim=-2)
            delta = (vf[t] - kv_mem) * beta[0, t].unsqueeze(-1)
            h = h + kf[t].unsqueeze(-1) * delta.unsqueeze(-2)
            out[t] = (h * qf[t].unsqueeze(-1)).sum(dim=-2)
        if slot >= 0:
            state[slot] = h.transpose(-1, -2).to(state.dtype)
    return out.unsqueeze(0).to(q.dtype)


def split_packed_qkv(mixed_qkv, state):
    """``(q, k, v, cu_seqlens)`` of a packed decode batch: mixed_qkv ``[B, 2 * H * K + HV * V]``
    (rows q | k | v) as views ``[1, B, H, K]`` / ``[1, B, HV, V]``, HV, V, K read off the state
    pool ``[slots, HV, V, K]``; one token per sequence."""
    if mixed_qkv.dim() != 2 or state.dim() != 4:
        raise ValueError(f"mixed_qkv [B, qkv] and state [slots, HV, V, K] expected; got "
                         f"{tuple(mixed_qkv.shape)} and {tuple(state.shape)}")
    hv, dv, dk = state.shape[-3:]
    rows, width = mixed_qkv.shape
    qk = width - hv * dv
    if qk <= 0 or qk % (2 * dk):
        raise ValueError(f"mixed_qkv width {width} is not 2 * H * {dk} + {hv} * {dv} for any H")
    h = qk // (2 * dk)
    q, k, v = mixed_qkv.split([h * dk, h * dk, hv * dv], dim=-1)
    cu = torch.arange(rows + 1, dtype=torch.int32, device=mixed_qkv.device)
    return (q.reshape(1, rows, h, dk), k.reshape(1, rows, h, dk), v.reshape(1, rows, hv, dv), cu)


def packed_recurrent_gated_delta_rule(mixed_qkv, a, b, A_log, dt_bias, state, state_indices,
                                      scale=None, use_qk_l2norm=True):
    """Packed decode: `recurrent_gated_delta_rule` of `split_packed_qkv`'s views."""
    q, k, v, cu = split_packed_qkv(mixed_qkv, state)
    return recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, state, state_indices, cu,
                                      scale, use_qk_l2norm)


def _activate(x, activation):
    if activation in (None, False):
        return x
    if activation in (True, "silu", "swish"):
        return F.silu(x)
    raise ValueError(f"activation={activation!r}: accepted None, 'silu', 'swish'")


def causal_conv1d(x, weight, bias, conv_states, query_start_loc, cache_indices,
                  has_initial_state, activation="silu", seq_lens_cpu=None):
    """Depthwise causal conv over each sequence of ``x [dim, T]`` (``weight [dim, width]``),
    starting from ``conv_states[cache_indices[n]] [dim, width - 1]`` where has_initial_state[n]
    (zeros elsewhere); each sequence's last width - 1 inputs are written back to its slot.
    With ``seq_lens_cpu`` (SGLang passes it) nothing here waits for the device: the slots are
    gathered and written back with tensor indices, not read one by one on the host."""
    dim, total = x.shape
    width = weight.shape[-1]
    if weight.shape != (dim, width):
        raise ValueError(f"weight [dim={dim}, width] expected; got {tuple(weight.shape)}")
    if seq_lens_cpu is None:
        spans = _spans(query_start_loc, total)
    else:
        lens = [int(n) for n in seq_lens_cpu]
        if sum(lens) != total or any(n < 0 for n in lens):
            raise ValueError(f"seq_lens_cpu {lens} must be non-negative and sum to the token "
                             f"count {total}")
        ends = list(itertools.accumulate(lens))
        spans = list(zip([0, *ends[:-1]], ends, strict=True))
    slots = (cache_indices.long() if cache_indices is not None
             else torch.arange(len(spans), device=x.device))
    prefixes = conv_states[slots, :, -(width - 1):].to(x.dtype)
    if has_initial_state is not None:
        prefixes = torch.where(has_initial_state.view(-1, 1, 1).to(torch.bool), prefixes, 0)
    out = torch.empty_like(x)
    windows = []
    w = weight.unsqueeze(1).to(x.dtype)
    b = None if bias is None else bias.to(x.dtype)
    for n, (start, end) in enumerate(spans):
        seq = torch.cat((prefixes[n], x[:, start:end]), dim=-1)
        y = F.conv1d(seq.unsqueeze(0), w, b, groups=dim)[0]
        out[:, start:end] = _activate(y, activation)
        windows.append(seq[:, -(width - 1):])
    if windows:
        conv_states[slots, :, -(width - 1):] = torch.stack(windows).to(conv_states.dtype)
    return out


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None,
                         conv_state_indices=None):
    """Decode step(s): ``x [B, dim]`` (or ``[B, dim, L]``) continues the window kept in
    ``conv_state[conv_state_indices[i]]``, which is shifted in place."""
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    batch, dim, length = xs.shape
    width = weight.shape[-1]
    out = torch.empty_like(xs)
    for i in range(batch):
        slot = int(conv_state_indices[i]) if conv_state_indices is not None else i
        if slot < 0:  # a padded entry: nothing to do
            out[i] = 0
            continue
        seq = torch.cat((conv_state[slot, :, -(width - 1):].to(x.dtype), xs[i]), dim=-1)
        y = F.conv1d(seq.unsqueeze(0), weight.unsqueeze(1).to(x.dtype),
                     None if bias is None else bias.to(x.dtype), groups=dim)[0]
        out[i] = _activate(y, activation)
        conv_state[slot, :, -(width - 1):] = seq[:, -(width - 1):].to(conv_state.dtype)
    return out.squeeze(-1) if squeeze else out


def rms_norm_gated(x, weight, z, eps, group_size=None, norm_before_gate=True):
    """``norm(x) * silu(z)`` (or ``norm(x * silu(z))``), normalised over groups of group_size
    channels (all of them when None), in fp32, rounded to x's dtype once."""
    dtype = x.dtype
    size = x.shape[-1]
    group = size if group_size is None else group_size
    if size % group:
        raise ValueError(f"group_size={group_size} does not divide the hidden size {size}")
    xf = x.float()
    if z is not None and not norm_before_gate:
        xf = xf * F.silu(z.float())
    grouped = xf.reshape(*xf.shape[:-1], size // group, group)
    normed = grouped * torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = normed.reshape(xf.shape) * weight.float()
    if z is not None and norm_before_gate:
        out = out * F.silu(z.float())
    return out.to(dtype)
