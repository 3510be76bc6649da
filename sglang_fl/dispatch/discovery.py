"""Backend discovery, run once per process when the manager is built.

Sources, in order: the built-in ``reference`` and ``flaggems`` backends; every
``dispatch/backends/vendor/<name>/register_ops.py`` in this package; every entry point in the
``sglang_fl.vendors`` group (a vendor shipping its backend as its own package points it at a
module with ``register_builtins(registry)``). Each finding is recorded as a BackendStatus so
``sglang-fl ops`` can say what was found and why the rest was skipped.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from pathlib import Path

from sglang_fl.dispatch.backends import Backend, register_backend
from sglang_fl.dispatch.manager import BackendStatus, OpManager
from sglang_fl.logging_setup import get_logger

logger = get_logger("dispatch")

VENDOR_ENTRY_POINT_GROUP = "sglang_fl.vendors"
_VENDOR_DIR = Path(__file__).resolve().parent / "backends" / "vendor"


def _status_of(name: str, backend: Backend | None, registered: tuple[str, ...], origin: str,
               kind: str = "vendor") -> BackendStatus:
    if registered:
        return BackendStatus(name, kind, True, origin, registered)
    reason = (backend.unavailable_reason if backend is not None else "") or "registered no ops"
    return BackendStatus(name, kind, False, reason)


def _run_register(manager: OpManager, name: str, module, origin: str) -> None:
    before = {(op, i.impl_id) for op in manager.registry.op_names() for i in manager.registry.impls(op)}
    module.register_builtins(manager.registry)
    after = {(op, i.impl_id) for op in manager.registry.op_names() for i in manager.registry.impls(op)}
    ops = tuple(sorted(op for op, _ in after - before))
    manager.record_backend(_status_of(f"vendor.{name}", getattr(module, "BACKEND", None), ops, origin))


def vendor_folders() -> list[str]:
    return sorted(p.parent.name for p in _VENDOR_DIR.glob("*/register_ops.py"))


def discover_backends(manager: OpManager) -> None:
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    for backend in (ReferenceBackend(), FlagGemsBackend()):
        ok = register_backend(manager.registry, backend)
        manager.record_backend(_status_of(
            backend.impl_id(), backend, backend.implemented_ops() if ok else (), "built-in",
            backend.kind.value))

    for name in vendor_folders():
        modname = f"sglang_fl.dispatch.backends.vendor.{name}.register_ops"
        try:
            _run_register(manager, name, importlib.import_module(modname), f"built-in {modname}")
        except Exception as exc:  # noqa: BLE001 - one broken vendor must not stop the others
            logger.warning("vendor backend %r failed to register: %s: %s", name, type(exc).__name__, exc)
            manager.record_backend(BackendStatus(f"vendor.{name}", "vendor", False, f"register failed: {exc}"))

    for ep in entry_points(group=VENDOR_ENTRY_POINT_GROUP):
        try:
            _run_register(manager, ep.name, ep.load(), f"entry point {ep.value}")
        except Exception as exc:  # noqa: BLE001
            logger.warning("vendor entry point %r failed: %s: %s", ep.name, type(exc).__name__, exc)
            manager.record_backend(BackendStatus(f"vendor.{ep.name}", "vendor", False, f"register failed: {exc}"))
