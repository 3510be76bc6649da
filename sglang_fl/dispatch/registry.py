"""Thread-safe table op name -> registered OpImpls, and the vendors' attention backends by name.

Every impl is checked against the op table as it is registered (`verify.verify_impl`): an
unknown op, a mistyped backend method or a signature other than the op's is refused there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from sglang_fl.dispatch.types import AttentionBackendImpl, OpImpl
from sglang_fl.dispatch.verify import verify_backend_class, verify_impl


def _origin(impl: OpImpl):
    """What makes two registrations "the same": a re-run of the same backend's registration
    (new backend object, same method) is the same impl."""
    fn = getattr(impl.fn, "__func__", impl.fn)
    return (impl.kind, impl.vendor, getattr(fn, "__module__", None), getattr(fn, "__qualname__", fn))


def _origin_fn(fn):
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__module__", None), getattr(fn, "__qualname__", fn)


class OpRegistry:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._impls: dict[str, dict[str, OpImpl]] = {}
        self._attention: dict[str, AttentionBackendImpl] = {}

    def register(self, impl: OpImpl) -> None:
        """Add one impl. Registering the same impl again is a no-op (so re-running discovery,
        e.g. in a forked child, is harmless); a different impl under a taken id is an error, and
        so is an impl that does not fit the op table (InvalidImplError)."""
        self._add(verify_impl(impl))

    def register_many(self, impls: Iterable[OpImpl]) -> None:
        """All of ``impls`` or, if one is refused, none of them."""
        for impl in [verify_impl(i) for i in impls]:
            self._add(impl)

    def register_backend(self, backend) -> bool:
        """Check ``backend``'s class against the op table (even where it is unavailable, so a
        mistyped method shows on any machine), then register its ops if it is available."""
        verify_backend_class(type(backend), backend.impl_id())
        if not backend.available():
            return False
        self.register_many(backend.op_impls())
        return True

    def merge(self, impls: Iterable[OpImpl]) -> None:
        """Add impls taken from another registry (checked when they were registered there)."""
        for impl in impls:
            self._add(impl)

    def _add(self, impl: OpImpl) -> None:
        with self._lock:
            table = self._impls.setdefault(impl.op_name, {})
            old = table.get(impl.impl_id)
            if old is not None and _origin(old) != _origin(impl):
                raise ValueError(
                    f"op {impl.op_name!r}: impl id {impl.impl_id!r} is already registered "
                    f"by {old.fn!r}; pick another impl_id"
                )
            table[impl.impl_id] = impl

    def register_attention_backend(self, impl: AttentionBackendImpl) -> None:
        """Add a vendor attention backend; the same one again is a no-op, another vendor's
        (or another factory) under a taken name is an error."""
        if not isinstance(impl, AttentionBackendImpl):
            raise TypeError(f"expected an AttentionBackendImpl, got {impl!r}")
        with self._lock:
            old = self._attention.get(impl.name)
            if old is not None and (old.vendor, _origin_fn(old.factory)) != (
                    impl.vendor, _origin_fn(impl.factory)):
                raise ValueError(f"attention backend {impl.name!r} is already registered by vendor "
                                 f"{old.vendor!r}; pick another name")
            self._attention[impl.name] = impl

    def attention_backends(self) -> tuple[AttentionBackendImpl, ...]:
        with self._lock:
            return tuple(self._attention.values())

    def impls(self, op_name: str) -> tuple[OpImpl, ...]:
        with self._lock:
            return tuple(self._impls.get(op_name, {}).values())

    def all_impls(self) -> tuple[OpImpl, ...]:
        with self._lock:
            return tuple(i for table in self._impls.values() for i in table.values())

    def op_names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._impls))

    def clear(self) -> None:
        with self._lock:
            self._impls.clear()
            self._attention.clear()
