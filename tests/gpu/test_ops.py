"""Layer-2 ops on the GPU: each non-reference backend (FlagGems ``flagos``, SGLang's own kernels
``vendor.cuda``) against the pure-PyTorch reference, on real SGLang layer objects and the
shapes served models use (tokens 1..8192, hidden 896/4096/8192, head dims 64/128, bf16/fp16).

Backends are instantiated directly, so a test can only pass on the backend it names; the
manager-level test at the end checks that strict selection really resolves to flagos.
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here; CI has none) -- see docs/air-gapped-install.md",
                allow_module_level=True)

from gpu_support import (  # noqa: E402
    DTYPES,
    HIDDEN,
    TOKENS,
    assert_close,
    grid,
    make_mrope,
    make_rms_norm,
    make_rope,
    make_silu_and_mul,
    rope_caches,
    skip_unless_implemented,
)

pytestmark = pytest.mark.gpu
#: Decode, an odd size and a multi-block prefill (TOKENS adds 128 and 8192 with --exhaustive).
DEFAULT_TOKENS = (1, 7, 1024)


def _randn(*shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=dtype, generator=g)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("hidden", grid(HIDDEN, HIDDEN[:2]))
@pytest.mark.parametrize("tokens", grid(TOKENS, DEFAULT_TOKENS))
@pytest.mark.parametrize("residual", ["plain", "residual", "post"])
def test_rms_norm(backend, reference, tokens, hidden, dtype, residual):
    skip_unless_implemented(backend, "rms_norm")
    layer = make_rms_norm(hidden, dtype)
    x = _randn(tokens, hidden, dtype=dtype, seed=1)
    if residual == "plain":
        assert_close(backend.rms_norm(layer, x.clone()), reference.rms_norm(layer, x.clone()), "out", op="rms_norm")
        return
    r = _randn(tokens, hidden, dtype=dtype, seed=2)
    post = _randn(tokens, hidden, dtype=dtype, seed=9) if residual == "post" else None
    out, res = backend.rms_norm(layer, x.clone(), r.clone(), post)
    ref_out, ref_res = reference.rms_norm(layer, x.clone(), r.clone(), post)
    if post is not None:  # x + residual + post summed in fp32 and rounded once, as forward_native
        assert torch.equal(res, ref_res), "residual with post_residual_addition"
    assert_close(res, ref_res, "residual", op="rms_norm")
    assert_close(out, ref_out, "out", op="rms_norm")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", (1, 128, 8192))
@pytest.mark.parametrize("residual", ["plain", "residual", "post"])
def test_gemma_rms_norm(backend, reference, tokens, dtype, residual):
    skip_unless_implemented(backend, "gemma_rms_norm")
    hidden = 2304  # Gemma-2-2B
    layer = make_rms_norm(hidden, dtype, gemma=True)
    x = _randn(tokens, hidden, dtype=dtype, seed=3)
    if residual == "plain":
        got = backend.gemma_rms_norm(layer, x.clone())
        assert_close(got, reference.gemma_rms_norm(layer, x.clone()), "out", op="gemma_rms_norm")
        return
    r = _randn(tokens, hidden, dtype=dtype, seed=4)
    post = _randn(tokens, hidden, dtype=dtype, seed=10) if residual == "post" else None
    out, res = backend.gemma_rms_norm(layer, x.clone(), r.clone(), post)
    ref_out, ref_res = reference.gemma_rms_norm(layer, x.clone(), r.clone(), post)
    assert_close(res, ref_res, "residual", op="gemma_rms_norm")
    assert_close(out, ref_out, "out", op="gemma_rms_norm")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("intermediate", (4864, 14336))  # Qwen2.5-0.5B, Llama-3-8B
@pytest.mark.parametrize("tokens", grid(TOKENS, DEFAULT_TOKENS))
def test_silu_and_mul(backend, reference, tokens, intermediate, dtype):
    skip_unless_implemented(backend, "silu_and_mul")
    layer = make_silu_and_mul()
    x = _randn(tokens, 2 * intermediate, dtype=dtype, seed=5)
    got = backend.silu_and_mul(layer, x)
    assert_close(got, reference.silu_and_mul(layer, x), "out", op="silu_and_mul")


# (head_size, rotary_dim, q heads, kv heads): Qwen2.5-0.5B, Llama-3-8B, partial rotary (GLM-style).
ROPE_SHAPES = [(64, 64, 14, 2), (128, 128, 32, 8), (128, 64, 32, 8)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", ROPE_SHAPES, ids=lambda s: f"hd{s[0]}-rot{s[1]}-q{s[2]}-kv{s[3]}")
@pytest.mark.parametrize("tokens", grid(TOKENS, DEFAULT_TOKENS))
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
def test_rotary_embedding(backend, reference, tokens, shape, dtype, neox):
    head_size, rot_dim, qh, kh = shape
    skip_unless_implemented(backend, "rotary_embedding")
    layer = make_rope(head_size, rot_dim, neox, dtype)
    cos, sin = rope_caches(layer)
    q = _randn(tokens, qh * head_size, dtype=dtype, seed=6)
    k = _randn(tokens, kh * head_size, dtype=dtype, seed=7)
    pos = torch.randint(0, layer.max_position_embeddings, (tokens,), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(8))
    interleaved = not neox
    # Oracle: the reference arithmetic in fp32, rounded once. (The reference backend mirrors
    # SGLang's forward_native, which rounds cos/sin and every product to the activation dtype:
    # up to ~3 ulps off, more than the kernels, which compute in fp32 and round once.)
    ref_q, ref_k = reference.rotary_embedding(layer, q.float(), k.float(), cos, sin, pos,
                                              interleaved, True)
    ref_q, ref_k = ref_q.to(dtype), ref_k.to(dtype)
    for inplace in (True, False):
        qq, kk = q.clone(), k.clone()
        got_q, got_k = backend.rotary_embedding(layer, qq, kk, cos, sin, pos, interleaved, inplace)
        assert_close(got_q, ref_q, f"query (inplace={inplace})", op="rotary_embedding")
        assert_close(got_k, ref_k, f"key (inplace={inplace})", op="rotary_embedding")
        if inplace:
            assert got_q.data_ptr() == qq.data_ptr(), "in-place RoPE must return the input buffer"
        else:
            assert_close(qq, q, "query untouched by the out-of-place call", op="rotary_embedding")
    # The pass-through channels of a partial rotary are never modified.
    if rot_dim < head_size:
        view = ref_q.view(tokens, qh, head_size)[..., rot_dim:]
        assert torch.equal(view, q.view(tokens, qh, head_size)[..., rot_dim:])
    _assert_inplace_rope_stable(backend, layer, q, k, cos, sin, pos, interleaved, ref_q, ref_k)


# A race between warps (FlagGems 5.0.2's in-place RoPE, see tools/repro_flaggems_rope_race.py)
# shows in a fraction of calls only, so each in-place case runs this many times.
ROPE_REPEATS = int(os.environ.get("SGLANG_FL_TEST_ROPE_REPEATS", "200"))


def _assert_inplace_rope_stable(backend, layer, q, k, cos, sin, pos, interleaved, ref_q, ref_k):
    """In-place RoPE, repeated on separate q/k and on views of one qkv buffer (as SGLang's
    attention layers pass them): every element of every call within tolerance."""
    from sglang_fl.dispatch.ops import op_spec

    tol = op_spec("rotary_embedding").tolerance.for_dtype(ref_q.dtype)
    tokens = q.shape[0]
    qkv = torch.empty(tokens, q.shape[1] + 2 * k.shape[1], device="cuda", dtype=q.dtype)
    qv, kv, _ = qkv.split([q.shape[1], k.shape[1], k.shape[1]], dim=-1)
    bad = torch.zeros((), dtype=torch.int64, device="cuda")
    failing_calls = torch.zeros((), dtype=torch.int64, device="cuda")

    def wrong(got, ref):
        return ((got.float() - ref.float()).abs() > tol["atol"] + tol["rtol"] * ref.float().abs()).sum()

    sep_q, sep_k = q.clone(), k.clone()
    for i in range(ROPE_REPEATS):
        dq, dk = (sep_q, sep_k) if i % 2 == 0 else (qv, kv)
        dq.copy_(q)
        dk.copy_(k)
        backend.rotary_embedding(layer, dq, dk, cos, sin, pos, interleaved, True)
        n = wrong(dq, ref_q) + wrong(dk, ref_k)
        bad += n
        failing_calls += (n > 0).long()
    assert int(failing_calls) == 0, (
        f"in-place RoPE wrong in {int(failing_calls)} of {ROPE_REPEATS} calls "
        f"({int(bad)} elements in all)")


def test_rms_norm_3d_input(backend, reference):
    """SGLang calls RMSNorm on [batch, seq, hidden] views too (q/k norms)."""
    skip_unless_implemented(backend, "rms_norm")
    layer = make_rms_norm(128, torch.bfloat16)
    x = _randn(4, 16, 128, dtype=torch.bfloat16, seed=9)
    assert_close(backend.rms_norm(layer, x.clone()), reference.rms_norm(layer, x.clone()), "out", op="rms_norm")


# (head_size, rotary_dim, mrope_section, interleaved, q heads, kv heads): Qwen3.5/3.6 (partial
# rotary), Qwen3-VL, Qwen2.5-VL.
MROPE_SHAPES = [(256, 64, (11, 11, 10), True, 24, 4), (128, 128, (24, 20, 20), True, 32, 8),
                (128, 128, (16, 24, 24), False, 28, 4)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", MROPE_SHAPES, ids=lambda s: f"hd{s[0]}-rot{s[1]}-{s[2]}-{s[3]}")
@pytest.mark.parametrize("tokens", grid(TOKENS, DEFAULT_TOKENS))
def test_mrotary_embedding(cuda_vendor, reference, tokens, shape, dtype):
    """vendor.cuda's mRoPE (SGLang's Triton kernel) against the reference arithmetic in fp32,
    on multimodal [3, tokens] and text-only [tokens] positions, in place and not."""
    skip_unless_implemented(cuda_vendor, "mrotary_embedding")
    head_size, rot_dim, section, interleaved, qh, kh = shape
    layer = make_mrope(head_size, rot_dim, section, interleaved, dtype)
    cos, sin = rope_caches(layer)
    q = _randn(tokens, qh * head_size, dtype=dtype, seed=11)
    k = _randn(tokens, kh * head_size, dtype=dtype, seed=12)
    g = torch.Generator(device="cuda").manual_seed(13)
    positions = torch.randint(0, layer.max_position_embeddings, (3, tokens), device="cuda", generator=g)
    for pos in (positions, positions[0]):
        ref_q, ref_k = reference.mrotary_embedding(layer, q.float(), k.float(), cos, sin, pos,
                                                   section, interleaved, False, True)
        ref_q, ref_k = ref_q.to(dtype), ref_k.to(dtype)
        for inplace in (True, False):
            qq, kk = q.clone(), k.clone()
            got_q, got_k = cuda_vendor.mrotary_embedding(layer, qq, kk, cos, sin, pos, section,
                                                         interleaved, False, inplace)
            what = f"(inplace={inplace}, positions {tuple(pos.shape)})"
            assert_close(got_q, ref_q, f"query {what}", op="mrotary_embedding")
            assert_close(got_k, ref_k, f"key {what}", op="mrotary_embedding")
            if inplace:
                assert got_q.data_ptr() == qq.data_ptr()
            else:
                assert torch.equal(qq, q), "query untouched by the out-of-place call"


def test_strict_selection_resolves_to_flagos(monkeypatch):
    """Through the manager: pinned + strict resolves every op to FlagGems, with no fallback."""
    from sglang_fl.config import reset_settings
    from sglang_fl.dispatch import reset_manager, resolve_op

    monkeypatch.setenv("SGLANG_FL_PER_OP", "rms_norm=flagos;silu_and_mul=flagos;"
                       "rotary_embedding=flagos;gemma_rms_norm=flagos")
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    reset_settings()
    reset_manager()
    try:
        for op in ("rms_norm", "silu_and_mul", "rotary_embedding", "gemma_rms_norm"):
            resolved = resolve_op(op)
            assert [c.impl_id for c in resolved.candidates] == ["flagos"], op
            assert resolved.strict
    finally:
        monkeypatch.undo()
        reset_settings()
        reset_manager()
