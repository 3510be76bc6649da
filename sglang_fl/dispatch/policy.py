"""Selection policy: which registered impls of an op may run, in which order, and why the
others may not. Pure function of Settings + the registered impls; no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sglang_fl.dispatch.types import BackendImplKind, OpImpl


def bucket_of(buckets, tokens: int) -> str | None:
    """The bucket of ``buckets`` (``(name, largest count or None)``, ascending) holding
    ``tokens``: the first whose largest count is not exceeded; None past the last bound."""
    for name, hi in buckets:
        if hi is None or tokens <= hi:
            return name
    return None


@dataclass(frozen=True)
class Selection:
    candidates: tuple[OpImpl, ...]  # in the order they are tried
    excluded: tuple[tuple[str, str], ...]  # (impl_id, reason)


@dataclass(frozen=True)
class SelectionPolicy:
    op_backends: Mapping[str, tuple[str, ...]]  # per-op kind order (Settings.op_backends)
    default_order: tuple[str, ...]
    #: ``(name, largest token count or None)``, smallest first (Settings.token_buckets).
    token_buckets: tuple[tuple[str, int | None], ...] = (("all", None),)
    strict: bool = False
    allow_vendors: tuple[str, ...] = ()
    deny_vendors: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings) -> SelectionPolicy:
        return cls(
            op_backends=settings.op_backends,
            default_order=settings.default_order,
            token_buckets=settings.token_buckets,
            strict=settings.strict,
            allow_vendors=settings.allow_vendors,
            deny_vendors=settings.deny_vendors,
        )

    def kinds_for(self, op_name: str, bucket: str | None = None) -> tuple[str, ...]:
        """The op's order in token bucket ``bucket``: ``op@bucket``, else ``op``, else the
        default order (``bucket=None``: the order of buckets without their own)."""
        if bucket is not None:
            order = self.op_backends.get(f"{op_name}@{bucket}")
            if order is not None:
                return order
        return self.op_backends.get(op_name, self.default_order)

    def order_origin(self, op_name: str, bucket: str | None = None) -> str:
        """Which key decided ``kinds_for(op_name, bucket)``: ``op@bucket``, ``op`` or ``prefer``."""
        if bucket is not None and f"{op_name}@{bucket}" in self.op_backends:
            return f"{op_name}@{bucket}"
        return op_name if op_name in self.op_backends else "prefer"

    def accepted_kinds(self, op_name: str, bucket: str | None = None) -> tuple[str, ...]:
        """The kinds ``op_name`` may run on: its order, or only the first kind in strict mode."""
        order = self.kinds_for(op_name, bucket)
        return order[:1] if self.strict else order

    def vendor_excluded(self, vendor: str | None) -> str:
        """Why the allow/deny lists exclude ``vendor`` ("" when they do not)."""
        if vendor in self.deny_vendors:
            return f"vendor {vendor!r} in SGLANG_FL_DENY_VENDORS"
        if self.allow_vendors and vendor not in self.allow_vendors:
            return f"vendor {vendor!r} not in SGLANG_FL_ALLOW_VENDORS"
        return ""

    def select(self, op_name: str, impls: tuple[OpImpl, ...], bucket: str | None = None) -> Selection:
        order = self.kinds_for(op_name, bucket)
        kinds = self.accepted_kinds(op_name, bucket)
        excluded: list[tuple[str, str]] = []
        allowed: list[OpImpl] = []
        for impl in impls:
            kind = impl.kind.value
            if kind not in kinds:
                why = "strict: only the first kind" if kind in order else "kind not in order"
                excluded.append((impl.impl_id, f"{why} {list(kinds)}"))
            elif impl.kind is BackendImplKind.VENDOR and self.vendor_excluded(impl.vendor):
                excluded.append((impl.impl_id, self.vendor_excluded(impl.vendor)))
            else:
                allowed.append(impl)
        rank = {k: i for i, k in enumerate(kinds)}
        allowed.sort(key=lambda i: (rank[i.kind.value], -i.priority, i.impl_id))
        return Selection(tuple(allowed), tuple(excluded))
