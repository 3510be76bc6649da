"""Vocabulary of the dispatch system, shared with vllm-plugin-FL vendor code.

A vendor registers ``OpImpl`` entries; the policy orders them by ``BackendImplKind`` and
``BackendPriority``. Nothing here imports torch or SGLang.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any


class BackendImplKind(str, Enum):
    FLAGOS = "flagos"  # FlagGems / Triton kernels
    VENDOR = "vendor"  # chip-native kernels (sgl_kernel, torch_npu, torch_musa, ...)
    REFERENCE = "reference"  # pure PyTorch, always available

    def __str__(self) -> str:
        return self.value


class BackendPriority(IntEnum):
    FLAGOS = 150
    VENDOR = 100
    REFERENCE = 50


_DEFAULT_PRIORITY = {
    BackendImplKind.FLAGOS: BackendPriority.FLAGOS,
    BackendImplKind.VENDOR: BackendPriority.VENDOR,
    BackendImplKind.REFERENCE: BackendPriority.REFERENCE,
}


@dataclass(frozen=True)
class OpImpl:
    """One implementation of one op.

    ``fn`` has the op's standard signature (``fn(obj, ...)``, ``obj`` being the layer).
    ``impl_id`` is unique per op, e.g. ``flagos``, ``vendor.cuda``, ``reference``.
    ``vendor`` names the vendor backend for VENDOR impls (used by allow/deny lists).
    """

    op_name: str
    impl_id: str
    kind: BackendImplKind
    fn: Callable[..., Any]
    vendor: str | None = None
    priority: int | None = None
    #: The inputs ``fn`` takes (``dispatch.limits.accepts`` on its method; None: any the op
    #: allows). Set at registration; ``fn`` is then guarded by it.
    limits: Any = None

    def __post_init__(self) -> None:
        kind = BackendImplKind(self.kind)
        object.__setattr__(self, "kind", kind)
        if self.priority is None:
            object.__setattr__(self, "priority", int(_DEFAULT_PRIORITY[kind]))
        if kind is BackendImplKind.VENDOR and not self.vendor:
            raise ValueError(f"OpImpl {self.op_name}/{self.impl_id}: a vendor impl must name its vendor")

    @property
    def label(self) -> str:
        """``kind(impl_id)`` as written in the dispatch log."""
        return f"{self.kind.value}({self.impl_id})"


_ATTENTION_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class AttentionBackendImpl:
    """An attention backend a vendor adds to the serving framework's registry, under ``name``.

    ``factory(model_runner)`` returns the framework's attention-backend object (for SGLang a
    subclass of its ``AttentionBackend``; the version adapter (``sglang_fl.sglang_glue.adapters``) names the
    base class and SGLang's own backends). ``triton_helpers``: whether SGLang may run its Triton
    helper kernels (KV-cache index bookkeeping) beside this backend; leave it False on a chip
    without Triton, and SGLang takes its PyTorch paths, as it does for ``torch_native``.
    """

    name: str
    vendor: str
    factory: Callable[[Any], Any]
    triton_helpers: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _ATTENTION_NAME.match(self.name):
            raise ValueError(f"attention backend name {self.name!r} of vendor {self.vendor!r}: "
                             "use lower-case letters, digits and '_', starting with a letter")
        if not self.vendor:
            raise ValueError(f"attention backend {self.name!r} must name its vendor")
        if not callable(self.factory):
            raise ValueError(f"attention backend {self.name!r}: factory {self.factory!r} is not callable")


@dataclass(frozen=True)
class BackendStatus:
    """What discovery found of one backend, for ``sglang-fl ops`` and the error messages."""

    name: str  # impl id: "reference", "flagos", "vendor.cuda"
    kind: str
    available: bool
    reason: str  # why unavailable (or refused), or where it came from
    ops: tuple[str, ...] = ()
    missing: str = ""  # for an available backend: why it lacks some of its ops here
    attention_backends: tuple[str, ...] = ()  # names it registered (`AttentionBackendImpl`)


class NoImplementationError(RuntimeError):
    """No registered implementation of an op survived the selection policy."""
