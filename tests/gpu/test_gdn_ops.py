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

from gpu_support import DK, DV, f32, gdn_inputs, gen, grid, implements  # noqa: E402

from sglang_fl.dispatch.limits import InputsDeclined  # noqa: E402
from sglang_fl.dispatch.ops import op_spec  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = (torch.bfloat16, torch.float32)
LENGTHS = ([1], [64], [65], [130, 7, 1])
HEADS = ((16, 32), (16, 48))  # (key heads, value heads)
DEFAULT_HEADS = HEADS[:1]


def run_or_declined(impl, *args):
    """``impl.fn(None, *args)``, or None where its declared limits refuse the inputs: then the
    refusal must name the limit (the dispatch hands such calls on; tests/integration checks the
    hand-over). A kernel crash is never an accepted outcome."""
    if impl.limits is None:
        return impl.fn(None, *args)
    try:
        return impl.fn(None, *args)
    except InputsDeclined as exc:
        assert "takes" in str(exc) or ":" in str(exc), exc
        return None


def close(got, want, op, dtype, what):
    tol = op_spec(op).tolerance.for_dtype(dtype)
    torch.testing.assert_close(got.float(), want.float(), msg=lambda m: f"{op} {what}: {m}", **tol)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads", grid(HEADS, DEFAULT_HEADS), ids=lambda h: f"h{h[0]}-hv{h[1]}")
def test_gdn_gating(backend, reference, heads, dtype):
    fn = implements(backend, "gdn_gating").fn
    _, _, _, a, b, A_log, dt_bias, _ = gdn_inputs([130], heads, dtype)  # noqa: N806
    g, beta = fn(None, A_log, a, b, dt_bias)
    g_ref, beta_ref = reference.gdn_gating(None, A_log, *f32(a, b), dt_bias)
    close(g, g_ref, "gdn_gating", dtype, "g")
    close(beta, beta_ref, "gdn_gating", dtype, "beta")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda L: "+".join(map(str, L)))
@pytest.mark.parametrize("heads", grid(HEADS, DEFAULT_HEADS), ids=lambda h: f"h{h[0]}-hv{h[1]}")
def test_chunk_gated_delta_rule(backend, reference, heads, lengths, with_state, dtype):
    impl = implements(backend, "chunk_gated_delta_rule")
    q, k, v, a, b, A_log, dt_bias, cu = gdn_inputs(lengths, heads, dtype)  # noqa: N806
    g, beta = reference.gdn_gating(None, A_log, *f32(a, b), dt_bias)
    init = (0.1 * torch.randn(len(lengths), heads[1], DV, DK, device="cuda", generator=gen(1))
            if with_state else None)
    got = run_or_declined(impl, q, k, v, g, beta, None if init is None else init.clone(), cu)
    if got is None:
        pytest.skip(f"{impl.impl_id} declines {dtype} (declared: {impl.limits.describe()})")
    out, final = got
    out_ref, final_ref = reference.chunk_gated_delta_rule(
        None, *f32(q, k, v), g, beta, None if init is None else init.clone(), cu)
    close(out, out_ref, "chunk_gated_delta_rule", dtype, "output")
    close(final, final_ref, "chunk_gated_delta_rule", dtype, "final state")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16], ids=["fp32-pool", "bf16-pool"])
@pytest.mark.parametrize("lengths", [[1], [1] * 3, [1] * 32, [1] * 80, [1, 3, 2]],
                         ids=["1", "3", "32", "80", "1+3+2"])  # 80: past FlagGems' 64-token switch
def test_recurrent_gated_delta_rule_updates_the_pool_in_place(backend, reference, lengths,
                                                               pool_dtype, dtype):
    """Decode batches, and sequences of several tokens (the op allows them: each runs its
    tokens through its state in order), on an fp32 or a bf16 state pool. The last two are
    sglang-fl's own kernel's (flagos) cases: SGLang serves decode with one token per sequence
    and keeps the pool in fp32 by default, so its kernel is held to that."""
    if backend.name != "flagos" and (pool_dtype != torch.float32 or len(set(lengths)) > 1):
        pytest.skip("SGLang's kernel is checked on what SGLang sends it")
    fn = implements(backend, "recurrent_gated_delta_rule").fn
    heads, batch = HEADS[0], len(lengths)
    q, k, v, a, b, A_log, dt_bias, cu = gdn_inputs(lengths, heads, dtype, seed=3)  # noqa: N806
    pool = (0.1 * torch.randn(batch + 2, heads[1], DV, DK, device="cuda",
                              generator=gen(2))).to(pool_dtype)
    slots = torch.arange(1, batch + 1, dtype=torch.int32, device="cuda").flip(0)
    if batch > 1:
        slots[1] = -1  # a request without a state slot: nothing read or written
    work, work_ref = pool.clone(), pool.clone()
    out = fn(None, q, k, v, a, b, A_log, dt_bias, work, slots, cu)
    out_ref = reference.recurrent_gated_delta_rule(None, *f32(q, k, v, a, b), A_log, dt_bias,
                                                   work_ref, slots, cu)
    close(out, out_ref, "recurrent_gated_delta_rule", dtype, "output")
    # A bf16 pool: the two fp32 states may round to neighbouring bf16 values.
    close(work, work_ref, "recurrent_gated_delta_rule",
          torch.bfloat16 if pool_dtype == torch.bfloat16 else dtype, "state pool")


@pytest.mark.parametrize("op", ["recurrent_gated_delta_rule", "packed_recurrent_gated_delta_rule"])
@pytest.mark.parametrize("batch", [1, 48])
def test_decode_replays_in_a_cuda_graph_as_it_runs_eagerly(backend, op, batch):
    """SGLang decodes under a CUDA graph: the call captured once and replayed on new inputs
    copied into its buffers (as SGLang's graph runner does) gives the eager call's output and
    pool. A kernel that read a host value, or sized itself by one, fails here."""
    impl = implements(backend, op)
    heads = HEADS[1]
    hv = heads[1]

    def inputs(seed):
        q, k, v, a, b, A_log, dt_bias, cu = gdn_inputs([1] * batch, heads, torch.bfloat16, seed)  # noqa: N806
        if op == "recurrent_gated_delta_rule":
            return (q, k, v, a, b, A_log, dt_bias), cu
        mixed = torch.cat([q[0].flatten(1), k[0].flatten(1), v[0].flatten(1)], dim=1)
        return (mixed, a, b, A_log, dt_bias), None

    args, cu = inputs(4)
    pool = 0.1 * torch.randn(batch + 1, hv, DV, DK, device="cuda", generator=gen(5))
    slots = torch.arange(batch, 0, -1, dtype=torch.int32, device="cuda")
    tail = (slots, cu) if cu is not None else (slots,)
    captured_pool = pool.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # first call (compiles) off the capture, as SGLang warms up
        impl.fn(None, *args, pool.clone(), *tail)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = impl.fn(None, *args, captured_pool, *tail)
    new_args, _ = inputs(6)
    for buf, value in zip(args, new_args, strict=True):
        buf.copy_(value)
    captured_pool.copy_(pool)
    graph.replay()
    eager_pool = pool.clone()
    want = impl.fn(None, *new_args, eager_pool, *tail)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, want, msg=lambda m: f"{op} output, graph vs eager: {m}")
    torch.testing.assert_close(captured_pool, eager_pool, msg=lambda m: f"{op} pool: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "continued"])
def test_causal_conv1d_and_its_windows(backend, reference, with_state, dtype):
    fn = implements(backend, "causal_conv1d").fn
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
    fn = implements(backend, "causal_conv1d_update").fn
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
    fn = implements(backend, "rms_norm_gated").fn
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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("batch", [1, 3, 32, 80])  # 80: past FlagGems' 64-token kernel switch
@pytest.mark.parametrize("heads", grid(HEADS, DEFAULT_HEADS), ids=lambda h: f"h{h[0]}-hv{h[1]}")
def test_packed_recurrent_gated_delta_rule(backend, reference, heads, batch, dtype):
    """The packed decode (rows q | k | v, as TritonGDNKernel.packed_decode gets them) against the
    reference, through a pool with a slot-less request."""
    impl = implements(backend, "packed_recurrent_gated_delta_rule")
    h, hv = heads
    q, k, v, a, b, A_log, dt_bias, _ = gdn_inputs([1] * batch, heads, dtype, seed=5)  # noqa: N806
    mixed = torch.cat((q.reshape(batch, h * DK), k.reshape(batch, h * DK),
                       v.reshape(batch, hv * DV)), dim=-1).contiguous()
    pool = 0.1 * torch.randn(batch + 2, hv, DV, DK, device="cuda", generator=gen(6))
    slots = torch.arange(1, batch + 1, dtype=torch.int32, device="cuda").flip(0)
    if batch > 1:
        slots[1] = -1
    work, work_ref = pool.clone(), pool.clone()
    out = run_or_declined(impl, mixed, a, b, A_log, dt_bias, work, slots)
    if out is None:
        pytest.skip(f"{impl.impl_id} declines {dtype} (declared: {impl.limits.describe()})")
    out_ref = reference.packed_recurrent_gated_delta_rule(None, mixed.float(), *f32(a, b), A_log,
                                                          dt_bias, work_ref, slots)
    rows = slots >= 0  # a slot-less row is padding: its output is unspecified (op table)
    close(out[:, rows], out_ref[:, rows], "packed_recurrent_gated_delta_rule", dtype, "output")
    close(work, work_ref, "packed_recurrent_gated_delta_rule", dtype, "state pool")


def test_flagos_chunk_rule_runs_in_a_fresh_process():
    """FlagGems' chunk kernel needs a Triton allocator: the backend sets it when it starts, so a
    process that does nothing but build the backend and call the op gets a result."""
    import subprocess
    import sys

    code = """
import torch
from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
from sglang_fl.dispatch.backends.reference import ReferenceBackend
b = FlagGemsBackend(); assert b.available(), b.unavailable_reason
T, H, HV, D = 130, 2, 4, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k = (torch.randn(1, T, H, D, device="cuda", generator=g).bfloat16() for _ in range(2))
v = torch.randn(1, T, HV, D, device="cuda", generator=g).bfloat16()
gg = -torch.rand(1, T, HV, device="cuda", generator=g)
beta = torch.rand(1, T, HV, device="cuda", generator=g)
cu = torch.tensor([0, T], device="cuda", dtype=torch.int32)
out, final = b.chunk_gated_delta_rule(None, q, k, v, gg, beta, None, cu)
ref, _ = ReferenceBackend().chunk_gated_delta_rule(None, q.float(), k.float(), v.float(), gg, beta, None, cu)
torch.testing.assert_close(out.float(), ref.float(), atol=3e-2, rtol=3e-2)
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stderr[-3000:]
