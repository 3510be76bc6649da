"""Backend discovery, run once per process when the manager is built.

Sources, in order: the built-in ``reference`` and ``flaggems`` backends; every
``<name>/register_ops.py`` in the ``sglang_fl.dispatch.backends.vendor`` package (those of
`OPT_IN_VENDORS` only when enabled by name); every entry
point in the ``sglang_fl.vendors`` group (a vendor shipping its backend as its own package points
it at a module with ``register_builtins(registry)``).

A vendor's ``register_builtins`` may also register attention backends
(``registry.register_attention_backend``); they are kept whether or not its ops are available
(an attention backend has its own requirements) and handed to SGLang by
``sglang_fl.sglang_glue.attention``.

Each vendor registers into a registry of its own first, so that one refused by the op table
(a mistyped op method, a wrong signature: ``verify``) or failing half-way leaves nothing behind;
what it registered is then merged. Impls whose ``fn`` carries the upstream plugins'
``_is_available`` marker are kept only if it says yes. The result is one `BackendStatus` per
backend, so ``sglang-fl ops`` can say what was found and why the rest was skipped.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
import sys
from importlib.metadata import entry_points

from sglang_fl.dispatch.backends import Backend, register_backend, vendor
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendStatus
from sglang_fl.dispatch.verify import InvalidImplError, verify_backend_class
from sglang_fl.logging_setup import get_logger

logger = get_logger("dispatch")

VENDOR_ENTRY_POINT_GROUP = "sglang_fl.vendors"

#: Vendor folders that register nothing unless enabled by name (Settings ``enable_vendors``,
#: ``SGLANG_FL_ENABLE_VENDORS``): ``template`` is the copy source of a new vendor, and its
#: example attention backend would otherwise be live in every production server. Listed here,
#: not in the folder, so that a copy of the template is an ordinary vendor.
OPT_IN_VENDORS = ("template",)


def vendor_folders() -> list[str]:
    """Names of the folders of the vendor package that hold a ``register_ops.py``."""
    return sorted({m.name for m in pkgutil.iter_modules(vendor.__path__) if m.ispkg
                   and importlib.util.find_spec(f"{vendor.__name__}.{m.name}.register_ops")})


def discover_backends(registry: OpRegistry, enabled_vendors: tuple[str, ...] = ()) -> list[BackendStatus]:
    """Register every available backend into ``registry``; one status per backend found. A
    folder of `OPT_IN_VENDORS` not named in ``enabled_vendors`` is not even imported."""
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    statuses = []
    for backend in (ReferenceBackend(), FlagGemsBackend()):
        ok = register_backend(registry, backend)  # ours: a table mismatch raises, it is a bug
        statuses.append(_status(backend.impl_id(), backend.kind.value, backend,
                                backend.implemented_ops() if ok else (), "built-in"))

    folders = vendor_folders()
    statuses += [BackendStatus(f"vendor.{name}", "vendor", False,
                               f"opt-in, not enabled (SGLANG_FL_ENABLE_VENDORS={name} enables it)")
                 for name in folders if name in OPT_IN_VENDORS and name not in enabled_vendors]
    sources = [(name, f"built-in {vendor.__name__}.{name}.register_ops",
                lambda name=name: importlib.import_module(f"{vendor.__name__}.{name}.register_ops"),
                f"{vendor.__name__}.{name}")
               for name in folders if name not in OPT_IN_VENDORS or name in enabled_vendors]
    sources += [(ep.name, f"entry point {ep.value}", ep.load, ep.module.rpartition(".")[0] or ep.module)
                for ep in entry_points(group=VENDOR_ENTRY_POINT_GROUP)]
    for name, origin, load, package in sources:
        statuses.append(_register_vendor(registry, name, origin, load, package))
    return statuses


def _register_vendor(registry: OpRegistry, name: str, origin: str, load,
                     package: str = "") -> BackendStatus:
    impl_id = f"vendor.{name}"
    staging = OpRegistry()
    try:
        module = load()
        backend = getattr(module, "BACKEND", None)
        if isinstance(backend, Backend):  # checked even where it is unavailable
            verify_backend_class(type(backend), impl_id)
        module.register_builtins(staging)
    except InvalidImplError as exc:
        logger.error("vendor backend %r refused: %s", name, exc)
        return BackendStatus(impl_id, "vendor", False, f"refused: {exc}")
    except Exception as exc:  # noqa: BLE001 - one broken vendor must not stop the others
        # E.g. ``backend.rms_norm`` named in register_ops.py while the class spells it
        # ``rmsnorm``: the backend classes the vendor loaded say it more precisely.
        refusal = _refusal_of_loaded_classes(package, impl_id)
        if refusal is not None:
            logger.error("vendor backend %r refused: %s", name, refusal)
            return BackendStatus(impl_id, "vendor", False, f"refused: {refusal}")
        logger.warning("vendor backend %r failed to register: %s: %s", name, type(exc).__name__, exc)
        return BackendStatus(impl_id, "vendor", False, f"register failed: {exc}")
    kept = [i for i in staging.all_impls()
            if getattr(i.fn, "_is_available", None) is None or i.fn._is_available()]
    attention = staging.attention_backends()
    try:
        for impl in attention:
            registry.register_attention_backend(impl)
    except ValueError as exc:  # a name another vendor took: this vendor's attention is refused
        logger.error("vendor backend %r: %s", name, exc)
        attention = ()
    registry.merge(kept)
    status = _status(impl_id, "vendor", backend, tuple(sorted({i.op_name for i in kept})), origin,
                     unavailable="is_available() returned False" if staging.all_impls() else "")
    return dataclasses.replace(status, attention_backends=tuple(a.name for a in attention))


def _refusal_of_loaded_classes(package: str, impl_id: str) -> InvalidImplError | None:
    """The op-table refusal of a Backend class defined in ``package``'s loaded modules, if any."""
    if not package:
        return None
    for modname, module in list(sys.modules.items()):
        if module is None or not (modname == package or modname.startswith(package + ".")):
            continue
        for value in list(vars(module).values()):
            if (isinstance(value, type) and issubclass(value, Backend) and value is not Backend
                    and value.__module__ == modname):
                try:
                    verify_backend_class(value, impl_id)
                except InvalidImplError as exc:
                    return exc
    return None


def _status(name: str, kind: str, backend: Backend | None, ops: tuple[str, ...], origin: str,
            unavailable: str = "") -> BackendStatus:
    if ops:
        missing = backend.unavailable_reason if backend is not None else ""
        return BackendStatus(name, kind, True, origin, ops, missing)
    reason = (backend.unavailable_reason if backend is not None else "") or unavailable
    return BackendStatus(name, kind, False, reason or "registered no ops")
