"""The Gated DeltaNet ops (Qwen3.5/3.6 linear attention) on the GPU: each non-reference backend
that implements an op (FlagGems ``flagos``, SGLang's Triton kernels ``vendor.cuda``) against the
plugin's pure-PyTorch reference on the same device in float32. The reference itself is checked
against float64 token-by-token oracles on CPU (tests/integration/test_gdn_numerics.py).

Shapes are Qwen3.6-35B-A3B's (16 key heads, 32 value heads, head dims 128, conv width 4) and
Qwen3.6-27B's value-head count (48); sequence lengths cross the 64-token chunk boundary, several
sequences share a batch, with and without initial states; decode reads and writes a state pool
through slot indices (-1: no state).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here; CI has none) -- see docs/air-gapped-install.md",
                allow_module_level=True)

from gpu_support import sglang_ready, skip_unless_implemented  # noqa: E402

from sglang_fl.dispatch.ops import op_spec  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float32)
LENGTHS = ([1], [64], [65], [130, 7, 1])
HEADS = ((16, 32), (16, 48))  # (key heads, value heads)
DK = DV = 128


def implements(backend, op):
    skip_unless_implemented(backend, op)
    sglang_ready()
    return getattr(backend, op)


def close(got, want, op, dtype, what):
    tol = op_spec(op).tolerance.for_dtype(dtype)
    torch.testing.assert_close(got.float(), want.float(), msg=lambda m: f"{op} {what}: {m}", **tol)


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def gdn_inputs(lengths, heads, dtype, seed=0):
    h, hv = heads
    g, total = gen(seed), sum(lengths)
    q = torch.randn(1, total, h, DK, device="cuda", generator=g).to(dtype)
    k = torch.randn(1, total, h, DK, device="cuda", generator=g).to(dtype)
    v = torch.randn(1, total, hv, DV, device="cuda", generator=g).to(dtype)
    a = torch.randn(total, hv, device="cuda", generator=g).to(dtype)
    b = torch.randn(total, hv, device="cuda", generator=g).to(dtype)
    A_log = torch.rand(hv, device="cuda", generator=g) * 2 - 1  # noqa: N806
    dt_bias = torch.randn(hv, device="cuda", generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    return q, k, v, a, b, A_log, dt_bias, cu


def f32(*tensors):
    return tuple(None if t is None else t.float() for t in tensors)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}-hv{h[1]}")
def test_gdn_gating(backend, reference, heads, dtype):
    fn = implements(backend, "gdn_gating")
    _, _, _, a, b, A_log, dt_bias, _ = gdn_inputs([130], heads, dtype)  # noqa: N806
    g, beta = fn(None, A_log, a, b, dt_bias)
    g_ref, beta_ref = reference.gdn_gating(None, A_log, *f32(a, b), dt_bias)
    close(g, g_ref, "gdn_gating", dtype, "g")
    close(beta, beta_ref, "gdn_gating", dtype, "beta")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda L: "+".join(map(str, L)))
@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"h{h[0]}-hv{h[1]}")
def test_chunk_gated_delta_rule(backend, reference, heads, lengths, with_state, dtype):
    fn = implements(backend, "chunk_gated_delta_rule")
    q, k, v, a, b, A_log, dt_bias, cu = gdn_inputs(lengths, heads, dtype)  # noqa: N806
    g, beta = reference.gdn_gating(None, A_log, *f32(a, b), dt_bias)
    init = (0.1 * torch.randn(len(lengths), heads[1], DV, DK, device="cuda", generator=gen(1))
            if with_state else None)
    out, final = fn(None, q, k, v, g, beta, None if init is None else init.clone(), cu)
    out_ref, final_ref = reference.chunk_gated_delta_rule(
        None, *f32(q, k, v), g, beta, None if init is None else init.clone(), cu)
    close(out, out_ref, "chunk_gated_delta_rule", dtype, "output")
    close(final, final_ref, "chunk_gated_delta_rule", dtype, "final state")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 3, 32])
def test_recurrent_gated_delta_rule_updates_the_pool_in_place(backend, reference, batch, dtype):
    fn = implements(backend, "recurrent_gated_delta_rule")
    heads = HEADS[0]
    q, k, v, a, b, A_log, dt_bias, cu = gdn_inputs([1] * batch, heads, dtype, seed=3)  # noqa: N806
    pool = 0.1 * torch.randn(batch + 2, heads[1], DV, DK, device="cuda", generator=gen(2))
    slots = torch.arange(1, batch + 1, dtype=torch.int32, device="cuda").flip(0)
    if batch > 1:
        slots[1] = -1  # a request without a state slot: nothing read or written
    work, work_ref = pool.clone(), pool.clone()
    out = fn(None, q, k, v, a, b, A_log, dt_bias, work, slots, cu)
    out_ref = reference.recurrent_gated_delta_rule(None, *f32(q, k, v, a, b), A_log, dt_bias,
                                                   work_ref, slots, cu)
    close(out, out_ref, "recurrent_gated_delta_rule", dtype, "output")
    close(work, work_ref, "recurrent_gated_delta_rule", dtype, "state pool")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "continued"])
def test_causal_conv1d_and_its_windows(backend, reference, with_state, dtype):
    fn = implements(backend, "causal_conv1d")
    dim, width, lengths = 2 * 16 * DK + 32 * DV, 4, [1, 7, 130]
    g = gen(7)
    x = torch.randn(dim, sum(lengths), device="cuda", generator=g).to(dtype)
    weight = torch.randn(dim, width, device="cuda", generator=g).to(dtype)
    bias = torch.randn(dim, device="cuda", generator=g).to(dtype)
    states = torch.randn(5, dim, width - 1, device="cuda", generator=g).to(dtype)
    slots = torch.tensor([3, 0, 2], dtype=torch.int32, device="cuda")
    has = torch.tensor([with_state] * 3, device="cuda")
    cu = torch.tensor([0, 1, 8, 138], dtype=torch.int32, device="cuda")
    work, work_ref = states.clone(), states.float().clone()
    out = fn(None, x, weight, bias, work, cu, slots, has, "silu")
    out_ref = reference.causal_conv1d(None, *f32(x, weight, bias), work_ref, cu, slots, has, "silu")
    close(out, out_ref, "causal_conv1d", dtype, "output")
    close(work, work_ref, "causal_conv1d", dtype, "conv states")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 32])
def test_causal_conv1d_update(backend, reference, batch, dtype):
    fn = implements(backend, "causal_conv1d_update")
    dim, width, g = 2 * 16 * DK + 32 * DV, 4, gen(9)
    x = torch.randn(batch, dim, device="cuda", generator=g).to(dtype)
    weight = torch.randn(dim, width, device="cuda", generator=g).to(dtype)
    bias = torch.randn(dim, device="cuda", generator=g).to(dtype)
    states = torch.randn(batch + 1, dim, width - 1, device="cuda", generator=g).to(dtype)
    slots = torch.arange(batch, dtype=torch.int32, device="cuda") + 1
    work, work_ref = states.clone(), states.float().clone()
    out = fn(None, x, work, weight, bias, "silu", slots)
    out_ref = reference.causal_conv1d_update(None, x.float(), work_ref, *f32(weight, bias), "silu",
                                             slots)
    close(out, out_ref, "causal_conv1d_update", dtype, "output")
    close(work, work_ref, "causal_conv1d_update", dtype, "conv states")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 7, 1024])
@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_rms_norm_gated(backend, reference, tokens, norm_before_gate, dtype):
    fn = implements(backend, "rms_norm_gated")
    g = gen(11)
    x = torch.randn(tokens * 32, DV, device="cuda", generator=g).to(dtype)
    z = torch.randn(tokens * 32, DV, device="cuda", generator=g).to(dtype)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(DV, device="cuda", generator=g).to(dtype))
    got = fn(layer, x, z, 1e-6, None, norm_before_gate)
    ref_layer = torch.nn.Module()
    ref_layer.weight = torch.nn.Parameter(layer.weight.detach().float())
    want = reference.rms_norm_gated(ref_layer, x.float(), z.float(), 1e-6, None, norm_before_gate)
    close(got, want, "rms_norm_gated", dtype, "output")
