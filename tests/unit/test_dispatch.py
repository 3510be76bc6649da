"""Dispatch policy and manager: ordering, vendor filters, strict vs fallback, the
'No available implementation' message, cached resolution, fork and thread safety."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from sglang_fl.config import build_settings
from sglang_fl.dispatch.manager import BackendStatus, OpManager
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, NoImplementationError, OpImpl


def tagged(tag):
    def fn(obj, x, residual=None, post_residual_addition=None):
        return (tag, x)
    return fn


def failing(obj, x, residual=None, post_residual_addition=None):
    raise RuntimeError("kernel exploded")


IMPLS = [
    OpImpl("rms_norm", "flagos", BackendImplKind.FLAGOS, tagged("flagos")),
    OpImpl("rms_norm", "vendor.cuda", BackendImplKind.VENDOR, tagged("cuda"), vendor="cuda"),
    OpImpl("rms_norm", "vendor.ascend", BackendImplKind.VENDOR, tagged("ascend"), vendor="ascend",
           priority=BackendPriority.VENDOR + 1),
    OpImpl("rms_norm", "reference", BackendImplKind.REFERENCE, tagged("reference")),
]


def manager_for(env, impls=IMPLS):
    settings = build_settings(env=env, detect_platform=lambda: "none")
    registry = OpRegistry()
    registry.register_many(impls)
    return OpManager(registry, SelectionPolicy.from_settings(settings))


def order(env):
    return [i.impl_id for i in manager_for(env).resolve("rms_norm").candidates]


def test_priorities_match_the_contract():
    assert (BackendPriority.FLAGOS, BackendPriority.VENDOR, BackendPriority.REFERENCE) == (150, 100, 50)
    assert OpImpl("x", "r", "reference", tagged("r")).priority == 50


def test_prefer_orders_kinds_then_priority_within_a_kind():
    assert order({}) == ["flagos", "vendor.ascend", "vendor.cuda", "reference"]
    assert order({"SGLANG_FL_PREFER": "vendor"}) == ["vendor.ascend", "vendor.cuda", "flagos", "reference"]
    assert order({"SGLANG_FL_PREFER": "reference"})[0] == "reference"


def test_per_op_order_wins_and_drops_unlisted_kinds():
    assert order({"SGLANG_FL_PER_OP": "rms_norm=reference|vendor"}) == [
        "reference", "vendor.ascend", "vendor.cuda"]


def test_allow_and_deny_vendors():
    assert "vendor.cuda" not in order({"SGLANG_FL_DENY_VENDORS": "cuda"})
    assert order({"SGLANG_FL_ALLOW_VENDORS": "cuda", "SGLANG_FL_PREFER": "vendor"})[:1] == ["vendor.cuda"]
    sel = manager_for({"SGLANG_FL_DENY_VENDORS": "cuda"}).selection("rms_norm")
    assert ("vendor.cuda", "vendor 'cuda' in SGLANG_FL_DENY_VENDORS") in sel.excluded


def test_strict_keeps_only_the_first_kind():
    assert order({"SGLANG_FL_STRICT": "1"}) == ["flagos"]


def test_no_available_implementation_names_op_registered_and_excluded():
    impls = [IMPLS[1]]  # only vendor.cuda
    m = manager_for({"SGLANG_FL_DENY_VENDORS": "cuda"}, impls)
    with pytest.raises(NoImplementationError) as err:
        m.resolve("rms_norm")
    msg = str(err.value)
    assert "No available implementation for op 'rms_norm'" in msg
    assert "registered: vendor.cuda" in msg and "SGLANG_FL_DENY_VENDORS" in msg


def test_strict_with_unavailable_preferred_backend_errors():
    m = manager_for({"SGLANG_FL_STRICT": "1"}, [IMPLS[3]])  # flagos preferred, only reference
    with pytest.raises(NoImplementationError, match="strict"):
        m.resolve("rms_norm")


def manager_without_vendors(env, ops=("rms_norm", "silu_and_mul")):
    """Only reference impls registered; the other backends recorded as discovery would on a
    host without them (one vendor present but lacking silu_and_mul)."""
    m = manager_for(env, [OpImpl(op, "reference", "reference", tagged("reference")) for op in ops]
                    + [OpImpl("rms_norm", "vendor.acme", "vendor", tagged("acme"), vendor="acme")])
    m.record_backend(BackendStatus("reference", "reference", True, "built-in", ops))
    m.record_backend(BackendStatus("flagos", "flagos", False, "import flag_gems failed: no GPU"))
    m.record_backend(BackendStatus("vendor.cuda", "vendor", False, "no CUDA device"))
    m.record_backend(BackendStatus("vendor.acme", "vendor", True, "entry point", ("rms_norm",)))
    return m


def test_skipped_names_every_backend_of_an_accepted_kind_and_why():
    m = manager_without_vendors({"SGLANG_FL_PREFER": "vendor", "SGLANG_FL_DENY_VENDORS": "acme"})
    assert m.skipped("rms_norm") == [
        ("vendor.acme", "vendor", "vendor 'acme' in SGLANG_FL_DENY_VENDORS"),
        ("flagos", "flagos", "import flag_gems failed: no GPU"),
        ("vendor.cuda", "vendor", "no CUDA device"),
    ]
    assert ("vendor.acme", "vendor", "implements no silu_and_mul") in m.skipped("silu_and_mul")


def test_resolve_all_logs_each_op_that_missed_its_preferred_kind_once(caplog):
    m = manager_without_vendors({"SGLANG_FL_PREFER": "vendor"})
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch"):
        resolved = m.resolve_all(["rms_norm", "silu_and_mul"])
        m.resolve("rms_norm")  # later look-ups (one per layer) log nothing
    assert resolved["rms_norm"].impl.impl_id == "vendor.acme"
    assert resolved["rms_norm"].passed_over == ()
    assert resolved["silu_and_mul"].passed_over == (
        ("vendor", "vendor.cuda: no CUDA device; vendor.acme: implements no silu_and_mul"),
        ("flagos", "flagos: import flag_gems failed: no GPU"),
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "silu_and_mul: preferred vendor unavailable (vendor.cuda: no CUDA device; vendor.acme: "
        "implements no silu_and_mul), flagos unavailable (flagos: import flag_gems failed: "
        "no GPU); using reference(reference)"]


def test_resolve_all_names_every_op_without_an_implementation_in_one_error():
    m = manager_without_vendors({"SGLANG_FL_PREFER": "flagos", "SGLANG_FL_STRICT": "1"})
    with pytest.raises(NoImplementationError) as err:
        m.resolve_all(["rms_norm", "silu_and_mul"])
    msg = str(err.value)
    assert msg.startswith("No available implementation for ops 'rms_norm', 'silu_and_mul' "
                          "(SGLANG_FL_STRICT=1")
    for op, registered in (("rms_norm", "reference, vendor.acme"), ("silu_and_mul", "reference")):
        assert (f"\n  {op}: accepts flagos (strict); no flagos: flagos: import flag_gems failed: "
                f"no GPU; registered: {registered}") in msg


def test_resolve_all_with_one_op_missing_raises_that_ops_own_message():
    m = manager_without_vendors({"SGLANG_FL_PER_OP": "silu_and_mul=vendor"})
    with pytest.raises(NoImplementationError) as err:
        m.resolve_all(["rms_norm", "silu_and_mul"])
    assert str(err.value) == (
        "No available implementation for op 'silu_and_mul': accepts vendor; no vendor: "
        "vendor.cuda: no CUDA device; vendor.acme: implements no silu_and_mul; "
        "registered: reference")


def test_fallback_logs_once_and_uses_next_candidate(caplog):
    impls = [OpImpl("rms_norm", "flagos", "flagos", failing), IMPLS[3]]
    m = manager_for({}, impls)
    with caplog.at_level(logging.WARNING, logger="sglang_fl.dispatch"):
        assert m.call("rms_norm", None, 1) == ("reference", 1)
        assert m.call("rms_norm", None, 2) == ("reference", 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "'rms_norm'" in warnings[0] and "'flagos'" in warnings[0] and "kernel exploded" in warnings[0]
    assert m.resolve("rms_norm").failed[0][0] == "flagos"


def test_strict_propagates_runtime_errors():
    impls = [OpImpl("rms_norm", "flagos", "flagos", failing), IMPLS[3]]
    m = manager_for({"SGLANG_FL_STRICT": "1"}, impls)
    with pytest.raises(RuntimeError, match="kernel exploded"):
        m.call("rms_norm", None, 1)


def test_every_candidate_failing_reports_no_available_implementation():
    impls = [OpImpl("rms_norm", "flagos", "flagos", failing),
             OpImpl("rms_norm", "reference", "reference", failing)]
    with pytest.raises(NoImplementationError, match="every candidate failed"):
        manager_for({}, impls).call("rms_norm", None, 1)


def test_resolution_runs_once(monkeypatch):
    m = manager_for({})
    calls = []
    original = m._resolve_uncached
    monkeypatch.setattr(m, "_resolve_uncached", lambda op: calls.append(op) or original(op))
    first = m.resolve("rms_norm")
    for _ in range(100):
        assert m.resolve("rms_norm") is first
    assert calls == ["rms_norm"]


def test_concurrent_resolution_from_threads_builds_one_resolution():
    m = manager_for({})
    results, barrier = [], threading.Barrier(8)

    def worker():
        barrier.wait()
        results.append(m.resolve("rms_norm"))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in results}) == 1


def test_registry_rejects_a_different_impl_under_a_taken_id_but_accepts_the_same_again():
    reg = OpRegistry()
    reg.register(IMPLS[0])
    reg.register(IMPLS[0])
    with pytest.raises(ValueError, match="already registered"):
        reg.register(OpImpl("rms_norm", "flagos", "flagos", failing))


def test_vendor_impl_must_name_its_vendor():
    with pytest.raises(ValueError, match="vendor"):
        OpImpl("rms_norm", "vendor.x", BackendImplKind.VENDOR, tagged("x"))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_survives_fork_rediscovery_and_resolution_in_child(monkeypatch):
    """A real fork while another thread holds the registry lock; the child re-runs discovery
    (duplicate registration is a no-op) and resolves without deadlock."""
    from sglang_fl.dispatch import manager as manager_mod
    from sglang_fl.dispatch.discovery import discover_backends

    monkeypatch.setenv("SGLANG_FL_PLATFORM", "cpu")
    from sglang_fl.config import reset_settings

    reset_settings()
    manager_mod.reset_manager()
    mgr = manager_mod.get_manager()
    mgr.resolve("rms_norm")
    held = threading.Event()
    release = threading.Event()

    def hold_lock():
        with mgr.registry._lock:
            held.set()
            release.wait(5)

    t = threading.Thread(target=hold_lock)
    t.start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            child = manager_mod.get_manager()
            discover_backends(child.registry)
            child.reset_resolution()
            code = 0 if child.resolve("rms_norm").impl.impl_id == "reference" else 2
        finally:
            os._exit(code)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    manager_mod.reset_manager()
    reset_settings()
    assert os.WEXITSTATUS(status) == 0


def test_skipped_says_why_an_available_backend_lacks_an_op():
    m = manager_for({"SGLANG_FL_PREFER": "vendor"})
    m.record_backend(BackendStatus("vendor.cuda", "vendor", True, "built-in", ("mrotary_embedding",),
                                   missing="sgl_kernel is not installed"))
    assert ("vendor.cuda", "vendor", "implements no silu_and_mul here (sgl_kernel is not installed)") \
        in m.skipped("silu_and_mul")


def test_attention_backends_register_by_name_once_and_the_vendor_lists_apply():
    from sglang_fl.dispatch.types import AttentionBackendImpl

    def factory(runner):
        return runner

    def other(runner):
        return runner

    reg = OpRegistry()
    impl = AttentionBackendImpl("chip_attn", vendor="chip", factory=factory)
    reg.register_attention_backend(impl)
    reg.register_attention_backend(AttentionBackendImpl("chip_attn", "chip", factory))  # re-run
    assert reg.attention_backends() == (impl,)
    with pytest.raises(ValueError, match="already registered by vendor 'chip'"):
        reg.register_attention_backend(AttentionBackendImpl("chip_attn", "rival", other))
    with pytest.raises(ValueError, match="lower-case letters"):
        AttentionBackendImpl("Chip-Attn", "chip", factory)
    policy = SelectionPolicy(op_backends={}, default_order=("flagos",), deny_vendors=("chip",))
    assert "SGLANG_FL_DENY_VENDORS" in policy.vendor_excluded("chip")
    assert SelectionPolicy(op_backends={}, default_order=("flagos",)).vendor_excluded("chip") == ""
