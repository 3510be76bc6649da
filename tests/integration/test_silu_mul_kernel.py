"""sglang-fl's SiLU-and-mul kernel (``sglang_fl/kernels/silu_mul.py``, the ``flagos`` backend's
``silu_and_mul`` on a device), run by Triton's interpreter on this CPU (``TRITON_INTERPRET=1``)
against the reference backend on a real SGLang ``SiluAndMul`` layer: widths that are not a
multiple of the block (the masked tail), several blocks per row, rows that are views of a
wider buffer (a stride between rows), 3-D inputs and every float dtype. The GPU suite runs it
through the dispatch on real model widths (tests/gpu)."""

from __future__ import annotations

import pytest
import torch

from sglang_fl.dispatch.ops import op_spec
from tests.integration.conftest import interpreted_fixture

pytest.importorskip("triton", reason="the kernel is Triton; triton is not installed here")

pytestmark = pytest.mark.integration

TOL = op_spec("silu_and_mul").tolerance


#: The launcher running its kernel through Triton's interpreter.
interpreted = interpreted_fixture("sglang_fl.kernels.silu_mul", "silu_and_mul_kernel")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,d,pad", [((3,), 8, 0), ((2,), 17, 5), ((4,), 1100, 3),
                                         ((2, 3), 40, 0), ((0,), 16, 0)])
def test_matches_the_reference(interpreted, dtype, shape, d, pad):
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    g = torch.Generator().manual_seed(d)
    wide = (torch.randn(*shape, 2 * d + pad, generator=g) * 4).to(dtype)
    x = wide[..., :2 * d]  # with pad > 0 the rows are views with a stride of 2d + pad
    before = wide.clone()
    got = interpreted.silu_and_mul(x)
    want = ReferenceBackend().silu_and_mul(None, x)
    assert got.shape == (*shape, d) and got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL.for_dtype(dtype))
    assert torch.equal(wide, before), "the input was written"


def test_takes_only_what_it_can():
    """CPU tensors, odd widths, a non-contiguous last dimension and other dtypes go to FlagGems
    instead."""
    from sglang_fl.kernels.silu_mul import supports

    meta = torch.empty(4, 16, device="meta")
    assert supports(meta)
    assert not supports(torch.empty(4, 16))
    assert not supports(torch.empty(4, 15, device="meta"))
    assert not supports(torch.empty(16, 4, device="meta").t())
    assert not supports(torch.empty(4, 16, device="meta", dtype=torch.float64))
    assert supports(torch.empty(4, 16, device="meta", dtype=torch.bfloat16))
