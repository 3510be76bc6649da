"""sglang-fl's in-place RoPE kernel (``sglang_fl/kernels/rope.py``) on the GPU, repeated on the
shape where FlagGems 5.0.2's in-place kernel races (fp16, 1024 tokens, head 128, 32 q / 8 kv
heads, in place on views of one qkv buffer): every call within tolerance of the reference
backend's arithmetic in fp32, fresh random inputs each call.

A race between warps shows in a fraction of calls only, so the loop runs ``ITERS`` calls and
counts the wrong ones on the device (one sync at the end). The same loop run on FlagGems' own
in-place kernel shows that it catches the known race (the test of the detector itself).

Needs torch with CUDA and Triton only (FlagGems for the detector check; no SGLang): the layer is
a stand-in carrying ``head_size``, the one attribute the op reads, and the cos/sin caches are
built in fp32 as SGLang's RotaryEmbedding builds them. Runs in a few seconds on an H200:

    pytest tests/gpu/test_rope_kernel.py -m gpu
"""

from __future__ import annotations

import os
import types

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here; CI has none) -- see docs/air-gapped-install.md",
                allow_module_level=True)
pytest.importorskip("triton", reason="the RoPE kernel is Triton")

pytestmark = pytest.mark.gpu

ITERS = int(os.environ.get("SGLANG_FL_TEST_ROPE_REPEATS", "300"))
TOKENS, HEAD, Q_HEADS, KV_HEADS, MAX_POS = 1024, 128, 32, 8, 32768


def _caches(rot_dim, base=1_000_000.0):
    """fp32 ``[MAX_POS, rot_dim // 2]`` cos/sin, as SGLang's RotaryEmbedding computes them."""
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, device="cuda").float() / rot_dim)
    freqs = torch.outer(torch.arange(MAX_POS, device="cuda").float(), inv_freq)
    return freqs.cos().contiguous(), freqs.sin().contiguous()


def _wrong_calls(rotate, rot_dim, interleaved, dtype=torch.float16):
    """Run ``rotate(q, k, cos, sin, pos)`` in place ``ITERS`` times on fresh inputs; return
    (calls with any element off, elements off in all) against the fp32 reference."""
    from sglang_fl.dispatch.backends.reference import ReferenceBackend
    from sglang_fl.dispatch.ops import op_spec

    reference, layer = ReferenceBackend(), types.SimpleNamespace(head_size=HEAD)
    tol = op_spec("rotary_embedding").tolerance.for_dtype(dtype)
    cos, sin = _caches(rot_dim)
    qkv = torch.empty(TOKENS, (Q_HEADS + 2 * KV_HEADS) * HEAD, device="cuda", dtype=dtype)
    q, k, _ = qkv.split([Q_HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))
    calls = torch.zeros((), dtype=torch.int64, device="cuda")
    elements = torch.zeros((), dtype=torch.int64, device="cuda")
    for _ in range(ITERS):
        qkv.normal_(generator=gen)
        pos = torch.randint(0, MAX_POS, (TOKENS,), device="cuda", generator=gen)
        want_q, want_k = reference.rotary_embedding(layer, q.float(), k.float(), cos, sin, pos,
                                                    interleaved, False)
        rotate(q, k, cos, sin, pos)
        off = sum(((got.float() - want.to(dtype).float()).abs()
                   > tol["atol"] + tol["rtol"] * want.to(dtype).float().abs()).sum()
                  for got, want in ((q, want_q), (k, want_k)))
        elements += off
        calls += (off > 0).long()
    return int(calls), int(elements)


@pytest.mark.parametrize("rot_dim", [HEAD, HEAD // 2], ids=["full", "partial"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_inplace_rope_kernel_never_wrong_on_race_prone_shape(rot_dim, interleaved):
    from sglang_fl.kernels.rope import rotary_embedding_inplace

    def rotate(q, k, cos, sin, pos):
        rotary_embedding_inplace(q, k, cos, sin, pos, HEAD, interleaved)

    calls, elements = _wrong_calls(rotate, rot_dim, interleaved)
    assert calls == 0, f"in-place RoPE wrong in {calls} of {ITERS} calls ({elements} elements)"


def test_detector_sees_flaggems_inplace_race():
    """The loop above catches the known race: FlagGems 5.0.2's in-place kernel, same shape,
    gets calls wrong. Another FlagGems version that gets none is reported (the compat ledger
    entry ``flaggems:rope-inplace`` can go once a release passes)."""
    flag_gems = pytest.importorskip("flag_gems")

    def rotate(q, k, cos, sin, pos):
        flag_gems.apply_rotary_pos_emb(q.view(TOKENS, -1, HEAD), k.view(TOKENS, -1, HEAD), cos,
                                       sin, pos, rotary_interleaved=False, inplace=True)

    calls, elements = _wrong_calls(rotate, HEAD, False)
    version = getattr(flag_gems, "__version__", "?")
    if version != "5.0.2":
        pytest.skip(f"FlagGems {version}: in-place RoPE wrong in {calls} of {ITERS} calls "
                    f"(0 means the race is fixed there)")
    assert calls > 0, (f"FlagGems 5.0.2's in-place RoPE was right in all {ITERS} calls here: "
                       f"the race test cannot show a race on this GPU")
