"""SGLang 0.5.23's fused QKVZ/BA unpack + conv1d update (its own kernel, CUDA only): kept where
``causal_conv1d_update`` routes to SGLang's own kernels (vendor.cuda), declined for any other
route so the op runs (seen on the H200 2026-12-03: the 27B-shaped hybrid's conv1d update never
reached the dispatch)."""

from __future__ import annotations

import types

import pytest

from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.sglang_glue import gdn

pytestmark = pytest.mark.integration


def _eligible(*args, **kwargs):
    return True, "eligible"


def _route(monkeypatch, impl_id, kind, vendor=None):
    impl = OpImpl("causal_conv1d_update", impl_id, kind, lambda obj, *a: None, vendor=vendor)
    slot = types.SimpleNamespace(bucket_impls=(impl,))
    monkeypatch.setattr(gdn, "_slot", lambda op, entry: slot)


def test_sglangs_fused_kernel_stays_where_the_route_is_sglangs_own(monkeypatch, tmp_path):
    import sglang_fl.config

    _route(monkeypatch, "vendor.cuda", BackendImplKind.VENDOR, vendor="cuda")
    check = gdn._routed_fused_conv_update_check(_eligible)
    log = tmp_path / "dispatch.log"
    monkeypatch.setattr(sglang_fl.config, "get_settings",
                        lambda: types.SimpleNamespace(dispatch_log=str(log)))
    assert check() == (True, "eligible")
    assert "gdn_backend.causal_conv1d_update → vendor(vendor.cuda) (SGLang's fused" in log.read_text()


@pytest.mark.parametrize("impl_id, kind", [("flagos", BackendImplKind.FLAGOS),
                                           ("reference", BackendImplKind.REFERENCE)])
def test_any_other_route_gets_the_unfused_path(monkeypatch, impl_id, kind):
    _route(monkeypatch, impl_id, kind)
    eligible, why = gdn._routed_fused_conv_update_check(_eligible)()
    assert not eligible and impl_id in why


def test_sglangs_own_refusal_passes_through(monkeypatch):
    monkeypatch.setattr(gdn, "_slot", lambda *a: pytest.fail("no route needed"))
    check = gdn._routed_fused_conv_update_check(lambda *a, **k: (False, "CUDA tensors are required"))
    assert check() == (False, "CUDA tensors are required")


def test_the_check_is_routed_in_sglangs_module_where_it_exists(sglang_with_plugin):
    import importlib

    from sglang_fl.sglang_glue.adapters import get_adapter

    module = importlib.import_module(get_adapter().GDN_BACKEND_MODULE)
    check = getattr(module, "can_use_fused_qkvzba_causal_conv1d_update_contiguous", None)
    if check is None:
        pytest.skip("no fused decode unpack + conv1d update here (SGLang 0.5.23 imports it on "
                    "CUDA/HIP/XPU hosts only)")
    assert getattr(check, "__sglang_fl_routed__", False)


def test_buckets_routed_apart_get_the_unfused_path(monkeypatch):
    """Per token bucket routes (`bridges.SizeRoutedSlot`): SGLang's fused kernel would take every
    bucket's calls, so it stays only where every bucket is SGLang's own."""
    impls = [OpImpl("causal_conv1d_update", "vendor.cuda", BackendImplKind.VENDOR,
                    lambda obj, *a: None, vendor="cuda"),
             OpImpl("causal_conv1d_update", "reference", BackendImplKind.REFERENCE,
                    lambda obj, *a: None)]
    slot = types.SimpleNamespace(bucket_impls=tuple(impls))
    monkeypatch.setattr(gdn, "_slot", lambda op, entry: slot)
    eligible, why = gdn._routed_fused_conv_update_check(_eligible)()
    assert not eligible and "reference" in why and "vendor.cuda" in why
