"""Every routed op, on real SGLang layer objects: the plugin's path (reference backend, strict)
against SGLang's own ``forward_native``, across dtypes, token counts and real model shapes."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.integration

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
TOKENS = [1, 7, 128, 2048]
HIDDEN = [896, 4096]


def _close(a, b, dtype):
    torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm(sglang_with_plugin, dtype, tokens, hidden):
    from sglang.srt.layers.layernorm import RMSNorm

    torch.manual_seed(tokens + hidden)
    layer = RMSNorm(hidden, eps=1e-6).to(dtype)
    layer.weight.data.normal_(1.0, 0.1)
    x = torch.randn(tokens, hidden, dtype=dtype)
    res = torch.randn(tokens, hidden, dtype=dtype)
    post = torch.randn(tokens, hidden, dtype=dtype)
    _close(layer.forward(x.clone()), layer.forward_native(x.clone()), dtype)
    got = layer.forward(x.clone(), res.clone())
    want = layer.forward_native(x.clone(), res.clone())
    _close(got[0], want[0], dtype)
    _close(got[1], want[1], dtype)
    got = layer.forward(x.clone(), res.clone(), post_residual_addition=post)
    want = layer.forward_native(x.clone(), res.clone(), post_residual_addition=post)
    _close(got[0], want[0], dtype)
    _close(got[1], want[1], dtype)
    assert layer._forward_method.__name__ == "forward"  # the bridge, bound after the first call
    assert layer._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"


def test_rms_norm_non_contiguous_and_3d_input(sglang_with_plugin):
    from sglang.srt.layers.layernorm import RMSNorm

    layer = RMSNorm(64)
    layer.weight.data.normal_(1.0, 0.1)
    base = torch.randn(16, 128)
    x = base[:, ::2]  # non-contiguous view
    assert not x.is_contiguous()
    _close(layer.forward(x), layer.forward_native(x), torch.float32)
    x3 = torch.randn(2, 5, 64)
    _close(layer.forward(x3), layer.forward_native(x3), torch.float32)


def test_rms_norm_with_unsupported_options_keeps_sglang_forward(sglang_with_plugin):
    from sglang.srt.layers.layernorm import RMSNorm

    layer = RMSNorm(64, var_hidden_size=32)
    x = torch.randn(3, 64)
    _close(layer.forward(x), layer.forward_native(x), torch.float32)
    assert getattr(layer._forward_method, "__self__", None) is layer  # SGLang's own method


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens", TOKENS)
def test_gemma_rms_norm(sglang_with_plugin, dtype, tokens):
    from sglang.srt.layers.layernorm import GemmaRMSNorm

    layer = GemmaRMSNorm(2048).to(dtype)
    layer.weight.data.normal_(0.0, 0.1)
    x = torch.randn(tokens, 2048, dtype=dtype)
    res = torch.randn(tokens, 2048, dtype=dtype)
    post = torch.randn(tokens, 2048, dtype=dtype)
    _close(layer.forward(x.clone()), layer.forward_native(x.clone()), dtype)
    got = layer.forward(x.clone(), res.clone(), post)
    want = layer.forward_native(x.clone(), res.clone(), post)
    _close(got[0], want[0], dtype)
    _close(got[1], want[1], dtype)


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
