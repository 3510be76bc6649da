"""Layer-2 dispatch: registry, policy and manager for fused ops (framework-neutral).

``call_op(op, obj, *args)`` runs ``op`` on the impl chosen by the policy; ``resolve_op(op)``
returns the cached resolution so callers can bind ``resolved.impl.fn`` once and skip dispatch
on the hot path.
"""

from __future__ import annotations

from sglang_fl.dispatch.manager import OpManager, ResolvedOp, get_manager, reset_manager
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, NoImplementationError, OpImpl


def resolve_op(op_name: str) -> ResolvedOp:
    return get_manager().resolve(op_name)


def call_op(op_name: str, obj, *args, **kwargs):
    return get_manager().call(op_name, obj, *args, **kwargs)


__all__ = [
    "BackendImplKind", "BackendPriority", "NoImplementationError", "OpImpl", "OpManager",
    "ResolvedOp", "call_op", "get_manager", "reset_manager", "resolve_op",
]
