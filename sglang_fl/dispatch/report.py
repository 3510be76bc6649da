"""What ``sglang-fl ops`` and ``sglang-fl doctor`` report of the dispatch: the backends
discovery found, and per op of the op table its order, candidates, choice per token bucket and
why every other impl was skipped. Data only; the commands format it."""

from __future__ import annotations

from sglang_fl.config import get_settings


def ops_report() -> dict:
    """Backends found and per-op resolution. ``routes``: what each token bucket runs (the
    bucket's own order, or the op's); ``buckets``: the buckets with an order of their own."""
    from sglang_fl.dispatch import NoImplementationError, get_manager
    from sglang_fl.dispatch.ops import OPS

    settings = get_settings()
    manager = get_manager()
    report = {
        "platform": settings.platform,
        "token_buckets": [{"name": n, "max_tokens": hi} for n, hi in settings.token_buckets],
        "token_buckets_from": settings.origins["token_buckets"],
        "custom_ops": settings.custom_ops,
        "backends": [
            {"name": b.name, "kind": b.kind, "available": b.available,
             "detail": b.reason, "ops": list(b.ops), "missing": b.missing,
             "attention_backends": list(b.attention_backends)}
            for b in manager.backends.values()
        ],
        # The vendors' attention backends (--attention-backend <name>); "excluded" says why
        # the allow/deny vendor lists keep one out of SGLang.
        "attention_backends": [
            {"name": a.name, "vendor": f"vendor.{a.vendor}",
             "excluded": manager.policy.vendor_excluded(a.vendor)}
            for a in manager.registry.attention_backends()
        ],
        "attention_backend_default": (
            {"name": settings.attention_backend, "from": settings.origins["attention_backend"]}
            if settings.attention_backend else None),
        "ops": {},
    }
    for spec in OPS:
        op = spec.name
        sel = manager.selection(op)
        entry = {
            "signature": spec.describe(),
            "serves": list(spec.class_names),
            "called_as": list(spec.called_as),
            "routed": [c for c in spec.class_names if settings.routes_class((c,))],
            "order": list(manager.policy.kinds_for(op)),
            "order_from": (f"op_backends ({settings.origins['op_backends']})"
                           if op in settings.op_backends else f"prefer ({settings.origins['prefer']})"),
            "candidates": [i.impl_id for i in sel.candidates],
            "skipped": [{"impl": name, "why": why} for name, _, why in manager.skipped(op, sel)],
            # Declared input limits (dispatch/limits.py): a call outside them goes to the next
            # candidate that takes it.
            "limits": {i.impl_id: i.limits.describe() for i in manager.registry.impls(op)
                       if i.limits is not None},
        }
        try:
            resolved = manager.resolve(op)
            entry["chosen"] = resolved.impl.label
            entry["preferred_unavailable"] = [{"kind": k, "why": why} for k, why in resolved.passed_over]
        except NoImplementationError as exc:
            entry["chosen"] = None
            entry["error"] = str(exc)
        # Token buckets with an order of their own (``op@bucket``): what each one runs.
        entry["buckets"] = {}
        entry["routes"] = {}
        lo = 0
        for bucket, hi in settings.token_buckets:
            tokens, lo = (f"tokens<={hi}" if hi is not None else f"tokens>{lo}"), hi or lo
            if manager.policy.order_origin(op, bucket) != f"{op}@{bucket}":
                entry["routes"][bucket] = entry["chosen"]
                continue
            b_entry = {"max_tokens": hi, "tokens": tokens, "order": list(manager.policy.kinds_for(op, bucket)),
                       "candidates": [i.impl_id for i in manager.selection(op, bucket).candidates]}
            try:
                b_entry["chosen"] = manager.resolve(op, bucket).impl.label
            except NoImplementationError as exc:
                b_entry["chosen"], b_entry["error"] = None, str(exc)
            entry["buckets"][bucket] = b_entry
            entry["routes"][bucket] = b_entry["chosen"]
        report["ops"][op] = entry
    return report
