"""sglang-fl's GDN q/k kernel (``sglang_fl/kernels/gdn_qk.py``: L2 norm and expansion to the value
heads, the ``flagos`` backend's prologue to FlagGems' chunked GDN kernel), run by Triton's
interpreter on this CPU (``TRITON_INTERPRET=1``) against the PyTorch path it replaces
(`reference_gdn._l2norm` in fp32, rounded, then `_expand_heads`): q and k as SGLang passes them
(strided views of the conv's ``[tokens, q | k | v]`` output), head dims off the block, several
head blocks per token, no norm, and every float dtype. The GPU suite runs it through the
backend's ``chunk_gated_delta_rule`` (tests/gpu/test_gdn_ops.py)."""

from __future__ import annotations

import pytest
import torch

from sglang_fl.dispatch.backends.reference_gdn import L2NORM_EPS, _expand_heads, _l2norm
from tests.integration.conftest import interpreted_fixture

pytest.importorskip("triton", reason="the kernel is Triton; triton is not installed here")

pytestmark = pytest.mark.integration

#: The launcher running its kernel through Triton's interpreter.
interpreted = interpreted_fixture("sglang_fl.kernels.gdn_qk", "l2norm_expand_kernel")


def torch_path(x, heads_out, l2norm):
    """What the backend did before the kernel (and still does where `supports` says no)."""
    y = _l2norm(x.float()).to(x.dtype) if l2norm else x
    return _expand_heads(y, heads_out).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens,heads,dim,group,l2norm", [
    (5, 4, 16, 3, True),      # 27B's 16 -> 48 in small
    (3, 2, 24, 2, True),      # a head dim off the block (masked tail)
    (2, 48, 128, 1, True),    # 48 heads of 128: two head blocks per token
    (4, 3, 8, 2, False),      # expansion only
    (0, 4, 16, 3, True),      # no tokens
])
def test_matches_the_pytorch_path(interpreted, dtype, tokens, heads, dim, group, l2norm):
    g = torch.Generator().manual_seed(tokens * 100 + heads)
    width = 2 * heads * dim + 3 * dim  # q | k | v rows of the conv output
    qkv = (torch.randn(tokens, width, generator=g) * 3).to(dtype)
    before = qkv.clone()
    for part in (0, 1):  # q, then k: views with a stride of the whole row between tokens
        x = qkv[:, part * heads * dim:(part + 1) * heads * dim].view(1, tokens, heads, dim)
        got = interpreted.l2norm_expand(x, heads * group, l2norm, L2NORM_EPS)
        want = torch_path(x, heads * group, l2norm)
        assert got.shape == (1, tokens, heads * group, dim) and got.dtype == dtype
        assert got.is_contiguous()
        if dtype == torch.float32:  # one fp32 rounding apart at most
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        else:  # the same fp32 value rounded once: at most one unit apart (the interpreter
            # rounds fp32 to bf16 toward zero where the GPU rounds to nearest)
            ulp = torch.finfo(dtype).eps * want.float().abs().clamp_min(1e-30)
            assert ((got.float() - want.float()).abs() <= ulp).all()
    assert torch.equal(qkv, before), "the input was written"


def test_value_head_reads_its_key_head(interpreted):
    """Value head i is key head i // group (what SGLang's kernel reads), not i % heads."""
    x = torch.arange(1, 4, dtype=torch.float32).view(1, 1, 3, 1).expand(1, 1, 3, 4).contiguous()
    got = interpreted.l2norm_expand(x, 6, False)
    assert got[0, 0, :, 0].tolist() == [1, 1, 2, 2, 3, 3]


def test_takes_only_what_it_can():
    """CPU tensors, other dtypes, a batch of more than one, a non-contiguous head dimension and
    value heads that are not a multiple of the key heads stay on the PyTorch path."""
    from sglang_fl.kernels.gdn_qk import supports

    assert supports(torch.empty(1, 4, 16, 128, device="meta", dtype=torch.bfloat16), 48)
    assert not supports(torch.empty(1, 4, 16, 128, dtype=torch.bfloat16), 48)
    assert not supports(torch.empty(1, 4, 16, 128, device="meta", dtype=torch.float64), 48)
    assert not supports(torch.empty(2, 4, 16, 128, device="meta"), 48)
    assert not supports(torch.empty(1, 4, 128, 16, device="meta").transpose(2, 3), 48)
    assert not supports(torch.empty(1, 4, 16, 128, device="meta"), 40)
