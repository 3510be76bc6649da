"""sglang-fl's RMSNorm kernel (``sglang_fl/kernels/rms_norm.py``, the ``flagos`` backend's
``rms_norm`` and ``gemma_rms_norm`` on a device), run by Triton's interpreter on this CPU
(``TRITON_INTERPRET=1``) against the reference backend (each layer's ``forward_native`` math):

- Gemma: with and without a residual (the sum's rounding to x's dtype written back into it, the
  fp32 sum normalised as SGLang's fused CUDA kernel does, the normed rows into x);
- plain: with and without a residual, and with ``post_residual_addition`` (the three-way sum in
  fp32, the fp32 sum normalised, its rounding returned as the residual in a new tensor);

over widths that are not a power of two (the masked tail), rows that are views of a wider
buffer, 3-D inputs, every float dtype and a bf16 or fp32 weight. The flagos backend takes it
only where `supports` says so; the GPU suite runs it through the dispatch (tests/gpu)."""

from __future__ import annotations

import types

import pytest
import torch

from sglang_fl.dispatch.ops import op_spec
from tests.integration.conftest import interpreted_fixture

pytest.importorskip("triton", reason="the kernel is Triton; triton is not installed here")

pytestmark = pytest.mark.integration

TOL = op_spec("gemma_rms_norm").tolerance
PLAIN_TOL = op_spec("rms_norm").tolerance


#: The launcher running its kernel through Triton's interpreter.
interpreted = interpreted_fixture("sglang_fl.kernels.rms_norm", "rms_norm_kernel")


def layer(n, weight_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return types.SimpleNamespace(weight=(torch.randn(n, generator=g) * 0.5).to(weight_dtype),
                                 variance_epsilon=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,n,pad", [((3,), 256, 0), ((5,), 40, 7), ((2, 3), 96, 0),
                                         ((0,), 64, 0)])
def test_gemma_without_a_residual_matches_the_reference(interpreted, dtype, weight_dtype, shape, n, pad):
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    obj = layer(n, weight_dtype, n)
    g = torch.Generator().manual_seed(n + 1)
    wide = (torch.randn(*shape, n + pad, generator=g) * 3).to(dtype)
    x = wide[..., :n]  # with pad > 0 the rows are views with a stride of n + pad
    before = wide.clone()
    got = interpreted.gemma_rms_norm(x, obj.weight, obj.variance_epsilon)
    want = ReferenceBackend().gemma_rms_norm(obj, x)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL.for_dtype(dtype))
    assert torch.equal(wide, before), "x was written without a residual"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,n", [((4,), 2048), ((3,), 40), ((2, 3), 96)])
def test_gemma_with_a_residual_normalises_the_fp32_sum_and_writes_both_in_place(interpreted, dtype,
                                                                                shape, n):
    """The residual written back is x + residual in x's dtype (forward_native's); the output
    is the fp32 sum normalised, as SGLang's gemma_fused_add_rmsnorm (not the rounded sum, as
    forward_native: one rounding less, tests/gpu/test_precision_parity.py)."""
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    obj = layer(n, torch.bfloat16, n)
    g = torch.Generator().manual_seed(n + 2)
    x = (torch.randn(*shape, n, generator=g) * 3).to(dtype)
    residual = (torch.randn(*shape, n, generator=g) * 3).to(dtype)
    x_before, residual_before = x.clone(), residual.clone()
    want_out, want_res = ReferenceBackend().gemma_rms_norm(obj, x.clone(), residual.clone())
    got_out, got_res = interpreted.gemma_rms_norm(x, obj.weight, obj.variance_epsilon, residual)
    assert got_out is x and got_res is residual  # in place, as SGLang's fused kernels
    if dtype == torch.bfloat16:  # the interpreter rounds fp32 -> bf16 toward zero: one ulp
        torch.testing.assert_close(got_res, want_res, rtol=2**-7, atol=0)
    else:
        assert torch.equal(got_res, want_res), "the residual sum is not x + residual in x's dtype"
    torch.testing.assert_close(got_out, want_out, **TOL.for_dtype(dtype))
    total = x_before.float() + residual_before.float()
    exact = total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + obj.variance_epsilon)
    exact = exact * (1.0 + obj.weight.float())
    ulp = {torch.float32: 2**-20, torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]
    # one rounding of the fp32 result (toward zero in the interpreter: up to one ulp; fp32:
    # a few ulps of another summation order)
    torch.testing.assert_close(got_out.float(), exact, rtol=ulp * 1.01, atol=1e-30)


def test_takes_only_what_it_can():
    """CPU tensors, rows wider than one program, a non-contiguous row, a weight of another
    width and a residual or post-residual addition of another dtype or shape go to FlagGems'
    norms instead."""
    from sglang_fl.kernels.rms_norm import MAX_HIDDEN, supports

    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, device="meta", dtype=dtype)

    w = meta(64)
    assert supports(meta(4, 64), w) and supports(meta(2, 3, 64), w)
    assert supports(meta(4, 64), w, meta(4, 64))
    assert not supports(torch.empty(4, 64), torch.empty(64))
    assert not supports(meta(4, MAX_HIDDEN + 1), meta(MAX_HIDDEN + 1))
    assert not supports(meta(64, 4).t(), meta(4))
    assert not supports(meta(4, 64), meta(32))
    assert not supports(meta(4, 64), w, meta(4, 64, dtype=torch.float32))
    assert not supports(meta(4, 64, dtype=torch.float64), w)
    assert supports(meta(4, 64), w, meta(4, 64), meta(4, 64))
    assert not supports(meta(4, 64), w, meta(4, 64), meta(4, 64, dtype=torch.float32))
    assert not supports(meta(4, 64), w, meta(4, 64), meta(1, 64))
    assert not supports(meta(4, 64), w, meta(4, 64), meta(64, 4).t())
    assert not supports(meta(1, 64).expand(4, 64), w)  # overlapping rows: in place would race
    assert not supports(meta(4, 64), torch.empty(64, dtype=torch.bfloat16))  # another device
    assert not supports(meta(4, 64), w, torch.empty(4, 64, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,n,pad", [((3,), 896, 0), ((5,), 40, 7), ((2, 3), 96, 0),
                                         ((0,), 64, 0)])
def test_plain_without_a_residual_matches_the_reference(interpreted, dtype, weight_dtype, shape,
                                                        n, pad):
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    obj = layer(n, weight_dtype, n + 3)
    g = torch.Generator().manual_seed(n + 4)
    wide = (torch.randn(*shape, n + pad, generator=g) * 3).to(dtype)
    x = wide[..., :n]
    before = wide.clone()
    got = interpreted.rms_norm(x, obj.weight, obj.variance_epsilon)
    want = ReferenceBackend().rms_norm(obj, x)
    assert got.shape == x.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, **PLAIN_TOL.for_dtype(dtype))
    assert torch.equal(wide, before), "x was written without a residual"


def _assert_residual(got, want, dtype):
    if dtype == torch.bfloat16:  # the interpreter rounds fp32 -> bf16 toward zero: one ulp
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)
    else:
        assert torch.equal(got, want), "the residual is not the fp32 sum rounded once"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,n", [((4,), 2048), ((3,), 40), ((2, 3), 96)])
def test_plain_with_a_residual_normalises_the_fp32_sum_in_place(interpreted, dtype, shape, n):
    """As SGLang's fused add-RMSNorm: the sum in fp32, normalised unrounded, its rounding
    written into the residual and the normed rows into x."""
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    obj = layer(n, torch.bfloat16, n + 5)
    g = torch.Generator().manual_seed(n + 6)
    x = (torch.randn(*shape, n, generator=g) * 3).to(dtype)
    residual = (torch.randn(*shape, n, generator=g) * 3).to(dtype)
    want_out, want_res = ReferenceBackend().rms_norm(obj, x.clone(), residual.clone())
    got_out, got_res = interpreted.rms_norm(x, obj.weight, obj.variance_epsilon, residual)
    assert got_out is x and got_res is residual
    _assert_residual(got_res, want_res, dtype)
    torch.testing.assert_close(got_out, want_out, **PLAIN_TOL.for_dtype(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_adds_a_post_residual_addition_as_forward_native(interpreted, dtype):
    """``x + residual + post`` summed in fp32 (one rounding, not SGLang's CUDA path's two),
    the sum in a new tensor: the caller's residual is left as it was."""
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    n = 200
    obj = layer(n, torch.float32, 7)
    g = torch.Generator().manual_seed(8)
    x, residual, post = ((torch.randn(6, n, generator=g) * 3).to(dtype) for _ in range(3))
    before, x0 = residual.clone(), x.clone()
    want_out, want_res = ReferenceBackend().rms_norm(obj, x.clone(), residual.clone(), post)
    got_out, got_res = interpreted.rms_norm(x, obj.weight, obj.variance_epsilon, residual, post)
    assert got_out is x and got_res is not residual
    assert torch.equal(residual, before), "the caller's residual was written"
    _assert_residual(got_res, want_res, dtype)
    torch.testing.assert_close(got_out, want_out, **PLAIN_TOL.for_dtype(dtype))
    # The sum is the three-way one: leaving post out is visibly different.
    assert not torch.allclose(got_res.float(), x0.float() + residual.float(), atol=0.1)
