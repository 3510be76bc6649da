"""Every routed op, on real SGLang layer objects: the plugin's path (reference backend, strict)
against SGLang's own ``forward_native``, across dtypes, token counts and real model shapes.

The norms must match forward_native bit for bit (the reference follows it step by step); the
backends whose kernels cannot run here are checked on small test doubles of those kernels."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.integration

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}
TOKENS = [1, 7, 128, 2048]
# Qwen2.5-0.5B, Llama-3-8B, Qwen2.5-14B/32B hidden sizes, and one that is no power of two
NORM_HIDDEN = [896, 1000, 4096, 5120]
NORM_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _close(a, b, dtype):
    torch.testing.assert_close(a, b, **TOL[dtype])


def _same(got, want, what):
    """Bit-for-bit equality, reporting how many elements differ and by how much otherwise."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype)
        diff = g != w
        assert not diff.any(), (
            f"{what}[{i}]: {int(diff.sum())}/{diff.numel()} elements differ, max "
            f"{(g.float() - w.float()).abs().max().item():.3g}")


def _norm_inputs(layer, tokens, hidden, dtype, seed):
    torch.manual_seed(seed)
    layer.weight.data.normal_(1.0 if type(layer).__name__ == "RMSNorm" else 0.0, 0.1)
    return (torch.randn(tokens, hidden, dtype=dtype), torch.randn(tokens, hidden, dtype=dtype),
            torch.randn(tokens, hidden, dtype=dtype))


@pytest.mark.parametrize("dtype", NORM_DTYPES, ids=str)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", NORM_HIDDEN)
@pytest.mark.parametrize("cls", ["RMSNorm", "GemmaRMSNorm"])
def test_norms_match_forward_native_bit_for_bit(sglang_with_plugin, cls, dtype, tokens, hidden):
    """Plain, with a residual, and with a residual plus ``post_residual_addition`` (which
    RMSNorm sums with x and the residual in fp32, GemmaRMSNorm in the input dtype)."""
    from sglang.srt.layers import layernorm

    layer = getattr(layernorm, cls)(hidden, eps=1e-6).to(dtype)
    x, res, post = _norm_inputs(layer, tokens, hidden, dtype, tokens + hidden)
    _same(layer.forward(x.clone()), layer.forward_native(x.clone()), "plain")
    _same(layer.forward(x.clone(), res.clone()), layer.forward_native(x.clone(), res.clone()),
          "residual")
    _same(layer.forward(x.clone(), res.clone(), post_residual_addition=post),
          layer.forward_native(x.clone(), res.clone(), post_residual_addition=post),
          "residual + post_residual_addition")
    _same(layer.forward(x.clone(), res.clone(), post),  # positional, as some models call it
          layer.forward_native(x.clone(), res.clone(), post), "positional post_residual_addition")
    assert layer._forward_method.__name__ == "forward"  # the bridge, bound after the first call
    assert layer._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"


def _fused_add_norm_fp32(a, b, weight, eps):
    """What the fused add-RMSNorm kernels (sgl_kernel, FlagGems, torch_npu) do: add their two
    inputs in fp32, normalise that fp32 sum, and round the sum they hand back as the residual."""
    s = a.float() + b.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return out.to(a.dtype), s.to(a.dtype)


class _SglKernel:
    """Test double of sgl_kernel's norms (in place: input <- normed, residual <- sum)."""

    @staticmethod
    def fused_add_rmsnorm(x, residual, weight, eps):
        out, total = _fused_add_norm_fp32(x, residual, weight, eps)
        x.copy_(out)
        residual.copy_(total)

    @staticmethod
    def gemma_fused_add_rmsnorm(x, residual, weight, eps):
        _SglKernel.fused_add_rmsnorm(x, residual, weight.float() + 1.0, eps)


class _FlagGems:
    """Test double of ``flag_gems.fused_add_rms_norm`` (in place, returns both)."""

    @staticmethod
    def fused_add_rms_norm(x, residual, shape, weight, eps):
        _SglKernel.fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual


class _TorchNpu:
    """Test double of torch_npu's norms (out of place)."""

    @staticmethod
    def npu_add_rms_norm(x1, x2, gamma, eps):
        out, total = _fused_add_norm_fp32(x1, x2, gamma, eps)
        return out, None, total

    @staticmethod
    def npu_gemma_rms_norm(x, gamma, eps):
        return _fused_add_norm_fp32(x, torch.zeros_like(x), gamma.float() + 1.0, eps)[0], None


def _backend_with_kernel_doubles(impl_id):
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.vendor.ascend.backend import AscendBackend
    from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend
    from sglang_fl.dispatch.backends.vendor.musa.backend import MusaBackend

    if impl_id == "flagos":
        backend = FlagGemsBackend()
        backend._gems = _FlagGems
    elif impl_id == "vendor.cuda":
        backend = CudaBackend()
        backend._sk = _SglKernel
    elif impl_id == "vendor.ascend":
        backend = AscendBackend()
        backend._npu = _TorchNpu
    else:
        backend = MusaBackend()  # its rms_norm is plain torch and runs here as it is
    return backend


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("hidden", [1000, 5120])
@pytest.mark.parametrize("impl_id", ["flagos", "vendor.cuda", "vendor.ascend", "vendor.musa"])
def test_kernel_backends_add_post_residual_addition_as_forward_native(sglang_with_plugin, impl_id,
                                                                      hidden, dtype):
    """Backends whose fused add takes two inputs: the residual they return is forward_native's
    to the bit, and the output normalises the fp32 sum of x, residual and the addition (a sum
    rounded twice in bf16 changes ~1 residual element in 5 and far more outputs)."""
    from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm

    backend = _backend_with_kernel_doubles(impl_id)
    layer = RMSNorm(hidden).to(dtype)
    x, res, post = _norm_inputs(layer, 64, hidden, dtype, hidden)
    for post_arg in (None, post):
        want = layer.forward_native(x.clone(), res.clone(), post_arg)
        got = backend.rms_norm(layer, x.clone(), res.clone(), post_arg)
        _same(got[1], want[1], f"{impl_id} residual (post {post_arg is not None})")
        _close(got[0], want[0], dtype)
        assert (got[0] != want[0]).float().mean() < 0.01  # only the kernel's reduction order
    if impl_id == "vendor.musa":
        return  # torch_musa has no Gemma norm kernel; the op falls through
    gemma = GemmaRMSNorm(hidden).to(dtype)
    x, res, post = _norm_inputs(gemma, 64, hidden, dtype, hidden)
    gemma.gemma_weight = gemma.weight.data + 1.0  # what SGLang's weight loader keeps up to date
    want = gemma.forward_native(x.clone(), res.clone(), post)
    got = backend.gemma_rms_norm(gemma, x.clone(), res.clone(), post)
    _same(got[1], want[1], f"{impl_id} gemma residual")
    _close(got[0], want[0], dtype)


def test_rms_norm_non_contiguous_and_3d_input(sglang_with_plugin):
    from sglang.srt.layers.layernorm import RMSNorm

    layer = RMSNorm(64)
    layer.weight.data.normal_(1.0, 0.1)
    base = torch.randn(16, 128)
    x = base[:, ::2]  # non-contiguous view
    assert not x.is_contiguous()
    _same(layer.forward(x), layer.forward_native(x), "non-contiguous")
    xt = torch.randn(64, 16).t()  # transposed: to(float32) would keep this layout
    _same(layer.forward(xt), layer.forward_native(xt), "transposed")
    x3 = torch.randn(2, 5, 64)
    _same(layer.forward(x3), layer.forward_native(x3), "3-D")


def test_rms_norm_with_unsupported_options_keeps_sglang_forward(sglang_with_plugin):
    from sglang.srt.layers.layernorm import RMSNorm

    layer = RMSNorm(64, var_hidden_size=32)
    x = torch.randn(3, 64)
    _close(layer.forward(x), layer.forward_native(x), torch.float32)
    assert getattr(layer._forward_method, "__self__", None) is layer  # SGLang's own method


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("intermediate", [4864, 14336])
def test_silu_and_mul(sglang_with_plugin, dtype, tokens, intermediate):
    from sglang.srt.layers.activation import SiluAndMul

    layer = SiluAndMul()
    x = torch.randn(tokens, 2 * intermediate, dtype=dtype)
    _close(layer.forward(x), layer.forward_native(x), dtype)
    xt = torch.randn(2 * intermediate, tokens, dtype=dtype).t()  # non-contiguous
    _close(layer.forward(xt), layer.forward_native(xt), dtype)


ROPE_CASES = [
    # head_size, rotary_dim, neox, heads_q, heads_k
    (64, 64, True, 14, 2),  # Qwen2.5-0.5B
    (128, 128, True, 32, 8),  # Llama-3-8B
    (128, 64, True, 8, 8),  # partial rotary (e.g. ChatGLM/Phi style)
    (64, 64, False, 4, 4),  # interleaved (GPT-J style)
    (128, 32, False, 4, 2),  # partial + interleaved
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 9, 512])
@pytest.mark.parametrize("case", ROPE_CASES, ids=lambda c: f"hs{c[0]}-rd{c[1]}-{'neox' if c[2] else 'gptj'}")
def test_rotary_embedding(sglang_with_plugin, dtype, tokens, case):
    from sglang.srt.layers.rotary_embedding import get_rope

    head_size, rot, neox, hq, hk = case
    rope = get_rope(head_size, rot, 4096, 10000, neox, dtype=dtype)
    positions = torch.randint(0, 4000, (tokens,))
    # q and k as views of one fused qkv tensor, as in real attention layers (non-contiguous)
    qkv = torch.randn(tokens, (hq + 2 * hk) * head_size, dtype=dtype)
    q, k, _ = qkv.split([hq * head_size, hk * head_size, hk * head_size], dim=-1)
    want_q, want_k = rope.forward_native(positions, q.clone(), k.clone())
    got_q, got_k = rope.forward(positions, q.clone(), k.clone())
    _close(got_q, want_q, dtype)
    _close(got_k, want_k, dtype)
    # in place on the views, like SGLang's CUDA kernel
    got_q, got_k = rope.forward(positions, q, k)
    _close(q, want_q, dtype)
    _close(k, want_k, dtype)


def test_rotary_offsets(sglang_with_plugin):
    from sglang.srt.layers.rotary_embedding import get_rope

    rope = get_rope(64, 64, 2048, 10000, True, dtype=torch.float32)
    positions = torch.arange(6)
    offsets = torch.full((6,), 100)
    q, k = torch.randn(6, 4 * 64), torch.randn(6, 64)
    want = rope.forward_native(positions, q.clone(), k.clone(), offsets)
    got = rope.forward(positions, q.clone(), k.clone(), offsets)
    _close(got[0], want[0], torch.float32)
    _close(got[1], want[1], torch.float32)


def test_rope_subclass_with_its_own_cache_is_routed(sglang_with_plugin):
    from sglang.srt.layers.rotary_embedding import get_rope

    rope = get_rope(64, 64, 2048, 10000, True, rope_scaling={"rope_type": "linear", "factor": 2.0},
                    dtype=torch.float32)
    assert type(rope).__name__ != "RotaryEmbedding"
    pos = torch.arange(5)
    q, k = torch.randn(5, 128), torch.randn(5, 64)
    want = rope.forward_native(pos, q.clone(), k.clone())
    got = rope.forward(pos, q.clone(), k.clone())
    _close(got[0], want[0], torch.float32)
    assert rope._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"
