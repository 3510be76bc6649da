"""CUDA-graph capture and replay of every routed layer.

SGLang serves decode from captured CUDA graphs, so each layer routed by sglang-fl must capture
(no host sync, no allocation outside the graph pool, no per-call Python state baked in) and give
the right answer when the graph is replayed on new inputs. The layers are real SGLang layers,
routed through sglang-fl's own Layer-2 glue with the backend pinned (strict).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here; CI has none) -- see docs/air-gapped-install.md",
                allow_module_level=True)

from gpu_support import assert_close, make_rms_norm, make_rope, make_silu_and_mul  # noqa: E402

pytestmark = pytest.mark.gpu

OPS = ("rms_norm", "silu_and_mul", "rotary_embedding", "gemma_rms_norm")


@pytest.fixture(params=["flagos", "vendor"])
def routed(request, monkeypatch):
    """A function that routes a real SGLang layer through sglang-fl, every op pinned to one
    backend kind, strict."""
    kind = request.param
    if kind == "vendor":
        request.getfixturevalue("cuda_vendor")  # skips where SGLang's kernels are absent
    from sglang_fl.config import get_settings, reset_settings
    from sglang_fl.dispatch import get_manager, reset_manager
    from sglang_fl.sglang_glue.layer_hook import LayerRouter

    monkeypatch.setenv("SGLANG_FL_PER_OP", ";".join(f"{op}={kind}" for op in OPS))
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    reset_settings()
    reset_manager()
    router = LayerRouter(get_settings(), get_manager())

    def route(layer):
        op = router.route_for(type(layer)).op_name
        if kind == "vendor" and not any(i.kind.value == "vendor"
                                        for i in get_manager().registry.impls(op)):
            pytest.skip(f"vendor.cuda has no {op} here (e.g. sgl_kernel not installed)")
        resolved = get_manager().resolve(op)
        assert resolved.impl.kind.value == kind, resolved.impl.label
        layer._forward_method = router.bind(layer, layer._forward_method)
        return layer

    yield route
    monkeypatch.undo()
    reset_settings()
    reset_manager()


def capture_and_replay(fn, inputs, make_inputs, expected_fn, what):
    """Capture ``fn()`` (which reads the static ``inputs``), replay it on fresh inputs and
    compare each replay with ``expected_fn(new_inputs)``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: Triton/JIT compilation must precede capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    for seed in (101, 202, 303):
        new = make_inputs(seed)
        for static, value in zip(inputs, new, strict=True):
            static.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        expected = expected_fn(new)
        outs = out if isinstance(out, tuple) else (out,)
        exps = expected if isinstance(expected, tuple) else (expected,)
        for i, (got, exp) in enumerate(zip(outs, exps, strict=True)):
            assert_close(got, exp, f"{what} replay seed={seed} output {i}")


def _randn(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("tokens", (1, 32, 256))
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("gemma", [False, True], ids=["rmsnorm", "gemma"])
def test_rms_norm_graph(routed, reference, tokens, dtype, residual, gemma):
    hidden = 896
    layer = routed(make_rms_norm(hidden, dtype, gemma=gemma))
    ref = reference.gemma_rms_norm if gemma else reference.rms_norm

    def make(seed):
        return [_randn((tokens, hidden), dtype, seed), _randn((tokens, hidden), dtype, seed + 1)]

    static_x, static_r = make(0)
    work_x, work_r = static_x.clone(), static_r.clone()
    if residual:
        def fn():  # the fused op updates its inputs in place: start each replay from the statics
            work_x.copy_(static_x)
            work_r.copy_(static_r)
            return layer(work_x, work_r)

        expected = lambda new: ref(layer, new[0].clone(), new[1].clone())  # noqa: E731
    else:
        fn = lambda: layer(static_x)  # noqa: E731
        expected = lambda new: ref(layer, new[0].clone())  # noqa: E731
    capture_and_replay(fn, [static_x, static_r], make, expected, type(layer).__name__)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("tokens", (1, 32, 256))
def test_silu_and_mul_graph(routed, reference, tokens, dtype):
    layer = routed(make_silu_and_mul())

    def make(seed):
        return [_randn((tokens, 2 * 4864), dtype, seed)]

    (static_x,) = make(0)
    capture_and_replay(lambda: layer(static_x), [static_x], make,
                       lambda new: reference.silu_and_mul(layer, new[0]), "SiluAndMul")


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("tokens", (1, 32, 256))
@pytest.mark.parametrize("shape", [(64, 64, 14, 2), (128, 64, 32, 8)], ids=["hd64", "hd128-partial"])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
def test_rotary_embedding_graph(routed, reference, tokens, dtype, shape, neox):
    head_size, rot_dim, qh, kh = shape
    layer = routed(make_rope(head_size, rot_dim, neox, dtype))
    cos, sin = (t.contiguous() for t in layer.cos_sin_cache.chunk(2, dim=-1))

    def make(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        pos = torch.randint(0, 4096, (tokens,), device="cuda", generator=g)
        return [pos, _randn((tokens, qh * head_size), dtype, seed + 1),
                _randn((tokens, kh * head_size), dtype, seed + 2)]

    static_pos, static_q, static_k = make(0)
    work_q, work_k = static_q.clone(), static_k.clone()

    def fn():  # SGLang's RoPE rotates q/k in place
        work_q.copy_(static_q)
        work_k.copy_(static_k)
        return layer(static_pos, work_q, work_k)

    def expected(new):  # fp32 oracle, as in test_ops.test_rotary_embedding
        q, k = reference.rotary_embedding(layer, new[1].float(), new[2].float(), cos, sin, new[0],
                                          not neox, True)
        return q.to(dtype), k.to(dtype)

    capture_and_replay(fn, [static_pos, static_q, static_k], make, expected, "RotaryEmbedding")
