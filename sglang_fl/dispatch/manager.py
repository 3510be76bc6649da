"""OpManager: discovers backends once, resolves each op once, and handles run-time fallback.

Resolution (policy over registered impls) happens the first time an op is asked for and is
cached; callers bind ``ResolvedOp.impl.fn`` and call it directly. ``resolve_all`` does it for
every op a host framework will route, at start-up: it logs each op that could not get its
preferred backend kind, and fails once, naming every op that has no implementation at all.
Only when an impl raises does ``ResolvedOp.fallback`` run: it logs one warning and moves to the
next candidate (or re-raises in strict mode).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from sglang_fl.dispatch.discovery import discover_backends
from sglang_fl.dispatch.limits import InputsDeclined
from sglang_fl.dispatch.ops import OPS_BY_NAME
from sglang_fl.dispatch.policy import Selection, SelectionPolicy, bucket_of
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import BackendImplKind, BackendStatus, NoImplementationError, OpImpl
from sglang_fl.logging_setup import get_logger
from sglang_fl.metrics import record_fallback, record_route

logger = get_logger("dispatch")


@dataclass
class ResolvedOp:
    op_name: str
    candidates: list[OpImpl]
    excluded: tuple[tuple[str, str], ...]
    strict: bool
    #: (kind, why) for each kind of the op's order before the chosen impl's that had no candidate.
    passed_over: tuple[tuple[str, str], ...] = ()
    failed: list[tuple[str, str]] = field(default_factory=list)
    #: The token bucket whose own order (``op@bucket``) this resolution follows; None: the
    #: op's order for every bucket without one.
    bucket: str | None = None
    #: (impl id, reason) -> the impl id the call went to, for each decline logged so far.
    declines: dict[tuple[str, str], str | None] = field(default_factory=dict)
    #: The token buckets that run this resolution (for the metrics).
    buckets: tuple[str, ...] = ()
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def impl(self) -> OpImpl:
        return self.candidates[0]

    def fallback(self, impl: OpImpl, exc: BaseException) -> OpImpl:
        """``impl`` raised ``exc``: drop it and return the next candidate.

        Strict mode, or nothing left, re-raises. Only the first failure of an impl is logged."""
        if self.strict:
            raise exc
        with self._lock:
            if impl in self.candidates:
                self.candidates.remove(impl)
                self.failed.append((impl.impl_id, f"{type(exc).__name__}: {exc}"))
                nxt = self.candidates[0] if self.candidates else None
                logger.warning(
                    "op %r: impl %r raised %s: %s; falling back to %s",
                    self.op_name, impl.impl_id, type(exc).__name__, exc,
                    nxt.impl_id if nxt else "nothing",
                )
                record_fallback(self.op_name, impl.impl_id, nxt.impl_id if nxt else "none", "raised")
                for b in self.buckets if nxt else ():
                    record_route(self.op_name, b, nxt.impl_id)
            if not self.candidates:
                raise NoImplementationError(
                    f"No available implementation for op {self.op_name!r}: every candidate failed "
                    f"at run time ({'; '.join(f'{i}: {r}' for i, r in self.failed)})"
                ) from exc
            return self.candidates[0]

    def retry(self, impl: OpImpl, exc: Exception, args: tuple, kwargs: dict, on_switch=None,
              on_decline=None):
        """``impl`` raised ``exc`` on ``fn(*args, **kwargs)``: try the next candidates until one
        succeeds; returns ``(impl, result)``. ``on_switch(impl)`` runs at every switch. An impl
        that declined the inputs (`InputsDeclined`) is not dropped: `declined` hands this call
        on and ``impl`` stays the choice (``on_decline(taker, decliner)`` runs for the impl that
        took the call)."""
        if isinstance(exc, InputsDeclined):
            return impl, self.declined(impl, exc, args, kwargs, on_decline)
        while True:
            impl = self.fallback(impl, exc)
            if on_switch is not None:
                on_switch(impl)
            try:
                return impl, impl.fn(*args, **kwargs)
            except Exception as next_exc:  # noqa: BLE001 - fallback is the point
                exc = next_exc


    def declined(self, impl: OpImpl, exc: InputsDeclined, args: tuple, kwargs: dict,
                 on_decline=None):
        """The result of the first candidate after ``impl`` that accepts this call's inputs;
        each (impl, reason) is logged once. Strict mode or nothing accepting: an error naming
        every impl's reason."""
        reasons = [(impl, exc)]
        if not self.strict:
            after = self.candidates[self.candidates.index(impl) + 1:] if impl in self.candidates else []
            for nxt in after:
                self._log_decline(reasons[-1][0], reasons[-1][1], nxt)
                try:
                    result = nxt.fn(*args, **kwargs)
                except InputsDeclined as again:
                    reasons.append((nxt, again))
                    continue
                if on_decline is not None:
                    on_decline(nxt, impl)
                return result
        self._log_decline(reasons[-1][0], reasons[-1][1], None)
        strict = " (SGLANG_FL_STRICT=1: no other kind is tried)" if self.strict else ""
        raise NoImplementationError(
            f"No implementation of op {self.op_name!r} accepts these inputs{strict}: "
            + "; ".join(f"{i.impl_id}: {e}" for i, e in reasons)) from exc

    def _log_decline(self, impl: OpImpl, exc: InputsDeclined, nxt: OpImpl | None) -> None:
        key = (impl.impl_id, str(exc))
        if key in self.declines:
            return
        with self._lock:
            if key in self.declines:
                return
            self.declines[key] = nxt.impl_id if nxt else None
        record_fallback(self.op_name, impl.impl_id, nxt.impl_id if nxt else "none", "declined")
        slow = (" (the pure-PyTorch reference: a slow path on an accelerator)"
                if nxt is not None and nxt.kind is BackendImplKind.REFERENCE else "")
        logger.warning("op %r: impl %r declined the inputs: %s; this call goes to %s%s (logged "
                       "once)", self.op_name, impl.impl_id, exc, nxt.impl_id if nxt else "nothing",
                       slow)


class OpManager:
    def __init__(self, registry: OpRegistry, policy: SelectionPolicy) -> None:
        self.registry = registry
        self.policy = policy
        self.backends: dict[str, BackendStatus] = {}
        self._resolved: dict[str, ResolvedOp] = {}
        self._lock = threading.RLock()

    def record_backend(self, status: BackendStatus) -> None:
        self.backends[status.name] = status

    def selection(self, op_name: str, bucket: str | None = None) -> Selection:
        return self.policy.select(op_name, self.registry.impls(op_name), bucket)

    def _own_bucket(self, op_name: str, bucket: str | None) -> str | None:
        """``bucket`` if the op has an order of its own there, else None (the op-wide one)."""
        if bucket is not None and self.policy.order_origin(op_name, bucket) == f"{op_name}@{bucket}":
            return bucket
        return None

    def resolve(self, op_name: str, bucket: str | None = None) -> ResolvedOp:
        """The op's resolution in token bucket ``bucket`` (None: the op-wide order); buckets
        without an order of their own share the op-wide resolution, fallback state included."""
        key = (op_name, self._own_bucket(op_name, bucket))
        resolved = self._resolved.get(key)
        if resolved is not None:
            return resolved
        with self._lock:
            resolved = self._resolved.get(key)
            if resolved is None:
                resolved = (self._resolve_uncached(op_name) if key[1] is None
                            else self._resolve_uncached(op_name, key[1]))
                self._resolved[key] = resolved
            return resolved

    def resolve_by_size(self, op_name: str):
        """The op's routes by token count: one `ResolvedOp` when every bucket resolves to the
        same candidates (nothing to decide per call), else ``((largest count or None, bucket,
        ResolvedOp), ...)`` smallest bucket first."""
        routes = tuple((hi, name, self.resolve(op_name, name)) for name, hi in self.policy.token_buckets)
        first = routes[0][2]
        if all(_ids(r) == _ids(first) for _, _, r in routes):
            return first
        return routes

    def _resolve_uncached(self, op_name: str, bucket: str | None = None) -> ResolvedOp:
        sel = self.selection(op_name, bucket)
        if not sel.candidates:
            raise NoImplementationError(self.explain_missing(op_name, sel, bucket))
        chosen_kind = sel.candidates[0].kind.value
        order = self.policy.accepted_kinds(op_name, bucket)
        passed_over = tuple((k, self.why_no_candidate(op_name, k, sel, bucket))
                            for k in order[:order.index(chosen_kind)])
        buckets = tuple(b for b, _ in self.policy.token_buckets if self._own_bucket(op_name, b) == bucket)
        for b in buckets:
            record_route(op_name, b, sel.candidates[0].impl_id)
        return ResolvedOp(op_name, list(sel.candidates), sel.excluded, self.policy.strict,
                          passed_over=passed_over, bucket=bucket, buckets=buckets)

    def resolve_all(self, op_names) -> dict[str, ResolvedOp]:
        """Resolve every op in ``op_names`` (start-up): log, once, each op that runs on a later
        kind than its first because that kind has no implementation here, and raise one
        NoImplementationError naming every op that has no implementation at all."""
        op_names = tuple(op_names)
        resolved: dict[str, ResolvedOp] = {}
        missing: list[NoImplementationError] = []
        names: list[str] = []
        for op in op_names:
            try:  # each token bucket's order (its own, or the op-wide one)
                found = {}
                for bucket, _ in self.policy.token_buckets:
                    own = self._own_bucket(op, bucket)
                    found[f"{op}@{own}" if own else op] = self.resolve(op, bucket)
                resolved.update(found)
            except NoImplementationError as exc:
                missing.append(exc)
                names.append(op)
        if len(missing) == 1:
            raise missing[0]
        if missing:
            strict = (" (SGLANG_FL_STRICT=1: each op accepts only the first kind of its order)"
                      if self.policy.strict else "")
            raise NoImplementationError(
                f"No available implementation for ops {', '.join(map(repr, names))}{strict}:\n"
                + "\n".join(f"  {op}: {self._missing_detail(op, self.selection(op))}"
                            for op in names))
        for r in resolved.values():
            if r.passed_over:
                logger.warning("%s", describe_passed_over(r))
            for kind, _ in r.passed_over:
                record_fallback(r.op_name, kind, r.impl.impl_id, "unavailable")
        return resolved

    def skipped(self, op_name: str, sel: Selection | None = None,
                bucket: str | None = None) -> list[tuple[str, str, str]]:
        """(impl or backend, kind, why) for everything of an accepted kind that is not a
        candidate for ``op_name``, and for registered impls the policy excluded."""
        sel = self.selection(op_name, bucket) if sel is None else sel
        kinds = self.policy.accepted_kinds(op_name, bucket)
        by_id = {i.impl_id: i for i in self.registry.impls(op_name)}
        out = [(i, by_id[i].kind.value, why) for i, why in sel.excluded]
        for b in self.backends.values():
            if b.kind not in kinds or op_name in b.ops:
                continue
            why = b.reason if not b.available else f"implements no {op_name}"
            out.append((b.name, b.kind, why + (f" here ({b.missing})" if b.available and b.missing else "")))
        return out

    def why_no_candidate(self, op_name: str, kind: str, sel: Selection | None = None,
                         bucket: str | None = None) -> str:
        """Why ``op_name`` has no candidate of ``kind`` here."""
        why = [f"{name}: {reason}" for name, k, reason in self.skipped(op_name, sel, bucket) if k == kind]
        return "; ".join(why) or f"no {kind} backend found"

    def explain_missing(self, op_name: str, sel: Selection, bucket: str | None = None) -> str:
        where = f" in token bucket {bucket!r}" if bucket else ""
        return (f"No available implementation for op {op_name!r}{where}: "
                f"{self._missing_detail(op_name, sel, bucket)}")

    def _missing_detail(self, op_name: str, sel: Selection, bucket: str | None = None) -> str:
        kinds = self.policy.accepted_kinds(op_name, bucket)
        strict = " (strict)" if self.policy.strict else ""
        why = "; ".join(f"no {k}: {self.why_no_candidate(op_name, k, sel, bucket)}" for k in kinds)
        registered = [i.impl_id for i in self.registry.impls(op_name)] or ["none"]
        return f"accepts {'|'.join(kinds)}{strict}; {why}; registered: {', '.join(registered)}"

    def call(self, op_name: str, obj, *args, **kwargs):
        """Run the op on the impl its token bucket resolves to, as a layer route does: the
        bucket of the token count of its size argument (`OpSpec.size_arg`), so per-bucket
        orders (cuda.yaml's ``decode:`` / ``prefill:``, which tune writes) apply here too."""
        resolved = self.resolve(op_name, self.bucket_of(op_name, (obj, *args), kwargs))
        impl = resolved.impl
        try:
            return impl.fn(obj, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - fallback is the point
            return resolved.retry(impl, exc, (obj, *args), kwargs)[1]

    def bucket_of(self, op_name: str, args: tuple, kwargs: dict) -> str | None:
        """The token bucket a call of ``op_name`` with ``args`` (``obj`` first) falls in; None
        when the size argument is not given or has no such dimension."""
        spec = OPS_BY_NAME.get(op_name)  # an unknown op is refused by resolve(), by name
        if spec is None or len(self.policy.token_buckets) < 2:
            return None
        tokens = spec.token_count(args, kwargs)
        return None if tokens is None else bucket_of(self.policy.token_buckets, tokens)

    def reset_resolution(self) -> None:
        with self._lock:
            self._resolved.clear()

    def _after_fork(self) -> None:
        self._lock = threading.RLock()
        for r in self._resolved.values():
            r._lock = threading.Lock()


def describe_passed_over(resolved: ResolvedOp) -> str:
    """``rms_norm: preferred vendor unavailable (...); using reference(reference)``."""
    kinds = [f"{kind} unavailable ({why})" for kind, why in resolved.passed_over]
    name = resolved.op_name + (f"@{resolved.bucket}" if resolved.bucket else "")
    return f"{name}: preferred {', '.join(kinds)}; using {resolved.impl.label}"


def _ids(resolved: ResolvedOp | None) -> tuple[str, ...] | None:
    return None if resolved is None else tuple(i.impl_id for i in resolved.candidates)


_manager: OpManager | None = None
_manager_lock = threading.Lock()


def get_manager() -> OpManager:
    """The process-wide manager, built (with backend discovery) on first use."""
    global _manager
    if _manager is None:
        with _manager_lock:
            if _manager is None:
                from sglang_fl.config import get_settings
                from sglang_fl.kernels import launch

                registry = OpRegistry()
                settings = get_settings()
                launch.set_enabled(settings.bound_launch)
                manager = OpManager(registry, SelectionPolicy.from_settings(settings))
                for status in discover_backends(registry, settings.enable_vendors):
                    manager.record_backend(status)
                _manager = manager
    return _manager


def reset_manager() -> None:
    """Drop the process-wide manager (tests; policy changes are not a run-time concern)."""
    global _manager
    with _manager_lock:
        _manager = None


def _reinit_after_fork() -> None:
    global _manager_lock
    _manager_lock = threading.Lock()
    if _manager is not None:
        _manager._after_fork()
        _manager.registry._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)
