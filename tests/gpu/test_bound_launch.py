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
    qkv = rnd(tokens, (hq + 2 * hk) * hd + offset)[:, offset:]
    pos = torch.randint(0, 4096, (tokens,), device="cuda", generator=g)
    inv = 1.0 / (1e6 ** (torch.arange(0, hd, 2, device="cuda").float() / hd))
    freqs = torch.outer(torch.arange(4096, device="cuda").float(), inv)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    gate_up = rnd(tokens, 2 * 4864 + offset)[:, offset:]
    x, res, post = (rnd(tokens, 896) for _ in range(3))
    w = rnd(896)

    def rope_call():
        buf = qkv.clone()
        q, k = buf[:, :hq * hd], buf[:, hq * hd:(hq + hk) * hd]
        rope.rotary_embedding_inplace(q, k, cos, sin, pos, hd)
        return buf

    def norm_call(residual, with_post, gemma):
        xs, rs = x.clone(), res.clone() if residual else None
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


@pytest.fixture
def both_paths():
    """Runs a closure through ``kernel[grid]`` (bound launch off) and through the bound launch."""
    def run(call, bound):
        launch.set_enabled(bound)
        try:
            out = call()
            torch.cuda.synchronize()
            return out
        finally:
            launch.set_enabled(True)
    yield run
    launch.reset()


@pytest.mark.parametrize("offset", [0, 1])
def test_bound_launches_write_what_kernel_grid_writes(both_paths, offset):
    for tokens in TOKENS:
        calls = _calls(tokens, offset)
        want = {name: both_paths(call, bound=False) for name, call in calls.items()}
        for _ in range(2):  # the first call of a specialisation misses, the second hits
            for name, call in calls.items():
                got = both_paths(call, bound=True)
                assert torch.equal(got, want[name]), f"{name}, {tokens} tokens, offset {offset}"
    bound = [b for b in launch._BOUND.values() if b is not None]
    assert len(bound) == 3, f"kernels not bound: {launch._BOUND}"
    assert all(b._entries for b in bound), "no runner was cached"


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
