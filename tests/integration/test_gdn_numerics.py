"""The Gated DeltaNet ops (Qwen3-Next, Qwen3.5/3.6 linear attention): each registered impl
against an oracle written here independently (float64, token by token, no chunking): chunk
boundaries (lengths 1, 63, 64, 65, 130), several sequences in one batch, with and without an
initial state, grouped value heads, decode after prefill equal to one long prefill; then SGLang's
own CPU entry points (``torch.ops.sgl_kernel.*`` and ``sgl_kernel.mamba.*`` of empty mode) and
its FLA gated norm through the plugin's route.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_fl.dispatch.ops import op_spec

pytestmark = pytest.mark.integration

GDN_OPS = ("gdn_gating", "chunk_gated_delta_rule", "recurrent_gated_delta_rule", "causal_conv1d",
           "causal_conv1d_update", "rms_norm_gated")


def impls(op):
    """Every impl registered for ``op`` on this host (the reference at least)."""
    from sglang_fl.dispatch import get_manager

    found = get_manager().registry.impls(op)
    assert found, f"no impl registered for {op}"
    return found


# -- oracles (float64) ---------------------------------------------------------------------------

def oracle_gating(A_log, a, b, dt_bias):  # noqa: N803
    x = a.double() + dt_bias.double()
    softplus = torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    return -A_log.double().exp() * softplus, torch.sigmoid(b.double())


def oracle_delta_rule(q, k, v, g, beta, state, scale, l2norm=True):
    """One sequence: q, k [T, H, K], v [T, HV, V], g, beta [T, HV], state [HV, V, K] or None
    -> (out [T, HV, V], state [HV, V, K]), token by token in float64."""
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    hv, dv, dk = v.shape[1], v.shape[2], k.shape[2]
    rep = hv // k.shape[1]
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    h = torch.zeros(hv, dk, dv, dtype=torch.float64) if state is None else state.double().transpose(-1, -2).clone()
    out = torch.empty(v.shape[0], hv, dv, dtype=torch.float64)
    for t in range(v.shape[0]):
        for head in range(hv):
            kk, qq = k[t, head // rep], q[t, head // rep] * scale
            s = h[head] * torch.exp(g[t, head])
            s = s + torch.outer(kk, beta[t, head] * (v[t, head] - s.T @ kk))
            h[head] = s
            out[t, head] = s.T @ qq
    return out, h.transpose(-1, -2)


def oracle_conv(x, weight, bias, prefix, activation=True):
    """x [dim, L] after prefix [dim, width-1] -> [dim, L]."""
    seq = torch.cat((prefix.double(), x.double()), -1)
    width = weight.shape[1]
    out = torch.stack([(seq[:, t:t + width] * weight.double()).sum(-1) for t in range(x.shape[1])], -1)
    if bias is not None:
        out = out + bias.double()[:, None]
    return F.silu(out) if activation else out


# -- data ----------------------------------------------------------------------------------------

def _gdn_inputs(lengths, h=2, hv=4, dk=16, dv=8, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(1, total, h, dk, generator=gen).to(dtype)
    k = torch.randn(1, total, h, dk, generator=gen).to(dtype)
    v = torch.randn(1, total, hv, dv, generator=gen).to(dtype)
    a = torch.randn(total, hv, generator=gen).to(dtype)
    b = torch.randn(total, hv, generator=gen).to(dtype)
    A_log = torch.rand(hv, generator=gen) * 2 - 1  # noqa: N806
    dt_bias = torch.randn(hv, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, a, b, A_log, dt_bias, cu


def _tol(op, dtype=torch.float32):
    return op_spec(op).tolerance.for_dtype(dtype)


# -- the ops ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_gating_matches_oracle(dtype):
    q, k, v, a, b, A_log, dt_bias, _ = _gdn_inputs([5, 3], dtype=dtype)  # noqa: N806
    g_want, beta_want = oracle_gating(A_log, a, b, dt_bias)
    for impl in impls("gdn_gating"):
        g, beta = impl.fn(None, A_log, a, b, dt_bias)
        assert g.shape == beta.shape == (1, 8, 4) and g.dtype == beta.dtype == torch.float32
        torch.testing.assert_close(g[0].double(), g_want, **_tol("gdn_gating"))
        torch.testing.assert_close(beta[0].double(), beta_want.to(dtype).double(), **_tol("gdn_gating"))


def test_gdn_gating_rejects_mismatched_shapes():
    a = torch.zeros(3, 4)
    with pytest.raises(ValueError, match=r"a, b \[T, HV\]"):
        impls("gdn_gating")[0].fn(None, torch.zeros(4), a, torch.zeros(3, 5), torch.zeros(4))


@pytest.mark.parametrize("lengths", [[1], [63], [64], [65], [130], [7, 64, 1, 70]],
                         ids=lambda L: "+".join(map(str, L)))
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
def test_chunk_gated_delta_rule_matches_oracle(lengths, with_state):
    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs(lengths)  # noqa: N806
    g, beta = oracle_gating(A_log, a, b, dt_bias)
    g, beta = g.float()[None], beta.float()[None]
    n, hv, dv, dk = len(lengths), v.shape[2], v.shape[3], k.shape[3]
    init = torch.randn(n, hv, dv, dk, generator=torch.Generator().manual_seed(1)) if with_state else None
    scale = dk ** -0.5
    for impl in impls("chunk_gated_delta_rule"):
        out, final = impl.fn(None, q, k, v, g, beta, None if init is None else init.clone(), cu)
        assert out.shape == v.shape and final.shape == (n, hv, dv, dk)
        for i in range(n):
            s, e = int(cu[i]), int(cu[i + 1])
            want_o, want_h = oracle_delta_rule(q[0, s:e], k[0, s:e], v[0, s:e], g[0, s:e],
                                               beta[0, s:e], None if init is None else init[i], scale)
            torch.testing.assert_close(out[0, s:e].double(), want_o, **_tol("chunk_gated_delta_rule"))
            torch.testing.assert_close(final[i].double(), want_h, **_tol("chunk_gated_delta_rule"))


def test_chunk_rule_rejects_bad_cu_seqlens():
    q, k, v, a, b, A_log, dt_bias, _ = _gdn_inputs([4])  # noqa: N806
    g = torch.zeros(1, 4, 4)
    with pytest.raises(ValueError, match="cu_seqlens"):
        impls("chunk_gated_delta_rule")[0].fn(None, q, k, v, g, g, None, torch.tensor([0, 3]))


def test_recurrent_rule_matches_oracle_and_writes_state_in_place():
    lengths = [1, 1, 3]
    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs(lengths, seed=3)  # noqa: N806
    hv, dv, dk = v.shape[2], v.shape[3], k.shape[3]
    pool = torch.randn(6, hv, dv, dk, generator=torch.Generator().manual_seed(2))
    slots = torch.tensor([4, -1, 1], dtype=torch.int32)  # -1: no state, nothing written
    before = pool.clone()
    g, beta = oracle_gating(A_log, a, b, dt_bias)
    for impl in impls("recurrent_gated_delta_rule"):
        work = before.clone()
        out = impl.fn(None, q, k, v, a, b, A_log, dt_bias, work, slots, cu)
        for i, slot in enumerate(slots.tolist()):
            s, e = int(cu[i]), int(cu[i + 1])
            want_o, want_h = oracle_delta_rule(q[0, s:e], k[0, s:e], v[0, s:e], g[s:e], beta[s:e],
                                               before[slot] if slot >= 0 else None, dk ** -0.5)
            torch.testing.assert_close(out[0, s:e].double(), want_o, **_tol("recurrent_gated_delta_rule"))
            if slot >= 0:
                torch.testing.assert_close(work[slot].double(), want_h, **_tol("recurrent_gated_delta_rule"))
        untouched = [i for i in range(6) if i not in (4, 1)]
        assert torch.equal(work[untouched], before[untouched])


def test_decode_after_prefill_equals_one_long_prefill():
    """Prefill 70 tokens (two chunks), then decode 5 one at a time from the final state: the
    outputs are those of a 75-token prefill."""
    q, k, v, a, b, A_log, dt_bias, _ = _gdn_inputs([75], seed=5)  # noqa: N806
    chunk = impls("chunk_gated_delta_rule")[0].fn
    gating = impls("gdn_gating")[0].fn
    step = impls("recurrent_gated_delta_rule")[0].fn
    g, beta = gating(None, A_log, a, b, dt_bias)
    whole, _ = chunk(None, q, k, v, g, beta, None, torch.tensor([0, 75]))
    head, state = chunk(None, q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70], None,
                        torch.tensor([0, 70]))
    pool = torch.zeros(2, *state.shape[1:])
    pool[1] = state[0]
    outs = [head]
    for t in range(70, 75):
        outs.append(step(None, q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], a[t:t + 1], b[t:t + 1],
                         A_log, dt_bias, pool, torch.tensor([1]), torch.tensor([0, 1])))
    torch.testing.assert_close(torch.cat(outs, 1), whole, **_tol("chunk_gated_delta_rule"))


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("channel_last", [False, True], ids=["contiguous", "channel-last"])
def test_causal_conv1d_matches_oracle_and_keeps_windows(with_state, channel_last):
    """Also on the channel-last x that SGLang's GDN backend passes (a [dim, T] view of its
    [T, dim] projection): the output keeps x's layout, as SGLang's kernel's does."""
    dim, width, lengths = 12, 4, [1, 2, 9]
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(sum(lengths), dim, generator=gen).T if channel_last else torch.randn(
        dim, sum(lengths), generator=gen)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    states = torch.randn(5, dim, width - 1, generator=gen)
    slots = torch.tensor([3, 0, 2], dtype=torch.int32)
    has = torch.tensor([with_state] * 3)
    cu = torch.tensor([0, 1, 3, 12], dtype=torch.int32)
    for impl in impls("causal_conv1d"):
        work = states.clone()
        out = impl.fn(None, x, weight, bias, work, cu, slots, has, "silu")
        assert out.shape == x.shape and out.stride() == x.stride(), impl.impl_id
        for i, slot in enumerate(slots.tolist()):
            s, e = int(cu[i]), int(cu[i + 1])
            prefix = states[slot] if with_state else torch.zeros(dim, width - 1)
            torch.testing.assert_close(out[:, s:e].double(), oracle_conv(x[:, s:e], weight, bias, prefix),
                                       **_tol("causal_conv1d"))
            torch.testing.assert_close(work[slot], torch.cat((prefix, x[:, s:e]), -1)[:, -(width - 1):])


def test_causal_conv1d_update_continues_the_prefill():
    """A prefill of 6 tokens then 3 one-token updates equals a 9-token prefill."""
    dim, width = 8, 4
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(dim, 9, generator=gen)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    conv = impls("causal_conv1d")[0].fn
    update = impls("causal_conv1d_update")[0].fn
    states = torch.zeros(2, dim, width - 1)
    whole = conv(None, x, weight, bias, states.clone(), torch.tensor([0, 9]), torch.tensor([0]),
                 torch.tensor([False]), "silu")
    head = conv(None, x[:, :6], weight, bias, states, torch.tensor([0, 6]), torch.tensor([1]),
                torch.tensor([False]), "silu")
    steps = [update(None, x[:, t].unsqueeze(0), states, weight, bias, "silu", torch.tensor([1]))
             for t in range(6, 9)]
    torch.testing.assert_close(torch.cat([head] + [s.T for s in steps], -1), whole,
                               **_tol("causal_conv1d_update"))


@pytest.mark.parametrize("group_size", [None, 8])
@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_rms_norm_gated_matches_oracle(group_size, norm_before_gate):
    gen = torch.Generator().manual_seed(11)
    x, z = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(16, generator=gen))
    xd = x.double() * (F.silu(z.double()) if not norm_before_gate else 1)
    gs = group_size or 16
    grouped = xd.view(5, 16 // gs, gs)
    want = (grouped / torch.sqrt(grouped.pow(2).mean(-1, keepdim=True) + 1e-6)).view(5, 16)
    want = want * layer.weight.double()
    if norm_before_gate:
        want = want * F.silu(z.double())
    for impl in impls("rms_norm_gated"):
        got = impl.fn(layer, x, z, 1e-6, group_size, norm_before_gate)
        torch.testing.assert_close(got.double(), want, **_tol("rms_norm_gated"))


# -- SGLang's entry points ------------------------------------------------------------------------

def test_sglang_cpu_entry_points_reach_the_ops(sglang_with_plugin):
    """Empty mode: the sgl_kernel CPU GDN ops SGLang calls exist and run sglang-fl's ops."""
    import sgl_kernel.mamba as mamba

    from sglang_fl.compat import standin_calls

    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs([3, 2])  # noqa: N806
    g, beta = torch.ops.sgl_kernel.fused_gdn_gating_cpu(A_log, a, b, dt_bias)
    want_g, want_beta = impls("gdn_gating")[0].fn(None, A_log, a, b, dt_bias)
    assert torch.equal(g, want_g) and torch.equal(beta, want_beta)
    pool = torch.zeros(4, 4, v.shape[3], k.shape[3])
    out, final, h = mamba.chunk_gated_delta_rule_cpu(q=q, k=k, v=v, g=g, beta=beta,
                                                      initial_state=pool[[1, 2]], cu_seqlens=cu,
                                                      head_first=False, use_qk_l2norm_in_kernel=True)
    assert out.shape == v.shape and final.shape == (2, 4, v.shape[3], k.shape[3]) and h is None
    o = torch.ops.sgl_kernel.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=A_log, dt_bias=dt_bias, q=q[:, :1], k=k[:, :1], v=v[:, :1], a=a[:1], b=b[:1],
        initial_state_source=pool, initial_state_indices=torch.tensor([1]),
        cu_seqlens=torch.tensor([0, 1]), use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
        softplus_threshold=20.0)
    assert o.shape == (1, 1, 4, v.shape[3]) and pool[1].abs().sum() > 0
    x = torch.randn(6, 5)
    states = torch.zeros(2, 6, 3)
    y = mamba.causal_conv1d_fn_cpu(x, torch.randn(6, 4), None, activation="silu",
                                   conv_states=states, has_initial_state=torch.tensor([False]),
                                   cache_indices=torch.tensor([1]),
                                   query_start_loc=torch.tensor([0, 5]), seq_lens_cpu=[5])
    assert y.shape == x.shape and torch.equal(states[1], x[:, -3:])
    y1 = mamba.causal_conv1d_update_cpu(torch.randn(1, 6), states, torch.randn(6, 4), None, "silu",
                                        conv_state_indices=torch.tensor([1]))
    assert y1.shape == (1, 6)
    with pytest.raises(ValueError, match="speculative"):
        mamba.causal_conv1d_update_cpu(torch.randn(1, 6), states, torch.randn(6, 4), None, "silu",
                                       conv_state_indices=torch.tensor([1]),
                                       intermediate_conv_window=torch.zeros(1))
    assert not [c for c in standin_calls() if "mamba" in c or "gdn" in c]


def test_sglang_fla_gated_norm_is_routed(sglang_with_plugin):
    import sys

    from sglang_fl.sglang_glue.adapters import get_adapter

    RMSNorm = get_adapter().layer_class("RMSNormGated")  # noqa: N806 - SGLang's FLA norm
    rms_norm_ref = sys.modules[RMSNorm.__module__].rms_norm_ref
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x, z = torch.randn(3, 16), torch.randn(3, 16)
    got = norm(x, z)
    assert norm.__dict__["_forward_method"] is not None  # bound through the router
    torch.testing.assert_close(got, rms_norm_ref(x, norm.weight, None, z=z, eps=1e-6),
                               **_tol("rms_norm_gated"))


def test_qwen3_5_fused_cpu_ops_equal_the_unfused_math(sglang_with_plugin):
    """The four fused CPU ops SGLang 0.5.23's Qwen3.5 module binds at import (empty mode)."""
    ops = torch.ops.sgl_kernel
    gen = torch.Generator().manual_seed(13)
    tokens, heads, kv_heads, hd = 3, 4, 2, 8
    qw, kw = torch.randn(hd, generator=gen), torch.randn(hd, generator=gen)

    def gemma(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + w)).to(x.dtype)

    q, k = torch.randn(tokens, heads * hd, generator=gen), torch.randn(tokens, kv_heads * hd, generator=gen)
    qn, kn = ops.fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, 1e-6, hd)
    torch.testing.assert_close(qn, gemma(q.view(-1, hd), qw))
    torch.testing.assert_close(kn, gemma(k.view(-1, hd), kw))
    q_gate = torch.randn(tokens, heads * 2 * hd, generator=gen)
    qn, kn, gate = ops.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, 1e-6, hd, heads)
    q_only, g_only = q_gate.view(tokens, heads, 2 * hd).chunk(2, dim=-1)
    torch.testing.assert_close(qn, gemma(q_only.reshape(-1, hd), qw))
    assert torch.equal(gate, g_only)
    x = torch.randn(tokens, heads * hd, generator=gen)
    want = x * torch.sigmoid(g_only).reshape(x.shape)
    ops.fused_sigmoid_mul_cpu(x, g_only)
    torch.testing.assert_close(x, want)
    nk, nv, dk, dv = 2, 4, 8, 4
    qkvz = torch.randn(tokens, 2 * nk * dk + 2 * nv * dv, generator=gen)
    ba = torch.randn(tokens, 2 * nv, generator=gen)
    mixed, z, b, a = ops.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, nk, nv, dk, dv)
    assert torch.equal(mixed, qkvz[:, :2 * nk * dk + nv * dv])
    assert torch.equal(z, qkvz[:, 2 * nk * dk + nv * dv:].view(tokens, nv, dv))
    assert torch.equal(b, ba[:, :nv]) and torch.equal(a, ba[:, nv:])
    with pytest.raises(ValueError, match="qkvz"):
        ops.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz[:, 1:], ba, nk, nv, dk, dv)
