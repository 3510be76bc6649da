"""The accelerator route of SGLang's Gated DeltaNet kernels (ledger ``route:gdn-kernels``):
SGLang's real ``TritonGDNKernel`` and ``gdn_backend`` module, their methods and globals replaced
by ``sglang_glue.gdn.install_kernel_routes``, called here on CPU tensors as SGLang's GDN backend
calls them on a GPU. The GDN ops they reach are the reference's (pinned, strict), so each routed
call must equal the reference op on the same inputs, update the state pool in place, log its
``[OOT-DISPATCH]`` line, and hand calls the standard op cannot express back to SGLang's own.
"""

from __future__ import annotations

import importlib
import logging

import pytest
import torch

from sglang_fl.dispatch.backends import reference_gdn as ref

pytestmark = pytest.mark.integration

H, HV, DK, DV = 2, 4, 16, 8


@pytest.fixture(scope="module")
def routed(sglang_with_plugin):
    """The adapter's kernel class and backend module with the routes installed; SGLang's own
    methods and globals put back afterwards."""
    from sglang_fl.sglang_glue import gdn
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    module_name, class_name = adapter.GDN_KERNEL_CLASS.split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    backend = importlib.import_module(adapter.GDN_BACKEND_MODULE)
    saved = ([(cls, n, cls.__dict__[n]) for n in gdn.KERNEL_METHODS]
             + [(backend, n, getattr(backend, n)) for n in gdn.BACKEND_GLOBALS
                if n not in gdn.OPTIONAL_BACKEND_GLOBALS or hasattr(backend, n)])
    snapshot = cls.__dict__.get("supports_track_state_snapshot")
    gdn.install_kernel_routes(adapter)
    yield cls(), backend
    for owner, name, original in saved:
        setattr(owner, name, original)
    if snapshot is None:
        cls.__dict__.get("supports_track_state_snapshot") is None or delattr(
            cls, "supports_track_state_snapshot")
    else:
        cls.supports_track_state_snapshot = snapshot


def _inputs(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(1, total, H, DK, generator=g)
    k = torch.randn(1, total, H, DK, generator=g)
    v = torch.randn(1, total, HV, DV, generator=g)
    a, b = torch.randn(total, HV, generator=g), torch.randn(total, HV, generator=g)
    a_log, dt_bias = torch.rand(HV, generator=g) * 2 - 1, torch.randn(HV, generator=g)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    pool = 0.1 * torch.randn(6, HV, DV, DK, generator=g)
    return q, k, v, a, b, a_log, dt_bias, cu, pool


def test_every_method_and_global_the_route_replaces_is_routed(routed):
    kernel, backend = routed
    from sglang_fl.sglang_glue import gdn

    for name in gdn.KERNEL_METHODS:
        assert getattr(type(kernel), name).__sglang_fl_routed__, name
    for name in gdn.BACKEND_GLOBALS:
        if name in gdn.OPTIONAL_BACKEND_GLOBALS and not hasattr(backend, name):
            continue
        assert getattr(backend, name).__sglang_fl_routed__, name
    from sglang_fl.sglang_glue.adapters import get_adapter

    # 0.5.23's extra-buffer cache then hands extend a snapshot buffer instead of reading h
    assert getattr(type(kernel), "supports_track_state_snapshot", False) is \
        get_adapter().GDN_TRACK_STATE_SNAPSHOT


def test_extend_runs_the_chunk_op_on_the_pool_slots_and_writes_them_back(routed, caplog):
    kernel, _ = routed
    q, k, v, a, b, a_log, dt_bias, cu, pool = _inputs([70, 5])
    g, beta = ref.gdn_gating(a_log, a, b, dt_bias)
    slots = torch.tensor([4, 1], dtype=torch.int32)
    work = pool.clone()
    with caplog.at_level(logging.INFO, logger="sglang_fl"):
        out, final, h = kernel.extend(q, k, v, g, beta, ssm_states=work, cache_indices=slots,
                                      query_start_loc=cu)
    want_out, want_final = ref.chunk_gated_delta_rule(q, k, v, g, beta, pool[slots.long()], cu)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(work[slots.long()], want_final)
    untouched = [i for i in range(pool.shape[0]) if i not in (4, 1)]
    assert torch.equal(work[untouched], pool[untouched])
    assert final is None and h is None
    assert any("TritonGDNKernel.extend → reference(reference)" in r.getMessage()
               for r in caplog.records)


def test_decode_and_packed_decode_equal_the_recurrent_op(routed):
    kernel, _ = routed
    q, k, v, a, b, a_log, dt_bias, cu, pool = _inputs([1, 1, 1], seed=1)
    slots = torch.tensor([2, -1, 5], dtype=torch.int32)
    want_pool = pool.clone()
    want = ref.recurrent_gated_delta_rule(q, k, v, a, b, a_log, dt_bias, want_pool, slots, cu)
    work = pool.clone()
    got = kernel.decode(q, k, v, a, b, A_log=a_log, dt_bias=dt_bias, ssm_states=work,
                        cache_indices=slots, query_start_loc=cu)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(work, want_pool)
    mixed = torch.cat((q[0].reshape(3, -1), k[0].reshape(3, -1), v[0].reshape(3, -1)), dim=-1)
    packed_pool = pool.clone()
    got = kernel.packed_decode(mixed, a, b, A_log=a_log, dt_bias=dt_bias, scale=DK ** -0.5,
                               ssm_states=packed_pool, cache_indices=slots, num_v_heads=HV,
                               head_v_dim=DV)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(packed_pool, want_pool)


def test_gating_and_conv_globals_run_the_ops(routed):
    _, backend = routed
    q, k, v, a, b, a_log, dt_bias, cu, _ = _inputs([9, 4], seed=2)
    g, beta = backend.fused_gdn_gating(a_log, a, b, dt_bias)
    want_g, want_beta = ref.gdn_gating(a_log, a, b, dt_bias)
    torch.testing.assert_close(g, want_g)
    torch.testing.assert_close(beta, want_beta)

    gen = torch.Generator().manual_seed(3)
    dim, width = 12, 4
    x = torch.randn(dim, 13, generator=gen)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    states = torch.randn(3, dim, width - 1, generator=gen)
    slots, has = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([True, False])
    work, want_states = states.clone(), states.clone()
    out = backend.causal_conv1d_fn(x, weight, bias, activation="silu", conv_states=work,
                                   has_initial_state=has, cache_indices=slots,
                                   query_start_loc=cu, seq_lens_cpu=[9, 4])
    want = ref.causal_conv1d(x, weight, bias, want_states, cu, slots, has, "silu")
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(work, want_states)

    xt = torch.randn(2, dim, generator=gen)
    work, want_states = states.clone(), states.clone()
    out = backend.causal_conv1d_update(xt, work, weight, bias, "silu", conv_state_indices=slots)
    want = ref.causal_conv1d_update(xt, want_states, weight, bias, "silu", slots)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(work, want_states)


def test_calls_the_standard_ops_cannot_express_go_to_sglangs_own(routed, caplog, monkeypatch):
    """A speculative-verification conv update (intermediate windows) and a multi-item-scoring
    extend (inplace_update=False) reach SGLang's original function, logged as left to SGLang."""
    kernel, backend = routed
    seen = []
    original = backend.causal_conv1d_update.__wrapped__
    from sglang_fl.sglang_glue import gdn

    def sglang_own(*args, **kwargs):
        seen.append(sorted(kwargs))
        return "sglang's"

    monkeypatch.setattr(backend, "causal_conv1d_update", functools_wraps(original)(
        gdn._routed_conv_update(sglang_own)))
    x, state = torch.randn(1, 4), torch.randn(1, 4, 3)
    with caplog.at_level(logging.INFO, logger="sglang_fl"):
        got = backend.causal_conv1d_update(x, state, torch.randn(4, 4), None, "silu",
                                           conv_state_indices=torch.tensor([0]),
                                           intermediate_conv_window=torch.zeros(1))
    assert got == "sglang's" and seen == [["conv_state_indices", "intermediate_conv_window"]]
    assert any("gdn_backend.causal_conv1d_update → left to SGLang (intermediate_conv_window)"
               in r.getMessage() for r in caplog.records)

    calls = []
    extend = gdn._routed_extend(lambda self, *a, **kw: calls.append(kw) or ("own", None, None))
    q, k, v, a, b, a_log, dt_bias, cu, pool = _inputs([3])
    g, beta = ref.gdn_gating(a_log, a, b, dt_bias)
    assert extend(kernel, q, k, v, g, beta, ssm_states=pool, cache_indices=torch.tensor([0]),
                  query_start_loc=cu, inplace_update=False)[0] == "own"
    assert calls and calls[0]["inplace_update"] is False


def functools_wraps(fn):
    import functools

    return functools.wraps(fn)


def test_extend_writes_the_tracked_prefix_states_the_extra_buffer_cache_asks_for(routed):
    """SGLang's track_state contract: row i gets its state after track_chunk_idx[i] * 64
    tokens of this extend (fp32); rows at -1 are not written; the outputs and final states are
    those of the call without tracking."""
    kernel, _ = routed
    lengths = [150, 40, 200, 70]
    q, k, v, a, b, a_log, dt_bias, cu, pool = _inputs(lengths, seed=4)
    g, beta = ref.gdn_gating(a_log, a, b, dt_bias)
    slots = torch.tensor([4, 1, 0, 3], dtype=torch.int32)
    chunk_idx = torch.tensor([2, -1, 1, 0], dtype=torch.int32)
    track = torch.full((4, *pool.shape[1:]), float("nan"))
    work = pool.clone()
    out, _, _ = kernel.extend(q, k, v, g, beta, ssm_states=work, cache_indices=slots,
                              query_start_loc=cu, track_state=track, track_chunk_idx=chunk_idx)
    want_out, want_final = ref.chunk_gated_delta_rule(q, k, v, g, beta, pool[slots.long()], cu)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(work[slots.long()], want_final)
    for row, (start, prefix) in {0: (0, 128), 2: (190, 64)}.items():
        span = slice(start, start + prefix)
        _, want = ref.chunk_gated_delta_rule(
            q[:, span], k[:, span], v[:, span], g[:, span], beta[:, span],
            pool[slots[row].long()].unsqueeze(0), torch.tensor([0, prefix], dtype=torch.int32))
        torch.testing.assert_close(track[row], want[0])
    torch.testing.assert_close(track[3], pool[3])  # no token of it yet: its initial state
    assert track[1].isnan().all()


def test_the_conv_route_hands_sglangs_host_lengths_to_the_op(routed, monkeypatch):
    """SGLang passes the sequences' lengths on the host beside query_start_loc; the route hands
    them on, so SGLang's kernel (vendor) and the reference need not sync the device to read
    them. An impl written before the parameter still serves (it reads query_start_loc)."""
    _, backend = routed
    seen = []
    real = ref.causal_conv1d

    def recording(*args):
        seen.append(args[-1])
        return real(*args)

    monkeypatch.setattr(ref, "causal_conv1d", recording)
    gen = torch.Generator().manual_seed(4)
    dim, width = 6, 4
    x, weight = torch.randn(dim, 7, generator=gen), torch.randn(dim, width, generator=gen)
    states = torch.randn(3, dim, width - 1, generator=gen)
    cu = torch.tensor([0, 5, 7], dtype=torch.int32)
    backend.causal_conv1d_fn(x, weight, None, activation="silu", conv_states=states,
                             has_initial_state=torch.tensor([True, True]),
                             cache_indices=torch.tensor([1, 2]), query_start_loc=cu,
                             seq_lens_cpu=[5, 2])
    assert seen == [[5, 2]]

    from sglang_fl.dispatch.ops import op_spec
    from sglang_fl.dispatch.types import BackendImplKind, OpImpl
    from sglang_fl.dispatch.verify import verify_impl

    def before(obj, x, weight, bias, conv_states, query_start_loc, cache_indices,
               has_initial_state, activation="silu"):
        return real(x, weight, bias, conv_states, query_start_loc, cache_indices,
                    has_initial_state, activation)

    impl = verify_impl(OpImpl("causal_conv1d", "vendor.old", BackendImplKind.VENDOR, before,
                              vendor="old"))
    assert "seq_lens_cpu" in op_spec("causal_conv1d").optional
    out = impl.fn(None, x, weight, None, states.clone(), cu, torch.tensor([1, 2]),
                  torch.tensor([True, True]), "silu", [5, 2])
    assert out.shape == x.shape


def test_the_reference_conv_with_host_lengths_equals_it_without_and_checks_them():
    gen = torch.Generator().manual_seed(5)
    dim, width = 6, 4
    x, weight = torch.randn(dim, 9, generator=gen), torch.randn(dim, width, generator=gen)
    bias = torch.randn(dim, generator=gen)
    states = torch.randn(4, dim, width - 1, generator=gen)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    slots, has = torch.tensor([3, 0]), torch.tensor([False, True])
    a, b = states.clone(), states.clone()
    want = ref.causal_conv1d(x, weight, bias, a, cu, slots, has, "silu")
    got = ref.causal_conv1d(x, weight, bias, b, cu, slots, has, "silu", [4, 5])
    torch.testing.assert_close(got, want)
    assert torch.equal(a, b) and torch.equal(a[1:3], states[1:3])  # slots 1, 2 are nobody's
    assert not torch.equal(a[3], states[3]) and torch.equal(a[3], x[:, 1:4])  # its last inputs
    with pytest.raises(ValueError, match=r"seq_lens_cpu \[4, 4\] must be non-negative and sum "
                                         r"to the token count 9"):
        ref.causal_conv1d(x, weight, bias, states.clone(), cu, slots, has, "silu", [4, 4])
