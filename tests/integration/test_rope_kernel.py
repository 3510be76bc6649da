"""sglang-fl's in-place RoPE kernel (``sglang_fl/kernels/rope.py``, the ``flagos`` backend's
``rotary_embedding`` with ``inplace=True``), run by Triton's interpreter on this CPU
(``TRITON_INTERPRET=1``: each program's block operations in numpy) against the reference
backend, on real SGLang RotaryEmbedding layers and real model shapes.

q and k are views of one fused qkv buffer whose v part and row padding hold a large poison
value: a read from outside a head's rotary channels shows as a huge error, a write there as a
changed poison, and the pass-through channels of a partial rotary must stay bit for bit.

What the interpreter cannot show is a race between warps (it runs every block operation whole,
in program order); the GPU suite repeats the race-prone case hundreds of times
(tests/gpu/test_rope_kernel.py). Shapes are kept small: the interpreter runs ~5 ms per program.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_fl.dispatch.ops import op_spec
from tests.integration.conftest import interpreted_fixture, run_python

pytest.importorskip("triton", reason="the RoPE kernel is Triton; triton is not installed here")

pytestmark = pytest.mark.integration

POISON = 1024.0  # exact in every dtype; far outside rotated values of randn inputs
TOL = op_spec("rotary_embedding").tolerance


#: The launcher running its kernel through Triton's interpreter.
interpreted = interpreted_fixture("sglang_fl.kernels.rope", "rope_inplace_kernel")


def _layer(head_size, rot_dim, neox, cache_dtype=torch.float32, max_pos=4096):
    """A real SGLang RotaryEmbedding; its cache is fp32 as SGLang keeps it on CUDA."""
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    return RotaryEmbedding(head_size, rot_dim, max_pos, 1_000_000, neox, cache_dtype)


def _caches(layer):
    cos, sin = layer.cos_sin_cache.chunk(2, dim=-1)
    return cos.contiguous(), sin.contiguous()


def _qkv(tokens, head_size, qh, kh, dtype, gen, pad=8):
    """Poisoned ``[tokens, (qh + 2 kh) * head_size + pad]`` buffer with random q/k/v parts;
    returns it and the q, k views (row stride = the buffer's width, as SGLang passes them)."""
    width = (qh + 2 * kh) * head_size
    buf = torch.full((tokens, width + pad), POISON, dtype=dtype)
    buf[:, :width] = torch.randn(tokens, width, generator=gen).to(dtype)
    q = buf[:, :qh * head_size]
    k = buf[:, qh * head_size:(qh + kh) * head_size]
    return buf, q, k


def _check(buf, before, got, query, key, want_q, want_k, head_size, rot_dim, qh, kh, what):
    """Rotated channels within the op's tolerance of the oracle; everything else unchanged."""
    tokens, dtype = buf.shape[0], buf.dtype
    assert got[0] is query and got[1] is key, f"{what}: in place must return query and key"
    tol = TOL.for_dtype(dtype)
    for name, x, want in (("query", query, want_q), ("key", key, want_k)):
        heads = x.view(tokens, -1, head_size)
        torch.testing.assert_close(heads[..., :rot_dim], want.view(heads.shape)[..., :rot_dim],
                                   msg=lambda m, n=name: f"{what} {n}: {m}", **tol)
    changed = buf != before
    rotary = torch.zeros_like(changed)
    for h in range(qh + kh):
        rotary[:, h * head_size:h * head_size + rot_dim] = True
    assert not (changed & ~rotary).any(), (
        f"{what}: {int((changed & ~rotary).sum())} elements outside the rotary channels of q/k "
        f"were written (pass-through channels, v or row padding)")


def _oracle(reference, layer, query, key, cos, sin, pos, interleaved):
    """The reference backend's arithmetic in fp32, rounded once to the activation dtype."""
    q, k = reference.rotary_embedding(layer, query.float(), key.float(), cos, sin, pos,
                                      interleaved, False)
    return q.to(query.dtype), k.to(key.dtype)


@pytest.fixture(scope="module")
def reference():
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    return ReferenceBackend()


@pytest.fixture(scope="module")
def flagos():
    """FlagGemsBackend itself: its in-place RoPE is the plugin's kernel and needs no FlagGems
    (so ``is_available``, which needs a FlagGems device, is not asked)."""
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend

    return FlagGemsBackend()


# (head_size, rotary_dim, q heads, kv heads): Qwen2.5-0.5B, Llama-3-8B, partial rotary
# (GLM-style half of the head), partial with a quarter (Phi-style).
SHAPES = [(64, 64, 14, 2), (128, 128, 32, 8), (128, 64, 32, 8), (64, 16, 4, 1)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 7])
@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"hd{s[0]}-rot{s[1]}-q{s[2]}-kv{s[3]}")
def test_flagos_inplace_rope_matches_reference(sglang_with_plugin, interpreted, flagos,
                                               reference, shape, neox, tokens, dtype):
    head_size, rot_dim, qh, kh = shape
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    layer = _layer(head_size, rot_dim, neox)
    cos, sin = _caches(layer)
    buf, q, k = _qkv(tokens, head_size, qh, kh, dtype, gen)
    pos = torch.randperm(layer.max_position_embeddings, generator=gen)[:tokens]
    want_q, want_k = _oracle(reference, layer, q, k, cos, sin, pos, not neox)
    before = buf.clone()
    got = flagos.rotary_embedding(layer, q, k, cos, sin, pos, not neox, True)
    _check(buf, before, got, q, k, want_q, want_k, head_size, rot_dim, qh, kh, f"seed {seed}")


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "interleaved"])
def test_kernel_prefill_many_tokens(sglang_with_plugin, interpreted, reference, neox):
    """130 tokens (17 row blocks of q and 9 of k, the last of each part-filled, so a program's
    rows span tokens and the q/k boundary falls mid-grid), bf16 activations with fp32 caches as
    SGLang serves, int32 positions with repeats."""
    head_size, rot_dim, qh, kh, tokens = 64, 64, 4, 2, 130
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    layer = _layer(head_size, rot_dim, neox)
    cos, sin = _caches(layer)
    buf, q, k = _qkv(tokens, head_size, qh, kh, torch.bfloat16, gen)
    pos = torch.randint(0, layer.max_position_embeddings, (tokens,), generator=gen,
                        dtype=torch.int32)
    want_q, want_k = _oracle(reference, layer, q, k, cos, sin, pos.long(), not neox)
    before = buf.clone()
    got = interpreted.rotary_embedding_inplace(q, k, cos, sin, pos, head_size, not neox)
    _check(buf, before, got, q, k, want_q, want_k, head_size, rot_dim, qh, kh, f"seed {seed}")


def test_kernel_caches_in_activation_dtype_and_strided(sglang_with_plugin, interpreted,
                                                       reference):
    """A bf16 cache (SGLang's CPU layers cast it) passed as the cache's own non-contiguous
    halves, and k with more heads than q: the strides are honoured."""
    head_size, rot_dim, qh, kh, tokens = 128, 128, 2, 4, 3
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    layer = _layer(head_size, rot_dim, True, cache_dtype=torch.bfloat16)
    cos, sin = layer.cos_sin_cache.chunk(2, dim=-1)
    assert not cos.is_contiguous()
    buf, q, k = _qkv(tokens, head_size, qh, kh, torch.bfloat16, gen)
    pos = torch.tensor([0, 4095, 17])
    want_q, want_k = _oracle(reference, layer, q, k, cos, sin, pos, False)
    before = buf.clone()
    got = interpreted.rotary_embedding_inplace(q, k, cos, sin, pos, head_size, False)
    _check(buf, before, got, q, k, want_q, want_k, head_size, rot_dim, qh, kh, "strided cache")


def test_kernel_zero_tokens_and_bad_rotary_dim(interpreted):
    q, k = torch.empty(0, 256), torch.empty(0, 128)
    cos = sin = torch.ones(16, 32)
    assert interpreted.rotary_embedding_inplace(q, k, cos, sin, torch.empty(0, dtype=torch.long),
                                                64) == (q, k)
    with pytest.raises(ValueError, match="rotary_dim 128 exceeds head_size 64"):
        interpreted.rotary_embedding_inplace(torch.zeros(1, 64), torch.zeros(1, 64),
                                             torch.ones(4, 64), torch.ones(4, 64),
                                             torch.zeros(1, dtype=torch.long), 64)


def test_other_layouts_rotate_alike_and_a_wrong_width_is_named(interpreted):
    """q/k as ``[tokens, heads, head_size]`` and positions as ``[1, tokens]`` (the general
    path) rotate exactly as the 2-D layout SGLang passes (the lean path); a q width that is no
    multiple of head_size is refused with the shapes."""
    gen = torch.Generator().manual_seed(5)
    cos, sin = torch.randn(64, 8, generator=gen), torch.randn(64, 8, generator=gen)
    q, k = torch.randn(3, 4 * 16, generator=gen), torch.randn(3, 2 * 16, generator=gen)
    pos = torch.tensor([5, 0, 63])
    q3, k3 = q.clone().view(3, 4, 16), k.clone().view(3, 2, 16)
    interpreted.rotary_embedding_inplace(q, k, cos, sin, pos, 16)
    interpreted.rotary_embedding_inplace(q3, k3, cos, sin, pos.view(1, 3), 16)
    assert torch.equal(q3.view(3, -1), q) and torch.equal(k3.view(3, -1), k)
    with pytest.raises(ValueError, match=r"query \(3, 60\) / key \(3, 32\) are not \[3, heads \* 16\]"):
        interpreted.rotary_embedding_inplace(torch.zeros(3, 60), k, cos, sin, pos, 16)


def test_kernel_launcher_imports_without_triton():
    """The launcher and the flagos backend import Triton only at the first launch, so they
    import on hosts without it (a fresh interpreter in which ``import triton`` fails)."""
    code = (
        "import sys\n"
        "sys.modules['triton'] = None\n"  # import triton -> ImportError
        "import sglang_fl.kernels.rope, sglang_fl.dispatch.backends.flaggems\n"
        "assert 'sglang_fl.kernels.rope_triton' not in sys.modules\n"
        "assert 'sglang_fl.kernels.silu_mul_triton' not in sys.modules\n"
        "print('ok')\n")
    proc = run_python(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
