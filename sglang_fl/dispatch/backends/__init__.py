"""Backend base class and the plumbing every backend shares.

A backend subclasses `Backend`, sets ``name``/``kind``, implements ``is_available()`` and the op
methods it really has, each named and signed as its op in the op table
(``sglang_fl.dispatch.ops.OPS``: ``rms_norm(self, obj, x, residual=None,
post_residual_addition=None)``, ...), and its ``register_ops.py`` calls
``register_backend(registry, MyBackend())``. Ops a backend does not define are simply not
registered. ``obj`` is the layer; read only the attributes the op's table entry lists
(``obj.weight``, ``obj.variance_epsilon``, ``obj.head_size``), which SGLang and vLLM share.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from abc import ABC, abstractmethod

from sglang_fl.dispatch.ops import OP_NAMES
from sglang_fl.dispatch.ops import residual_sum_parts as _residual_sum_parts
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

STANDIN_MARKER = "__sglang_fl_standin__"


class Backend(ABC):
    """Base of every backend. Op methods are looked up by the op table's names."""

    name: str = ""
    kind: BackendImplKind = BackendImplKind.VENDOR
    priority: int | None = None
    #: Why ``is_available()`` said no; set by the subclass for ``sglang-fl ops``.
    unavailable_reason: str = ""

    _available: bool | None = None

    @abstractmethod
    def is_available(self) -> bool:
        """Whether this backend can run here; set ``unavailable_reason`` when not."""

    def available(self) -> bool:
        """``is_available()``, asked once per backend object."""
        if self._available is None:
            self._available = bool(self.is_available())
        return self._available

    def impl_id(self) -> str:
        return self.name if self.kind is not BackendImplKind.VENDOR else f"vendor.{self.name}"

    def implemented_ops(self) -> tuple[str, ...]:
        return tuple(op for op in OP_NAMES if callable(getattr(self, op, None)))

    #: ``x + residual + post_residual_addition`` split for a two-input fused add-norm kernel
    #: (see ``sglang_fl.dispatch.ops.residual_sum_parts``).
    residual_sum_parts = staticmethod(_residual_sum_parts)

    def op_impls(self) -> list[OpImpl]:
        vendor = self.name if self.kind is BackendImplKind.VENDOR else None
        return [
            OpImpl(op, self.impl_id(), self.kind, getattr(self, op), vendor=vendor, priority=self.priority)
            for op in self.implemented_ops()
        ]


def register_backend(registry, backend: Backend) -> bool:
    """Register ``backend``'s ops if it is available; returns whether it was. Its class is
    checked against the op table first, available or not (``OpRegistry.register_backend``)."""
    return registry.register_backend(backend)


def real_module_available(name: str) -> tuple[bool, str]:
    """Whether ``name`` imports *and* is the real package, not an sglang-fl import stand-in."""
    try:
        if name not in sys.modules and importlib.util.find_spec(name.split(".")[0]) is None:
            return False, f"{name} is not installed"
        mod = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure means unavailable
        return False, f"import {name} failed: {type(exc).__name__}: {exc}"
    root = sys.modules.get(name.split(".")[0])
    if getattr(mod, STANDIN_MARKER, False) or getattr(root, STANDIN_MARKER, False):
        return False, f"{name} is an sglang-fl stand-in (the real package is not installed)"
    return True, ""


def load_real_module(backend: Backend, name: str):
    """Import ``name`` for ``backend``; on failure (or a stand-in) record why and return None."""
    ok, why = real_module_available(name)
    if not ok:
        backend.unavailable_reason = why
        return None
    return importlib.import_module(name)
