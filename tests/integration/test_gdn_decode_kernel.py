"""sglang-fl's GDN decode kernel (``sglang_fl/kernels/gdn_decode.py``, the ``flagos`` backend's
``recurrent_gated_delta_rule`` and packed decode), run by Triton's interpreter on this CPU
(``TRITON_INTERPRET=1``) against the float64 oracle and the reference backend.

The cases are the ones a server sends and the ones the contract allows: several sequences of one
token (decode) and of several tokens, a slot-less row (negative index: starts from zeros, writes
nothing), slots out of order with untouched slots around them (must stay bit for bit), q/k/v as
strided views of one projection (the packed decode), value heads sharing key heads, head sizes
that are not powers of two or not multiples of the kernel's value block, and bf16 pools.
The GPU suite runs the same ops on the real kernels (tests/gpu/test_gdn_ops.py).
"""

from __future__ import annotations

import pytest
import torch
from test_gdn_numerics import _gdn_inputs, _tol, oracle_delta_rule, oracle_gating

from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
from sglang_fl.dispatch.backends.reference import ReferenceBackend
from tests.integration.conftest import interpreted_fixture

pytest.importorskip("triton", reason="the GDN decode kernel is Triton; triton is not installed here")

pytestmark = pytest.mark.integration

OP = "recurrent_gated_delta_rule"

#: The launcher running its kernel through Triton's interpreter.
interpreted = interpreted_fixture("sglang_fl.kernels.gdn_decode", "gdn_recurrent_kernel")


def _pool(n, hv, dv, dk, dtype, seed=2):
    return torch.randn(n, hv, dv, dk, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize(("lengths", "h", "hv", "dk", "dv", "dtype"), [
    ([1] * 5, 2, 4, 16, 8, torch.float32),       # decode
    ([1] * 80, 2, 4, 8, 8, torch.float32),       # more sequences than the old 64-token windows
    ([1, 1, 3], 1, 2, 16, 48, torch.float32),    # several tokens; V not a multiple of the block
    ([2, 4], 2, 2, 24, 8, torch.bfloat16),       # K not a power of two; bf16 everywhere
], ids=["decode-5", "decode-80", "1+1+3-v48", "2+4-k24-bf16"])
def test_the_kernel_matches_the_oracle_and_touches_only_its_slots(interpreted, lengths, h, hv, dk,
                                                                   dv, dtype):
    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs(lengths, h=h, hv=hv, dk=dk, dv=dv, seed=3,  # noqa: N806
                                                    dtype=dtype)
    n = len(lengths)
    pool = _pool(n + 3, hv, dv, dk, dtype)
    slots = torch.arange(2, n + 2, dtype=torch.int32).flip(0)  # out of order, slots 0, 1, n+2 idle
    slots[-1] = -1  # a slot-less row
    work = pool.clone()
    out = interpreted.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, work, slots, cu)
    assert out.shape == v.shape and out.dtype == dtype
    g, beta = oracle_gating(A_log, a, b, dt_bias)
    tol = _tol(OP, dtype)
    for i, slot in enumerate(slots.tolist()):
        s, e = int(cu[i]), int(cu[i + 1])
        want_o, want_h = oracle_delta_rule(q[0, s:e], k[0, s:e], v[0, s:e], g[s:e],
                                           beta[s:e].to(dtype).double(),
                                           pool[slot] if slot >= 0 else None, dk ** -0.5)
        torch.testing.assert_close(out[0, s:e].double(), want_o, **tol)
        if slot >= 0:
            torch.testing.assert_close(work[slot].double(), want_h, **tol)
    untouched = [i for i in range(n + 3) if i not in slots.tolist()]
    assert torch.equal(work[untouched], pool[untouched])


def test_packed_decode_reads_strided_views_of_one_projection(interpreted):
    """The packed decode as SGLang calls it: q | k | v rows of one projection buffer (q/k/v are
    strided views), padded rows with index -1; against the reference backend, unpadded rows."""
    batch, h, hv, dk, dv = 6, 2, 4, 16, 16
    gen = torch.Generator().manual_seed(5)
    mixed = torch.randn(batch, 2 * h * dk + hv * dv, generator=gen).to(torch.bfloat16)
    a = torch.randn(batch, hv, generator=gen).to(torch.bfloat16)
    b = torch.randn(batch, hv, generator=gen).to(torch.bfloat16)
    A_log, dt_bias = torch.rand(hv, generator=gen) - 0.5, torch.randn(hv, generator=gen)  # noqa: N806
    pool = _pool(batch + 2, hv, dv, dk, torch.float32, seed=6)
    slots = torch.tensor([3, 0, -1, 5, 7, -1], dtype=torch.int64)
    work, want = pool.clone(), pool.clone()
    out = FlagGemsBackend().packed_recurrent_gated_delta_rule(None, mixed, a, b, A_log, dt_bias,
                                                              work, slots)
    ref = ReferenceBackend().packed_recurrent_gated_delta_rule(None, mixed, a, b, A_log, dt_bias,
                                                               want, slots)
    rows = slots >= 0
    tol = _tol("packed_recurrent_gated_delta_rule", torch.bfloat16)
    torch.testing.assert_close(out[:, rows].float(), ref[:, rows].float(), **tol)
    torch.testing.assert_close(work, want, **tol)
    assert torch.equal(work[[1, 2, 4, 6]], pool[[1, 2, 4, 6]])


def test_gating_and_l2norm_switches_follow_the_contract(interpreted):
    """softplus with a beta and a threshold that bites, and no q/k l2 norm: the kernel against
    the reference backend (which follows torch's softplus)."""
    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs([1, 2], hv=4, dk=8, dv=8, seed=7)  # noqa: N806
    a = a * 10  # a + dt_bias above the threshold / beta for some heads
    pool = _pool(2, 4, 8, 8, torch.float32, seed=8)
    slots = torch.tensor([1, 0], dtype=torch.int32)
    work, want = pool.clone(), pool.clone()
    kw = dict(scale=0.3, use_qk_l2norm=False, softplus_beta=2.0, softplus_threshold=5.0)
    out = interpreted.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, work, slots, cu,
                                                 **kw)
    ref = ReferenceBackend().recurrent_gated_delta_rule(None, q, k, v, a, b, A_log, dt_bias, want,
                                                        slots, cu, **kw)
    tol = _tol(OP)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(work, want, **tol)


def test_bad_shapes_are_refused_naming_them():
    from sglang_fl.kernels import gdn_decode

    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs([1, 1])  # noqa: N806
    pool = _pool(2, 4, 8, 16, torch.float32)
    with pytest.raises(ValueError, match=r"state \[slots, 4, 8, 16\] expected"):
        gdn_decode.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, pool[..., :8],
                                              torch.tensor([0, 1]), cu)
    with pytest.raises(ValueError, match="3 state indices for 2 sequences"):
        gdn_decode.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, pool,
                                              torch.tensor([0, 1, 1]), cu)


def test_no_cu_seqlens_is_one_sequence_as_the_reference_reads_it(interpreted):
    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs([3], h=1, hv=2, dk=8, dv=8, seed=7,  # noqa: N806
                                                    dtype=torch.float32)
    pool = _pool(2, 2, 8, 8, torch.float32)
    slots = torch.tensor([1], dtype=torch.int32)
    got_pool, want_pool = pool.clone(), pool.clone()
    got = interpreted.recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, got_pool, slots,
                                                 None)
    want = ReferenceBackend().recurrent_gated_delta_rule(None, q, k, v, a, b, A_log, dt_bias,
                                                         want_pool, slots, cu)
    tol = _tol(OP, torch.float32)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(got_pool, want_pool, **tol)
