"""Implementations checked against the op table when they are registered.

As pluggy verifies a hook implementation against its spec at registration, a backend method
that is misspelled or mis-signed is refused when its backend registers, with a message naming
the backend, the method and the expected signature, instead of registering nothing or failing
(and falling back) at run time.

Rules:

- An implementation's op must be in the table.
- Its parameters begin with the op's, with the same names in the same order; where the table
  gives a default, the implementation has the same default. Parameters after those need
  defaults. It may stop before the op's ``optional`` trailing parameters, and is then wrapped
  once (``OpSpec.adapt_short``) so that callers can always pass them. An implementation taking
  ``*args`` cannot be checked past its named parameters.
- A backend class's public methods (no leading ``_``, not defined by `Backend` itself) are
  ops or helpers. One whose name is close to an op's (``rmsnorm``, ``silu_mul``) or whose first
  parameter is ``obj`` is taken for a mistyped op and refused with a "did you mean"; a helper of
  that kind gets a leading ``_``.
"""

from __future__ import annotations

import dataclasses
import inspect

from sglang_fl.dispatch.backends import Backend
from sglang_fl.dispatch.limits import limits_of
from sglang_fl.dispatch.ops import OP_NAMES, OPS_BY_NAME, OpSpec, closest, did_you_mean
from sglang_fl.dispatch.types import OpImpl

_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)


class InvalidImplError(TypeError):
    """An implementation, or a backend method, does not fit the op table."""


def verify_impl(impl: OpImpl) -> OpImpl:
    """``impl`` if it fits its op's entry, or ``impl`` with its ``fn`` wrapped when it leaves out
    the op's optional trailing parameters; else InvalidImplError."""
    spec = OPS_BY_NAME.get(impl.op_name)
    if spec is None:
        raise InvalidImplError(
            f"{impl.impl_id}: registers unknown op {impl.op_name!r}{did_you_mean(impl.op_name)}; "
            f"the op table has: {', '.join(OP_NAMES)}")
    owner = getattr(_unwrap(impl.fn), "__self__", None)
    if isinstance(owner, Backend):
        verify_backend_class(type(owner), impl.impl_id)
    try:
        sig = inspect.signature(impl.fn)
    except (TypeError, ValueError):  # e.g. a C function without a signature: nothing to check
        return impl
    why, short = _mismatch(spec, sig)
    if why:
        raise InvalidImplError(_message(impl.impl_id, _qualname(impl.fn), sig, spec, why))
    if short:
        impl = dataclasses.replace(impl, fn=spec.adapt_short(impl.fn))
    return _with_limits(impl, spec)


def _with_limits(impl: OpImpl, spec) -> OpImpl:
    """``impl`` with its ``fn`` guarded by the limits declared on it (`limits.accepts`)."""
    limits = limits_of(_unwrap(impl.fn)) or limits_of(impl.fn)
    if limits is None or getattr(impl.fn, "__sglang_fl_guarded__", False):
        return impl
    try:
        fn = limits.guard(impl.fn, spec)
    except ValueError as exc:
        raise InvalidImplError(f"{impl.impl_id}: {exc}") from None
    return dataclasses.replace(impl, fn=fn, limits=limits)


_verified_classes: set[type] = set()


def verify_backend_class(cls: type, who: str) -> None:
    """Refuse ``cls`` if one of its public methods is a mistyped op or an op with another
    signature than the table's. ``who`` names the backend in the message (``vendor.acme``)."""
    if cls in _verified_classes:
        return
    base_names = set(dir(Backend))
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass is Backend or not issubclass(klass, Backend):
            continue
        for name, raw in vars(klass).items():
            if name in seen or name.startswith("_") or name in base_names:
                continue
            seen.add(name)
            sig = _method_signature(raw)
            if sig is None:
                continue
            qualname = f"{cls.__name__}.{name}"
            if name in OPS_BY_NAME:
                why, _ = _mismatch(OPS_BY_NAME[name], sig)
                if why:
                    raise InvalidImplError(_message(who, qualname, sig, OPS_BY_NAME[name], why))
                continue
            meant = closest(name)
            params = list(sig.parameters)
            if meant or (params and params[0] == "obj"):
                hint = f" (did you mean {meant!r}? expected: {OPS_BY_NAME[meant].describe()})" \
                    if meant else ""
                raise InvalidImplError(
                    f"{who}: {qualname}{sig} looks like an op method, but the op table has no "
                    f"op {name!r}{hint}. Op methods are named after the table's ops "
                    f"({', '.join(OP_NAMES)}); give a helper method a leading '_'")
    _verified_classes.add(cls)


def _mismatch(spec: OpSpec, sig: inspect.Signature) -> tuple[str | None, bool]:
    """(why ``sig`` does not fit ``spec``, or None; whether it stops before the optional
    trailing parameters)."""
    params = list(sig.parameters.values())
    positional = [p for p in params if p.kind in _POSITIONAL]
    varargs = any(p.kind is _P.VAR_POSITIONAL for p in params)
    expected = spec.parameters
    for i, (got, want) in enumerate(zip(positional, expected, strict=False)):
        if got.name != want.name:
            return f"parameter {i + 1} is {got.name!r}, expected {want.name!r}", False
        if want.default is not _P.empty and got.default is _P.empty:
            return f"{want.name!r} has no default, expected ={want.default!r}", False
        if want.default is not _P.empty and got.default != want.default:
            return f"{want.name!r} defaults to {got.default!r}, expected {want.default!r}", False
    missing = tuple(p.name for p in expected[len(positional):])
    short = False
    if missing and not varargs:
        keyword_only = [p.name for p in params if p.kind is _P.KEYWORD_ONLY and p.name in missing]
        if keyword_only:
            return (f"{', '.join(map(repr, keyword_only))} must be positional (callers pass the "
                    f"op's parameters by position)"), False
        if missing != spec.optional[len(spec.optional) - len(missing):]:
            return f"missing parameter(s) {', '.join(map(repr, missing))}", False
        short = True
    extra = [p.name for p in positional[len(expected):] if p.default is _P.empty]
    extra += [p.name for p in params if p.kind is _P.KEYWORD_ONLY and p.default is _P.empty]
    if extra:
        return (f"extra parameter(s) {', '.join(map(repr, extra))} without a default (callers "
                f"pass only the op's parameters)"), False
    return None, short


def _message(who: str, qualname: str, sig: inspect.Signature, spec: OpSpec, why: str) -> str:
    return (f"{who}: {qualname}{sig} does not match the standard signature of op {spec.name!r} "
            f"({why}); expected: {spec.describe()}")


def _method_signature(raw) -> inspect.Signature | None:
    """The signature a method has when called on an instance (``self`` dropped); None for
    attributes that are no methods."""
    if isinstance(raw, staticmethod):
        fn, drop = raw.__func__, 0
    elif isinstance(raw, classmethod):
        fn, drop = raw.__func__, 1
    elif inspect.isfunction(raw):
        fn, drop = raw, 1
    else:  # properties, constants, nested classes
        return None
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    return sig.replace(parameters=list(sig.parameters.values())[drop:])


def _unwrap(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def _qualname(fn) -> str:
    fn = _unwrap(fn)
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__
