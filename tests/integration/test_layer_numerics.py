"""Every routed op, on real SGLang layer objects: the plugin's path (reference backend, strict)
against SGLang's own ``forward_native``, across dtypes, token counts and real model shapes.

The norms and mRoPE must match forward_native bit for bit (the reference follows it step by
step); the backends whose kernels cannot run here are checked on small test doubles of those
kernels, and every backend is shown to read only the layer attributes its op's table entry
lists (those SGLang and vLLM share)."""

from __future__ import annotations

import pytest
import torch

from sglang_fl.dispatch.ops import op_spec

pytestmark = pytest.mark.integration

TOKENS = [1, 7, 128, 2048]
# Qwen2.5-0.5B, Llama-3-8B, Qwen2.5-14B/32B hidden sizes, and one that is no power of two
NORM_HIDDEN = [896, 1000, 4096, 5120]
NORM_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _close(a, b, dtype, op):
    """Within the op table's tolerance for ``op``."""
    torch.testing.assert_close(a, b, **op_spec(op).tolerance.for_dtype(dtype))


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

    @staticmethod
    def rmsnorm(x, weight, eps):
        return _fused_add_norm_fp32(x, torch.zeros_like(x), weight, eps)[0]

    @staticmethod
    def gemma_rmsnorm(x, weight, eps):
        return _fused_add_norm_fp32(x, torch.zeros_like(x), weight.float() + 1.0, eps)[0]


class _FlagGems:
    """Test double of FlagGems' norms (``fused_add_rms_norm`` in place, returns both)."""

    @staticmethod
    def fused_add_rms_norm(x, residual, shape, weight, eps):
        _SglKernel.fused_add_rmsnorm(x, residual, weight, eps)
        return x, residual

    @staticmethod
    def rms_norm(x, shape, weight, eps):
        return _fused_add_norm_fp32(x, torch.zeros_like(x), weight, eps)[0]


class _TorchNpu:
    """Test double of torch_npu's norms (out of place)."""

    @staticmethod
    def npu_add_rms_norm(x1, x2, gamma, eps):
        out, total = _fused_add_norm_fp32(x1, x2, gamma, eps)
        return out, None, total

    @staticmethod
    def npu_rms_norm(x, gamma, eps):
        return _fused_add_norm_fp32(x, torch.zeros_like(x), gamma, eps)[0], None

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
        _close(got[0], want[0], dtype, "rms_norm")
        assert (got[0] != want[0]).float().mean() < 0.01  # only the kernel's reduction order
    if impl_id == "vendor.musa":
        return  # torch_musa has no Gemma norm kernel; the op falls through
    gemma = GemmaRMSNorm(hidden).to(dtype)
    x, res, post = _norm_inputs(gemma, 64, hidden, dtype, hidden)
    want = gemma.forward_native(x.clone(), res.clone(), post)
    got = backend.gemma_rms_norm(gemma, x.clone(), res.clone(), post)
    _same(got[1], want[1], f"{impl_id} gemma residual")
    _close(got[0], want[0], dtype, "gemma_rms_norm")


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
    _close(layer.forward(x), layer.forward_native(x), torch.float32, "rms_norm")
    assert getattr(layer._forward_method, "__self__", None) is layer  # SGLang's own method


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("intermediate", [4864, 14336])
def test_silu_and_mul(sglang_with_plugin, dtype, tokens, intermediate):
    from sglang.srt.layers.activation import SiluAndMul

    layer = SiluAndMul()
    x = torch.randn(tokens, 2 * intermediate, dtype=dtype)
    _close(layer.forward(x), layer.forward_native(x), dtype, "silu_and_mul")
    xt = torch.randn(2 * intermediate, tokens, dtype=dtype).t()  # non-contiguous
    _close(layer.forward(xt), layer.forward_native(xt), dtype, "silu_and_mul")


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
    _close(got_q, want_q, dtype, "rotary_embedding")
    _close(got_k, want_k, dtype, "rotary_embedding")
    # in place on the views, like SGLang's CUDA kernel
    got_q, got_k = rope.forward(positions, q, k)
    _close(q, want_q, dtype, "rotary_embedding")
    _close(k, want_k, dtype, "rotary_embedding")


def test_rotary_offsets(sglang_with_plugin):
    from sglang.srt.layers.rotary_embedding import get_rope

    rope = get_rope(64, 64, 2048, 10000, True, dtype=torch.float32)
    positions = torch.arange(6)
    offsets = torch.full((6,), 100)
    q, k = torch.randn(6, 4 * 64), torch.randn(6, 64)
    want = rope.forward_native(positions, q.clone(), k.clone(), offsets)
    got = rope.forward(positions, q.clone(), k.clone(), offsets)
    _close(got[0], want[0], torch.float32, "rotary_embedding")
    _close(got[1], want[1], torch.float32, "rotary_embedding")


def test_rope_subclass_with_its_own_cache_is_routed(sglang_with_plugin):
    from sglang.srt.layers.rotary_embedding import get_rope

    rope = get_rope(64, 64, 2048, 10000, True, rope_scaling={"rope_type": "linear", "factor": 2.0},
                    dtype=torch.float32)
    assert type(rope).__name__ != "RotaryEmbedding"
    pos = torch.arange(5)
    q, k = torch.randn(5, 128), torch.randn(5, 64)
    want = rope.forward_native(pos, q.clone(), k.clone())
    got = rope.forward(pos, q.clone(), k.clone())
    _close(got[0], want[0], torch.float32, "rotary_embedding")
    assert rope._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"


# ---------------------------------------------------------------------------------------------
# mRoPE (MRotaryEmbedding)
# ---------------------------------------------------------------------------------------------

MROPE_CASES = [
    # head_size, partial rotary factor, mrope_section, interleaved, q heads, kv heads
    (256, 0.25, [11, 11, 10], True, 6, 1),  # Qwen3.5 / Qwen3.6 (27B: 24 q / 4 kv heads at tp 4)
    (128, 1.0, [24, 20, 20], True, 8, 2),  # Qwen3-VL
    (128, 1.0, [16, 24, 24], False, 7, 1),  # Qwen2-VL / Qwen2.5-VL
]


def _mrope(case, dtype):
    from sglang.srt.layers.rotary_embedding import get_rope

    head, factor, section, interleaved, _, _ = case
    return get_rope(head, head, 8192, 10_000_000, True, dtype=dtype, partial_rotary_factor=factor,
                    rope_scaling={"rope_type": "default", "mrope_section": section,
                                  "mrope_interleaved": interleaved})


def _mrope_inputs(case, tokens, dtype, seed, max_pos=8000):
    """q and k as views of one qkv tensor, positions [3, tokens] as an image's (t, h, w) grid
    gives them (the three rows differ), and the text-only [tokens]."""
    head, _, _, _, hq, hk = case
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, (hq + 2 * hk) * head, dtype=dtype, generator=g)
    q, k, _ = qkv.split([hq * head, hk * head, hk * head], dim=-1)
    positions = torch.randint(0, max_pos, (3, tokens), generator=g)
    return q, k, positions


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", [1, 9, 512])
@pytest.mark.parametrize("case", MROPE_CASES, ids=lambda c: f"hd{c[0]}-{c[2]}-{'il' if c[3] else 'ch'}")
def test_mrotary_embedding_matches_forward_native_bit_for_bit(sglang_with_plugin, case, tokens, dtype):
    rope = _mrope(case, dtype)
    assert type(rope).__name__ == "MRotaryEmbedding"
    q, k, positions = _mrope_inputs(case, tokens, dtype, tokens)
    for pos in (positions, positions[0]):  # multimodal, then text only
        want = rope.forward_native(pos, q.clone(), k.clone())
        _same(rope.forward(pos, q.clone(), k.clone()), want, f"positions {tuple(pos.shape)}")
    assert rope._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"
    qv, kv = q.clone(), k.clone()  # in place on the views, as SGLang's Triton kernel
    got = rope.forward(positions, q, k)
    assert got[0].data_ptr() == q.data_ptr()
    _same((q, k), rope.forward_native(positions, qv, kv), "in place")


@pytest.mark.parametrize("case", MROPE_CASES, ids=lambda c: f"hd{c[0]}-{c[2]}-{'il' if c[3] else 'ch'}")
def test_mrotary_embedding_bf16_against_an_fp32_oracle(sglang_with_plugin, case):
    """The bf16 layer's output within the op's tolerance of the same rotation done in fp32
    (an fp32 layer: fp32 cache, fp32 arithmetic) and rounded once."""
    from sglang_fl.dispatch.ops import op_spec

    q, k, positions = _mrope_inputs(case, 64, torch.bfloat16, 1)
    oracle = _mrope(case, torch.float32).forward_native(positions, q.float(), k.float())
    got = _mrope(case, torch.bfloat16).forward(positions, q.clone(), k.clone())
    tol = op_spec("mrotary_embedding").tolerance.for_dtype(torch.bfloat16)
    for g, o in zip(got, oracle, strict=True):
        torch.testing.assert_close(g, o.to(torch.bfloat16), **tol)


def test_mrope_subclass_that_keeps_the_forward_is_routed_and_glm_is_left_to_sglang(sglang_with_plugin):
    from sglang.srt.layers.rotary_embedding import get_rope

    yarn = get_rope(128, 128, 4096, 10000, True, dtype=torch.float32,
                    rope_scaling={"rope_type": "yarn", "factor": 2.0,
                                  "original_max_position_embeddings": 2048,
                                  "mrope_section": [16, 24, 24], "mrope_interleaved": True})
    assert type(yarn).__name__ == "YaRNScalingMRotaryEmbedding"
    q, k, positions = _mrope_inputs((128, 1.0, [16, 24, 24], True, 2, 1), 5, torch.float32, 2,
                                    max_pos=4000)
    _same(yarn.forward(positions, q.clone(), k.clone()),
          yarn.forward_native(positions, q.clone(), k.clone()), "yarn mrope")
    assert yarn._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"
    glm = get_rope(128, 128, 4096, 10000, True, dtype=torch.float32,
                   rope_scaling={"rope_type": "default", "mrope_section": [8, 12, 12],
                                 "mrope_interleaved": True, "mrope_interleaved_glm": True})
    glm.forward(positions, q.clone(), k.clone())  # the first call binds
    assert getattr(glm._forward_method, "__self__", None) is glm  # SGLang's own method


class _TritonMrope:
    """Test double of SGLang's ``triton_mrope_fused``: in place on [tokens, heads * head] rows,
    from the combined [positions, rotary_dim] cache, computing in the cache's dtype."""

    calls: list = []

    @classmethod
    def triton_mrope_fused(cls, q, k, cos_sin_cache, positions, mrope_section, head_size,
                           rotary_dim, mrope_interleaved, mrope_interleaved_glm, is_neox_style,
                           axis_map):
        from types import SimpleNamespace

        from sglang_fl.dispatch.backends.reference import ReferenceBackend

        cls.calls.append((tuple(positions.shape), positions.stride(), rotary_dim,
                          mrope_interleaved_glm, axis_map))
        cos, sin = cache_halves = cos_sin_cache.chunk(2, dim=-1)
        assert cache_halves[0].shape[-1] * 2 == rotary_dim
        q32, k32 = ReferenceBackend().mrotary_embedding(
            SimpleNamespace(head_size=head_size), q.to(cos.dtype), k.to(cos.dtype), cos, sin,
            positions, tuple(mrope_section), mrope_interleaved, not is_neox_style, False)
        q.copy_(q32)
        k.copy_(k32)


def _patch_sglang_kernel(monkeypatch, name, double):
    """Replace SGLang's kernel ``name`` where this SGLang version keeps it (the adapter's KERNELS)."""
    import importlib

    from sglang_fl.sglang_glue.adapters import get_adapter

    module, attr = get_adapter().KERNELS[name].split(":")
    monkeypatch.setattr(importlib.import_module(module), attr, double)


@pytest.mark.parametrize("case", MROPE_CASES, ids=lambda c: f"hd{c[0]}-{c[2]}-{'il' if c[3] else 'ch'}")
def test_vendor_cuda_mrope_hands_sglangs_kernel_the_right_arguments(sglang_with_plugin, monkeypatch,
                                                                    case):
    """vendor.cuda's mRoPE is SGLang's Triton kernel (tests/gpu runs it for real); here a double
    of that kernel checks what the impl passes: the cache joined as [cos | sin] in fp32, the
    positions (text-only ones for all three axes), the section flags and in place or not."""
    from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend
    from sglang_fl.dispatch.ops import op_spec

    _patch_sglang_kernel(monkeypatch, "triton_mrope_fused", _TritonMrope.triton_mrope_fused)
    _TritonMrope.calls = []
    backend = CudaBackend()
    layer = _mrope(case, torch.float32)
    cos, sin = (c.contiguous() for c in layer.cos_sin_cache.chunk(2, dim=-1))
    q, k, positions = _mrope_inputs(case, 33, torch.bfloat16, 3)
    section, interleaved = tuple(layer.mrope_section), layer.mrope_interleaved
    tol = op_spec("mrotary_embedding").tolerance.for_dtype(torch.bfloat16)
    for pos in (positions, positions[1]):
        oracle = layer.forward_native(pos, q.float(), k.float())
        before = q.clone()
        got = backend.mrotary_embedding(layer, q, k, cos, sin, pos, section, interleaved, False, False)
        assert torch.equal(q, before)  # out of place leaves the inputs alone
        for g, o in zip(got, oracle, strict=True):
            torch.testing.assert_close(g, o.to(torch.bfloat16), **tol)
        qq, kk = q.clone(), k.clone()
        got = backend.mrotary_embedding(layer, qq, kk, cos, sin, pos, section, interleaved, False, True)
        assert got[0] is qq and got[1] is kk
        torch.testing.assert_close(qq, oracle[0].to(torch.bfloat16), **tol)
    assert [c[0] for c in _TritonMrope.calls] == [(3, 33)] * 4
    assert _TritonMrope.calls[-1][1][0] == 0  # text only: one position row read for all axes
    assert all(c[2] == layer.rotary_dim and c[3] is False and c[4] is None for c in _TritonMrope.calls)
    assert len(backend._caches) == 1  # cos and sin joined once


# ---------------------------------------------------------------------------------------------
# Backends read only the layer attributes their op's table entry lists
# ---------------------------------------------------------------------------------------------


class _OnlyAttrs:
    """The layer, showing only ``names``: reading anything else fails, naming it."""

    def __init__(self, layer, names, op):
        self._layer, self._names, self._op = layer, names, op

    def __getattr__(self, name):
        if name not in self._names:
            raise AttributeError(f"{self._op} read obj.{name}, which its op table entry does not "
                                 f"list (it lists {self._names})")
        return getattr(self._layer, name)


def _runnable_backends():
    out = [("reference", "silu_and_mul"), ("reference", "rms_norm"), ("reference", "gemma_rms_norm"),
           ("reference", "rotary_embedding"), ("reference", "mrotary_embedding")]
    out += [(b, op) for b in ("flagos", "vendor.cuda", "vendor.ascend", "vendor.musa")
            for op in ("rms_norm", "gemma_rms_norm") if (b, op) != ("vendor.musa", "gemma_rms_norm")]
    return out + [("vendor.cuda", "mrotary_embedding")]


@pytest.mark.parametrize("impl_id, op", _runnable_backends(), ids=lambda v: str(v))
def test_backends_read_only_the_layer_attributes_the_table_lists(sglang_with_plugin, monkeypatch,
                                                                  impl_id, op):
    from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm
    from sglang.srt.layers.rotary_embedding import get_rope

    from sglang_fl.dispatch.backends.reference import ReferenceBackend
    from sglang_fl.dispatch.ops import op_spec

    backend = ReferenceBackend() if impl_id == "reference" else _backend_with_kernel_doubles(impl_id)
    if op == "mrotary_embedding" and impl_id == "vendor.cuda":
        _patch_sglang_kernel(monkeypatch, "triton_mrope_fused", _TritonMrope.triton_mrope_fused)
    fn = getattr(backend, op)
    x = torch.randn(4, 64)
    if op in ("rms_norm", "gemma_rms_norm"):
        layer = (RMSNorm if op == "rms_norm" else GemmaRMSNorm)(64)
        args = [(x.clone(),), (x.clone(), torch.randn(4, 64)),
                (x.clone(), torch.randn(4, 64), torch.randn(4, 64))]
    elif op == "silu_and_mul":
        from sglang.srt.layers.activation import SiluAndMul

        layer, args = SiluAndMul(), [(x,)]
    else:
        layer = (_mrope(MROPE_CASES[1], torch.float32) if op == "mrotary_embedding"
                 else get_rope(128, 128, 4096, 10000, True, dtype=torch.float32))
        cos, sin = (c.contiguous() for c in layer.cos_sin_cache.chunk(2, dim=-1))
        q, k = torch.randn(4, 2 * 128), torch.randn(4, 128)
        pos = torch.randint(0, 4000, (3, 4) if op == "mrotary_embedding" else (4,))
        extra = (tuple(layer.mrope_section), True) if op == "mrotary_embedding" else ()
        args = [(q, k, cos, sin, pos, *extra)]
    obj = _OnlyAttrs(layer, op_spec(op).layer_attrs, f"{impl_id}.{op}")
    for a in args:
        fn(obj, *a)
