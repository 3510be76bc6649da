"""sglang-fl's series on SGLang's Prometheus endpoint (``launch_server --enable-metrics``).

Decisions are recorded where they are taken -- an op's resolution (`record_route`), a fallback
(`record_fallback`), a stand-in call (`record_standin_call`) -- into plain in-process state;
that is a few dict writes per op and process life, never per kernel call. Nothing here imports
prometheus_client until SGLang has built a metrics collector in the process
(``sglang_glue.metrics_export`` calls `start_export` then): by that time SGLang has set
``PROMETHEUS_MULTIPROC_DIR``, which prometheus_client reads when it is first imported, so our
series go to the same per-process files SGLang's ``/metrics`` merges. `start_export` replays
what was recorded before it; later records write through.

Collectives are counted by each `CommunicatorFL` (``calls``: one integer increment per call,
there already). `track_communicator` only remembers the communicator; a daemon thread adds the
new counts to ``sglang_fl_collectives_total`` every `FLUSH_S` seconds (`flush_collectives`),
so the collective path does no Prometheus work.

Which processes export what: the info series and stand-in calls, every process where SGLang
exports (the HTTP/tokenizer process decodes images, so a torchvision stand-in call happens
there); routes, fallbacks and collectives, the scheduler processes only, which run the model
(the HTTP process resolves the same routes at plugin load but runs no layer).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import Counter

from sglang_fl.distributed.backend import ENGINE_BACKENDS

#: Why a call did not run on its op's preferred implementation.
#: ``unavailable``: no implementation of the op order's earlier kind here (resolution time);
#: ``raised``: the chosen impl raised and the op moved on to the next candidate for good;
#: ``declined``: the impl's declared limits refused these inputs; that call ran elsewhere.
FALLBACK_REASONS = ("unavailable", "raised", "declined")

#: Every series: name, type, labels, meaning (docs/observability.md shows the same table).
SERIES = (
    ("sglang_fl_info", "gauge", ("version", "sglang", "torch", "flag_gems", "platform",
                                 "dist_backend", "empty_mode", "standins"),
     "1, labelled with this install: sglang-fl, SGLang, torch and FlagGems versions, the "
     "platform, the Layer-3 backend, whether stand-ins are active (empty mode) and which"),
    ("sglang_fl_op_route", "gauge", ("op", "bucket", "impl"),
     "1 for the implementation each op runs in each token bucket, 0 for one it left after a "
     "fallback"),
    ("sglang_fl_fallbacks_total", "counter", ("op", "from_impl", "to_impl", "reason"),
     "fallbacks away from an op's preferred implementation; reason: " + "|".join(FALLBACK_REASONS)
     + " (from_impl is the kind passed over for 'unavailable')"),
    ("sglang_fl_standin_calls_total", "counter", ("name",),
     "calls of an import stand-in of an absent package (each one raised: the request failed)"),
    ("sglang_fl_collectives_total", "counter", ("backend", "op"),
     "Layer-3 collective calls through CommunicatorFL, by backend and GroupCoordinator method"),
)

#: Seconds between two exports of the communicators' call counts.
FLUSH_S = 2.0

_lock = threading.Lock()
_routes: dict[tuple[str, str], str] = {}
_fallbacks: Counter[tuple[str, str, str, str]] = Counter()
_standins: Counter[str] = Counter()
_collectives: Counter[tuple[str, str]] = Counter()
_communicators: weakref.WeakSet = weakref.WeakSet()
_exported_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_exporter: _Exporter | None = None


def record_route(op: str, bucket: str, impl_id: str) -> None:
    """``op`` runs ``impl_id`` for token bucket ``bucket`` (resolution time, or after a fallback)."""
    with _lock:
        old = _routes.get((op, bucket))
        _routes[(op, bucket)] = impl_id
        if _exporter is not None and _exporter.dispatch and old != impl_id:
            _exporter.route(op, bucket, old, impl_id)


def record_fallback(op: str, from_impl: str, to_impl: str, reason: str) -> None:
    """One fallback of ``op`` from ``from_impl`` (for ``unavailable``: the kind passed over) to
    ``to_impl`` ("none" when nothing was left); ``reason`` is one of `FALLBACK_REASONS`."""
    if reason not in FALLBACK_REASONS:
        raise ValueError(f"fallback reason {reason!r} of op {op!r}: accepted: "
                         f"{', '.join(FALLBACK_REASONS)}")
    key = (op, from_impl, to_impl, reason)
    with _lock:
        _fallbacks[key] += 1
        if _exporter is not None and _exporter.dispatch:
            _exporter.fallbacks.labels(*key).inc()


def record_standin_call(name: str) -> None:
    """A stand-in ``name`` (``sgl_kernel.rmsnorm``) was called."""
    with _lock:
        _standins[name] += 1
        if _exporter is not None:
            _exporter.standins.labels(name).inc()


def record_collective(backend: str, op: str, count: int = 1) -> None:
    """``count`` more calls of collective ``op`` on ``backend``. CommunicatorFL does not call
    this per call: `flush_collectives` hands over its counts in batches."""
    if count <= 0:
        return
    with _lock:
        _collectives[(backend, op)] += count
        if _exporter is not None and _exporter.dispatch:
            _exporter.collectives.labels(backend, op).inc(count)


def track_communicator(comm) -> None:
    """Export ``comm.calls`` (a Counter by method) as collectives of its engine's backend."""
    with _lock:
        _communicators.add(comm)
        _exported_calls[comm] = Counter()


def flush_collectives() -> None:
    """Hand the calls each tracked communicator made since the last flush to `record_collective`."""
    with _lock:
        pending = []
        for comm in list(_communicators):
            done = _exported_calls.setdefault(comm, Counter())
            for method, n in list(comm.calls.items()):
                if n > done[method]:
                    pending.append((ENGINE_BACKENDS.get(comm.engine_name, comm.engine_name),
                                    method, n - done[method]))
                    done[method] = n
    for backend, method, n in pending:
        record_collective(backend, method, n)


def snapshot() -> dict:
    """What this process recorded so far (tests; a debugger in a live process)."""
    flush_collectives()
    with _lock:
        return {"routes": dict(_routes), "fallbacks": dict(_fallbacks),
                "standins": dict(_standins), "collectives": dict(_collectives)}


class _Exporter:
    """The prometheus_client objects of this process (built by `start_export`)."""

    def __init__(self, dispatch: bool) -> None:
        from prometheus_client import Counter as PromCounter
        from prometheus_client import Gauge

        def metric(name, **kwargs):
            kind, labels, doc = next((t, lb, d) for n, t, lb, d in SERIES if n == name)
            cls = Gauge if kind == "gauge" else PromCounter
            # registry=None: multiprocess values live in the per-process files SGLang's
            # /metrics merges, not in a registry (and a forked child may build them again)
            return cls(name.removesuffix("_total"), doc, labels, registry=None, **kwargs)

        self.dispatch = dispatch
        # "max" / "mostrecent": one value per label set, whichever process wrote it
        self.info = metric("sglang_fl_info", multiprocess_mode="max")
        self.routes = metric("sglang_fl_op_route", multiprocess_mode="mostrecent")
        self.fallbacks = metric("sglang_fl_fallbacks_total")
        self.standins = metric("sglang_fl_standin_calls_total")
        self.collectives = metric("sglang_fl_collectives_total")

    def route(self, op: str, bucket: str, old: str | None, new: str) -> None:
        if old is not None:
            self.routes.labels(op, bucket, old).set(0)
        self.routes.labels(op, bucket, new).set(1)


def start_export(info: dict[str, str], dispatch: bool) -> None:
    """Export this process's series from now on (idempotent). ``info``: the labels of
    ``sglang_fl_info``; ``dispatch``: also routes, fallbacks and collectives (a scheduler
    process, which runs the model)."""
    global _exporter
    with _lock:
        if _exporter is not None:
            return
        exporter = _Exporter(dispatch)
        exporter.info.labels(**info).set(1)
        for name, n in _standins.items():
            exporter.standins.labels(name).inc(n)
        if dispatch:
            for (op, bucket), impl in _routes.items():
                exporter.route(op, bucket, None, impl)
            for key, n in _fallbacks.items():
                exporter.fallbacks.labels(*key).inc(n)
            for key, n in _collectives.items():
                exporter.collectives.labels(*key).inc(n)
        _exporter = exporter
    if dispatch:
        threading.Thread(target=_flush_forever, name="sglang-fl-metrics", daemon=True).start()


def _flush_forever() -> None:
    import time

    while True:
        time.sleep(FLUSH_S)
        flush_collectives()


def _reinit_after_fork() -> None:
    """A forked child exports on its own once SGLang builds its collector there."""
    global _lock, _exporter
    _lock = threading.Lock()
    _exporter = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)
