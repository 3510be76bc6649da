"""The bound launch (``sglang_fl/kernels/launch.py``) on the GPU: sglang-fl's RoPE, SiLU-and-mul
and RMSNorm kernels write exactly what ``kernel[grid]`` writes, call after call, over sizes
that change Triton's specialisation between calls (token counts of 1, 16, 17 and 4,096; rows
whose start is not 16-byte aligned), in eager mode and replayed in a CUDA graph; and the bound
path is the one taken (its runners are cached). Needs torch with CUDA and Triton only:

    pytest tests/gpu/test_bound_launch.py -m gpu
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here; CI has none) -- see docs/air-gapped-install.md",
                allow_module_level=True)
pytest.importorskip("triton", reason="the kernels are Triton")

from sglang_fl.kernels import launch, rms_norm, rope, silu_mul  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = (1, 16, 17, 4096, 17, 1)


def _calls(tokens, offset):
    """The three kernels' calls on ``tokens`` rows, as closures returning what they wrote; with
    ``offset`` the rows start one element into their buffer (not 16-byte aligned)."""
    g = torch.Generator(device="cuda").manual_seed(tokens * 7 + offset)
    dt = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(dt)

    hd, hq, hk = 64, 14, 2
    wide_qkv = rnd(tokens, (hq + 2 * hk) * hd + offset)  # rows sliced at offset below
    pos = torch.randint(0, 4096, (tokens,), device="cuda", generator=g)
    inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
    freqs = torch.outer(torch.arange(4096, device="cuda").float(), inv)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    gate_up = rnd(tokens, 2 * 4864 + offset)[:, offset:]
    n = 40 if tokens == 17 else 896  # a row that is no multiple of 16 channels too
    wide_x = rnd(tokens, n + offset)  # rows sliced at offset below: misaligned with offset 1
    res, post = (rnd(tokens, n) for _ in range(2))
    w = rnd(n)

    # A clone of a strided view is made contiguous: clone the wide buffer, then slice it.
    def rope_call():
        buf = wide_qkv.clone()[:, offset:]
        q, k = buf[:, :hq * hd], buf[:, hq * hd:(hq + hk) * hd]
        rope.rotary_embedding_inplace(q, k, cos, sin, pos, hd)
        return buf

    def norm_call(residual, with_post, gemma):
        xs, rs = wide_x.clone()[:, offset:], res.clone() if residual else None
        if gemma:
            out = rms_norm.gemma_rms_norm(xs, w, 1e-6, rs)
        else:
            out = rms_norm.rms_norm(xs, w, 1e-6, rs, post if with_post else None)
        return torch.cat([t.flatten() for t in (out if residual else (out,))])

    return {"rope": rope_call, "silu_and_mul": lambda: silu_mul.silu_and_mul(gate_up),
            "rms_norm": lambda: norm_call(False, False, False),
            "fused_add_rms_norm": lambda: norm_call(True, False, False),
            "rms_norm_post": lambda: norm_call(True, True, False),
            "gemma_rms_norm": lambda: norm_call(True, False, True)}


KERNELS = (rope._kernel, silu_mul._kernel, rms_norm._kernel)


def _synced(call):
    out = call()
    torch.cuda.synchronize()
    return out


@pytest.fixture
def both_paths():
    """Runs a closure through ``kernel[grid]`` or through the bound launch. The unbound run
    sets the three kernels aside for its duration and puts their bound state back, so one
    cache of runners lives through every size and offset of a test: a key that missed a
    specialisation would hand a later call a kernel compiled for another."""
    launch.reset()
    launch.set_enabled(True)

    def run(call, bound):
        if bound:  # what this call binds stays bound for the calls after it
            return _synced(call)
        saved = dict(launch._BOUND)
        launch._BOUND.update({k(): None for k in KERNELS})
        try:
            return _synced(call)
        finally:
            launch._BOUND.clear()
            launch._BOUND.update(saved)
    yield run
    launch.reset()


def test_bound_launches_write_what_kernel_grid_writes(both_paths):
    for _ in range(2):  # the first call of a specialisation misses, later ones hit
        for offset in (0, 1):
            for tokens in TOKENS:
                for name, call in _calls(tokens, offset).items():
                    want = both_paths(call, bound=False)
                    got = both_paths(call, bound=True)
                    assert torch.equal(got, want), f"{name}, {tokens} tokens, offset {offset}"
    bound = {k(): launch._BOUND.get(k()) for k in KERNELS}
    assert all(bound.values()), f"kernels not bound: {bound}"
    # Several specialisations each (alignment, 1 / 16 / 17 tokens), all kept side by side.
    assert all(len(b._entries) >= 2 for b in bound.values()), {
        k.__name__: len(b._entries) for k, b in bound.items()}


def test_bound_launches_replay_in_a_cuda_graph(both_paths):
    calls = _calls(17, 0)
    want = {name: both_paths(call, bound=False) for name, call in calls.items()}
    launch.set_enabled(True)
    for call in calls.values():  # warm: compiled and bound before the capture
        call()
    outs = {}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for name, call in calls.items():
            outs[name] = call()
    for name in outs:
        outs[name].zero_()
    graph.replay()
    torch.cuda.synchronize()
    for name, got in outs.items():
        assert torch.equal(got, want[name]), name
