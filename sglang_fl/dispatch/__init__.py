"""Layer-2 dispatch: registry, policy and manager for fused ops (framework-neutral).

``call_op(op, obj, *args)`` runs ``op`` on the impl the policy chooses for the call's token
bucket (the token count of the op's size argument); ``resolve_op(op, bucket=None)`` returns the
cached resolution of one bucket (None: the op-wide order) so callers can bind
``resolved.impl.fn`` once and skip dispatch on the hot path.
"""

from __future__ import annotations

from sglang_fl.dispatch.manager import OpManager, ResolvedOp, get_manager, reset_manager
from sglang_fl.dispatch.types import BackendImplKind, BackendPriority, NoImplementationError, OpImpl


def resolve_op(op_name: str, bucket: str | None = None) -> ResolvedOp:
    return get_manager().resolve(op_name, bucket)


def call_op(op_name: str, obj, *args, **kwargs):
    return get_manager().call(op_name, obj, *args, **kwargs)


__all__ = [
    "BackendImplKind", "BackendPriority", "NoImplementationError", "OpImpl", "OpManager",
    "ResolvedOp", "call_op", "get_manager", "reset_manager", "resolve_op",
]
