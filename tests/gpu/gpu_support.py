"""Helpers of the GPU suite: real SGLang layer objects on the CUDA device and dtype-aware
comparison.

Every module here skips itself at import when no CUDA device is present (CI has none); on a GPU
host the suite runs with ``pytest tests/gpu -m gpu``. The air-gapped install that brings SGLang
0.5.11, FlagGems and the trimmed sgl_kernel to such a host is docs/air-gapped-install.md.
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")

HAS_CUDA = torch.cuda.is_available()
SKIP_REASON = ("needs a CUDA device (none here; CI has none) -- run on a GPU host, "
               "see docs/air-gapped-install.md")

#: Tolerances for one backend against the reference, per output dtype. Both sides round to the
#: output dtype once or twice and may reduce in a different order, so a correct kernel is within
#: about two ulps of the output's magnitude: bf16 has 8 significant bits, fp16 has 11.
TOLERANCES = {
    torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
}
DTYPES = (torch.bfloat16, torch.float16)
TOKENS = (1, 7, 128, 1024, 8192)
HIDDEN = (896, 4096, 8192)  # Qwen2.5-0.5B, Llama-3-8B, Llama-3-70B


def grid(values, default):
    """``values`` as parametrize values, those outside ``default`` marked ``exhaustive``: the
    default run (``pytest tests/gpu``) takes the representative ``default`` points, the ones
    where kernels change behaviour (decode vs prefill sizes, odd sizes, block boundaries);
    ``pytest tests/gpu --exhaustive`` takes every value."""
    return [v if v in default else pytest.param(v, marks=pytest.mark.exhaustive) for v in values]


def assert_close(actual, expected, what="", op=None):
    """Within ``op``'s tolerance in the op table, or the generic rounding one."""
    if op is not None:
        from sglang_fl.dispatch.ops import op_spec

        tol = op_spec(op).tolerance.for_dtype(expected.dtype)
    else:
        tol = TOLERANCES[expected.dtype]
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tol)


def skip_unless_implemented(backend, op):
    """Skip where ``backend`` offers no ``op`` on this host (vendor.cuda offers each op where its
    kernel package is real: sgl_kernel, tvm_ffi, triton)."""
    if op not in backend.implemented_ops():
        pytest.skip(f"{backend.impl_id()} has no {op} here: {backend.unavailable_reason}")


@functools.cache
def sglang_ready() -> bool:
    """Make SGLang importable on this host (sglang-fl empty mode for what is missing, e.g.
    flashinfer) and give it the global server args its layer constructors read."""
    from sglang_fl.compat import activate

    activate()
    from sglang_fl.sglang_glue.adapters import get_adapter

    get_adapter().ensure_server_args()
    return True


def make_rms_norm(hidden, dtype, eps=1e-6, gemma=False, seed=0):
    """A real SGLang (Gemma)RMSNorm on the GPU with non-trivial weights."""
    sglang_ready()
    from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm

    g = torch.Generator().manual_seed(seed)
    if gemma:
        layer = GemmaRMSNorm(hidden, eps=eps)
        layer.weight.weight_loader(layer.weight, torch.randn(hidden, generator=g) * 0.1)
    else:
        layer = RMSNorm(hidden, eps=eps)
        layer.weight.data.copy_(1.0 + 0.1 * torch.randn(hidden, generator=g))
    return layer.to(device="cuda", dtype=dtype)


def make_silu_and_mul():
    sglang_ready()
    from sglang.srt.layers.activation import SiluAndMul

    return SiluAndMul()


def make_rope(head_size, rotary_dim, is_neox_style, dtype, max_pos=32768, base=1_000_000):
    """A real SGLang RotaryEmbedding (its cos/sin cache stays fp32 on CUDA, as in serving)."""
    sglang_ready()
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding

    return RotaryEmbedding(head_size, rotary_dim, max_pos, base, is_neox_style, dtype).to("cuda")


def make_mrope(head_size, rotary_dim, mrope_section, interleaved, dtype, max_pos=32768,
               base=10_000_000):
    """A real SGLang MRotaryEmbedding (fp32 cos/sin cache on CUDA, as in serving)."""
    sglang_ready()
    from sglang.srt.layers.rotary_embedding.mrope import MRotaryEmbedding

    return MRotaryEmbedding(head_size, rotary_dim, max_pos, base, True, dtype,
                            mrope_section=list(mrope_section), mrope_interleaved=interleaved).to("cuda")


def rope_caches(layer):
    """The standard op's cos/sin arguments: halves of the layer's ``[max_pos, rot_dim]`` cache."""
    cos, sin = layer.cos_sin_cache.chunk(2, dim=-1)
    return cos.contiguous(), sin.contiguous()


# The Gated DeltaNet ops (test_gdn_ops, test_precision_parity): head dims of Qwen3.5/3.6.
DK = DV = 128


def implements(backend, op):
    """The op's impl as the dispatch registers it: guarded by its declared input limits."""
    from sglang_fl.dispatch.verify import verify_impl

    skip_unless_implemented(backend, op)
    sglang_ready()
    return verify_impl(next(i for i in backend.op_impls() if i.op_name == op))


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def gdn_inputs(lengths, heads, dtype, seed=0):
    h, hv = heads
    g, total = gen(seed), sum(lengths)
    q = torch.randn(1, total, h, DK, device="cuda", generator=g).to(dtype)
    k = torch.randn(1, total, h, DK, device="cuda", generator=g).to(dtype)
    v = torch.randn(1, total, hv, DV, device="cuda", generator=g).to(dtype)
    a = torch.randn(total, hv, device="cuda", generator=g).to(dtype)
    b = torch.randn(total, hv, device="cuda", generator=g).to(dtype)
    A_log = torch.rand(hv, device="cuda", generator=g) * 2 - 1  # noqa: N806
    dt_bias = torch.randn(hv, device="cuda", generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    return q, k, v, a, b, A_log, dt_bias, cu


def f32(*tensors):
    return tuple(None if t is None else t.float() for t in tensors)
