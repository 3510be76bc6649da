"""How the flagos backend calls FlagGems' fused recurrent GDN kernel, against the float64 oracle,
on CPU: FlagGems' Triton kernels need a GPU, so a small double stands in for
``flag_gems.fused_recurrent_gated_delta_rule_fwd`` with the behaviour FlagGems 5.0.2's kernels
have (read from its source; the same cases run on the real kernels in tests/gpu/test_gdn_ops.py):

- a call of at most 64 tokens keeps states as [K, V]; a longer one runs another kernel that reads
  and writes them as [V, K];
- in place, token ``t`` of sequence ``n`` reads its initial state from row
  ``ssm_state_indices[n, 0]`` and stores the state after it to row ``ssm_state_indices[n, t]``
  (flat offset ``n * stride(0) + t``: a 1-D index is right for one token per sequence only).

So the backend's calls are right only if it keeps every call within 64 tokens and gives each
token its own sequence's row: float32 prefill runs this kernel (not the TF32 chunk one), in
64-token windows. (Decode no longer does: it runs sglang-fl's own kernel on the pool,
tests/integration/test_gdn_decode_kernel.py.)
"""

from __future__ import annotations

import pytest
import torch
from test_gdn_numerics import _gdn_inputs, _tol, oracle_delta_rule, oracle_gating

from sglang_fl.dispatch.backends.flaggems import RECURRENT_WINDOW, FlagGemsBackend

pytestmark = pytest.mark.integration


class FlagGemsRecurrentDouble:
    """``fused_recurrent_gated_delta_rule_fwd`` as FlagGems 5.0.2 behaves (module docstring)."""

    def __init__(self):
        self.calls = []

    def fused_recurrent_gated_delta_rule_fwd(self, q, k, v, g, beta, scale, initial_state,
                                             inplace_final_state=True, cu_seqlens=None,
                                             ssm_state_indices=None, num_accepted_tokens=None,
                                             use_qk_l2norm_in_kernel=False):
        assert inplace_final_state and ssm_state_indices is not None and cu_seqlens is not None
        total, h, hv = q.shape[1], q.shape[2], v.shape[2]
        self.calls.append(total)
        vk_layout = total > 64
        flat = ssm_state_indices.reshape(-1)
        stride = ssm_state_indices.stride(0) if ssm_state_indices.ndim == 2 else 1
        out = torch.zeros(v.shape, dtype=q.dtype)
        for n in range(cu_seqlens.numel() - 1):
            bos, eos = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
            if eos == bos:
                continue
            row = initial_state[int(flat[n * stride])].double()
            state = row.transpose(-1, -2).clone() if vk_layout else row.clone()  # [HV, K, V]
            for t in range(eos - bos):
                for head in range(hv):
                    kk = k[0, bos + t, head // (hv // h)].double()
                    qq = q[0, bos + t, head // (hv // h)].double() * scale
                    s = state[head] * torch.exp(g[0, bos + t, head].double())
                    delta = (v[0, bos + t, head].double() - s.T @ kk) * beta[0, bos + t, head].double()
                    state[head] = s + torch.outer(kk, delta)
                    out[0, bos + t, head] = (state[head].T @ qq).to(q.dtype)
                stored = state.transpose(-1, -2) if vk_layout else state
                initial_state[int(flat[n * stride + t])] = stored.to(initial_state.dtype)
        return out, initial_state


@pytest.fixture
def flagos():
    backend = FlagGemsBackend()
    backend._gems = FlagGemsRecurrentDouble()
    return backend


@pytest.mark.parametrize("lengths", [[3], [130, 7, 1], [64, 65]], ids=lambda L: "+".join(map(str, L)))
def test_float32_prefill_runs_the_recurrent_kernel_in_windows(flagos, lengths):
    q, k, v, a, b, A_log, dt_bias, cu = _gdn_inputs(lengths, dk=8, dv=8)  # noqa: N806
    g, beta = (x.float()[None] for x in oracle_gating(A_log, a, b, dt_bias))
    n, hv = len(lengths), v.shape[2]
    init = torch.randn(n, hv, 8, 8, generator=torch.Generator().manual_seed(1))
    out, final = flagos.chunk_gated_delta_rule(None, q, k, v, g, beta, init.clone(), cu)
    assert max(flagos._gems.calls) <= RECURRENT_WINDOW
    for i in range(n):
        s, e = int(cu[i]), int(cu[i + 1])
        want_o, want_h = oracle_delta_rule(q[0, s:e], k[0, s:e], v[0, s:e], g[0, s:e],
                                           beta[0, s:e], init[i], 8 ** -0.5)
        torch.testing.assert_close(out[0, s:e].double(), want_o, **_tol("chunk_gated_delta_rule"))
        torch.testing.assert_close(final[i].double(), want_h, **_tol("chunk_gated_delta_rule"))


def test_the_chunk_kernel_gets_one_int64_cu_seqlens_per_source_tensor():
    """FlagGems caches its chunk indices on the identity of ``cu_seqlens``; SGLang passes every
    GDN layer of a forward the same int32 tensor. So every call with that tensor hands FlagGems
    the same int64 one; another tensor, or the same one written in place, gets a fresh copy with
    its values; an int64 tensor goes through as it is."""
    backend = FlagGemsBackend()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    first = backend._int64_cu(cu)
    assert first.dtype == torch.int64 and first.tolist() == [0, 3, 7]
    assert backend._int64_cu(cu) is first
    other = torch.tensor([0, 3, 7], dtype=torch.int32)
    assert backend._int64_cu(other) is not first
    again = backend._int64_cu(other)
    other[2] = 9  # in place: the version counter moves
    moved = backend._int64_cu(other)
    assert moved is not again and moved.tolist() == [0, 3, 9]
    wide = torch.tensor([0, 5], dtype=torch.int64)
    assert backend._int64_cu(wide) is wide
    with torch.inference_mode():  # inference tensors keep no version counter: identity alone
        frozen = torch.tensor([0, 4], dtype=torch.int32)
        assert backend._int64_cu(frozen) is backend._int64_cu(frozen)
