"""Backend base class and the plumbing every backend shares.

A backend subclasses `Backend`, sets ``name``/``kind``, implements ``is_available()`` and the op
methods it really has (standard signatures below), and its ``register_ops.py`` calls
``register_backend(registry, MyBackend())``. Ops a backend does not define are simply not
registered.

Standard op signatures (``obj`` is the layer; read ``obj.weight``, ``obj.variance_epsilon``,
``obj.head_size`` ...):

- ``silu_and_mul(obj, x) -> Tensor``
- ``rms_norm(obj, x, residual=None, post_residual_addition=None) -> Tensor | (Tensor, Tensor)``:
  with a residual, returns ``(normed, x + residual + post_residual_addition)``, the sum
  accumulated in fp32 and rounded once, as SGLang's ``RMSNorm.forward_native`` adds them
  (``Backend.residual_sum_parts`` does that for kernels whose fused add takes two inputs).
  ``post_residual_addition`` only comes with a residual.
- ``gemma_rms_norm(obj, x, residual=None, post_residual_addition=None) -> Tensor | (Tensor,
  Tensor)``: as SGLang's ``GemmaRMSNorm.forward_native``, the adds are in x's dtype
  (``residual + post_residual_addition`` first, then ``x +`` that).
- ``rotary_embedding(obj, query, key, cos, sin, position_ids, rotary_interleaved=False,
  inplace=True) -> (Tensor, Tensor)`` where ``cos``/``sin`` are the whole per-position caches
  ``[max_positions, rotary_dim // 2]`` and ``position_ids`` (one per token) index them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from abc import ABC, abstractmethod

from sglang_fl.config.settings import OP_NAMES
from sglang_fl.dispatch.types import BackendImplKind, OpImpl

STANDIN_MARKER = "__sglang_fl_standin__"


class Backend(ABC):
    """Base of every backend. Op methods are looked up by the names in ``OP_NAMES``."""

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

    @staticmethod
    def residual_sum_parts(x, residual, post_residual_addition):
        """``x + residual + post_residual_addition`` as ``RMSNorm.forward_native`` adds them (each
        cast to fp32, summed left to right), for a fused add-RMSNorm kernel that adds only two
        inputs (in fp32) and so cannot take the third.

        Returns ``(total, rest)`` in x's dtype: ``total`` is the fp32 sum rounded once, exactly the
        residual forward_native returns, and ``rest`` is what that rounding dropped. A kernel given
        ``(rest, total)`` normalises ``float(rest) + float(total)``, the fp32 sum to within rest's
        own rounding. Return ``total`` itself as the residual, not the sum the kernel writes back,
        which can be one ulp off where ``rest`` rounded to exactly half an ulp of ``total`` (a tie).
        """
        import torch

        f32 = torch.float32
        fp32_sum = x.to(f32) + residual.to(f32) + post_residual_addition.to(f32)
        total = fp32_sum.to(x.dtype)
        return total, (fp32_sum - total.to(f32)).to(x.dtype)

    def op_impls(self) -> list[OpImpl]:
        vendor = self.name if self.kind is BackendImplKind.VENDOR else None
        return [
            OpImpl(op, self.impl_id(), self.kind, getattr(self, op), vendor=vendor, priority=self.priority)
            for op in self.implemented_ops()
        ]


def register_backend(registry, backend: Backend) -> bool:
    """Register ``backend``'s ops if it is available; returns whether it was."""
    if not backend.available():
        return False
    registry.register_many(backend.op_impls())
    return True


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
