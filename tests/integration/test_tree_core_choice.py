"""Compat fix ``rust_tree_core`` (SGLang 0.5.23): the radix cache's TreeCore choice, through
SGLang's own ``resolve_tree_core_backend`` and its own Rust TreeCore.

On the H200 image (torch 2.11) 0.5.23's prebuilt Rust TreeCore panicked on the first prefill
(``UnknownKind(19)``); this CPU stack's torch (2.13) runs it. So the real check runs here and
must keep the Rust core; the failing case is the adapter's check answering with a reason (a
torch 2.11 cannot be installed beside this one), and then SGLang's Python TreeCore is used,
with one warning, unless the user named a TreeCore.
"""

from __future__ import annotations

import importlib
import logging
import types

import pytest

from sglang_fl.compat.fixes import fix_rust_tree_core, tree_core_decision
from sglang_fl.sglang_glue.adapters import get_adapter

pytestmark = pytest.mark.integration

ENV = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"


def _never():
    raise AssertionError("the Rust TreeCore was checked where no check was due")


def test_the_decision():
    assert tree_core_decision("rust", None, lambda: None) == ("rust", None)
    assert tree_core_decision("rust", None, lambda: "it panics") == ("python", "it panics")
    assert tree_core_decision("rust", "rust", _never) == ("rust", None)  # the user's choice
    assert tree_core_decision("python", "python", _never) == ("python", None)
    assert tree_core_decision("python", None, _never) == ("python", None)  # SGLang's own fallback


@pytest.fixture
def registry():
    adapter = get_adapter()
    if adapter.TREE_CORE_REGISTRY is None:
        pytest.skip(f"SGLang {adapter.version} has one radix tree (no TreeCore choice)")
    from sglang_fl import compat

    compat.activate()
    return importlib.import_module(adapter.TREE_CORE_REGISTRY)


def _params():
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    return CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=None,
                           page_size=1, tree_components=(ComponentType.FULL,))


def test_sglangs_resolution_is_wrapped_and_the_real_rust_core_passes_here(registry, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert getattr(registry.resolve_tree_core_backend, "__sglang_fl_fix__", False)
    assert get_adapter().rust_tree_core_problem() is None
    assert registry.select_tree_core_backend(_params()) == "rust"


def _fixed_copy(registry, monkeypatch, problem):
    """SGLang's own resolution, wrapped afresh, with the adapter's check answering ``problem``."""
    calls = []

    def check(device="cpu"):
        calls.append(device)
        return problem

    monkeypatch.setattr(get_adapter(), "rust_tree_core_problem", check)
    module = types.ModuleType("tree_core_registry_copy")
    module.resolve_tree_core_backend = registry.resolve_tree_core_backend.__wrapped__
    fix_rust_tree_core(module)
    return module.resolve_tree_core_backend, calls


def test_a_failing_rust_core_gives_the_python_one_with_one_warning(registry, monkeypatch, caplog):
    monkeypatch.delenv(ENV, raising=False)
    resolve, calls = _fixed_copy(registry, monkeypatch, "it fails a one-key insert: UnknownKind(19)")
    with caplog.at_level(logging.WARNING, logger="sglang_fl.compat"):
        assert resolve("rust", _params()) == "python"
        assert resolve("rust", _params()) == "python"
    assert calls == ["cpu"]  # checked once per process and device
    warnings = [r.getMessage() for r in caplog.records if "TreeCore" in r.getMessage()]
    assert len(warnings) == 1 and "UnknownKind(19)" in warnings[0] and f"{ENV}=rust" in warnings[0]


@pytest.mark.parametrize("user", ["rust", "python"])
def test_the_users_tree_core_is_kept(registry, monkeypatch, user):
    monkeypatch.setenv(ENV, user)
    resolve, calls = _fixed_copy(registry, monkeypatch, "it fails")
    assert resolve(user, _params()) == user
    assert calls == []


def test_doctor_shows_the_decision(registry, monkeypatch):
    from sglang_fl.cli_doctor import format_report
    from sglang_fl.doctor import run_doctor

    monkeypatch.delenv(ENV, raising=False)
    report = run_doctor()
    assert report["radix_cache"] == {"tree_core": "rust", "from": "SGLang's default",
                                     "device": "cpu", "rust_problem": None}
    monkeypatch.setattr(get_adapter(), "rust_tree_core_problem", lambda device: "it fails")
    report = run_doctor()
    assert report["radix_cache"]["tree_core"] == "python"
    assert report["radix_cache"]["from"] == "sglang-fl fix rust_tree_core"
    assert not [f for f in report["findings"] if f["area"] == "radix_cache"]
    assert "radix cache python TreeCore (from sglang-fl fix rust_tree_core)" in format_report(report)
    monkeypatch.setenv(ENV, "rust")
    report = run_doctor()
    assert report["radix_cache"]["tree_core"] == "rust"
    assert [f["level"] for f in report["findings"] if f["area"] == "radix_cache"] == ["warning"]
