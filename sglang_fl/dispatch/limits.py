"""What an implementation accepts: declared next to its method, checked before its kernel runs.

A kernel that refuses some inputs (SGLang's FLA chunk kernel asserts on fp32; a kernel built for
one head size) declares it with `accepts` on its backend method::

    @accepts(q=("bfloat16", "float16"), why="the FLA kernel asserts on float32")
    def chunk_gated_delta_rule(self, obj, q, k, ...): ...

Registration (``Backend.op_impls``) wraps such a method once in a guard that compares the named
arguments' dtypes (and runs ``check(*args)`` for shape limits) and raises `InputsDeclined`
instead of calling the kernel. The manager then gives that call to the next implementation in
the op's order that accepts it, logging the decline once (``ResolvedOp.retry``); the declining
impl stays the op's choice for the inputs it takes. Methods without a declaration are bound
unwrapped: the guard costs only where a limit is declared (a dtype comparison per named
argument). ``sglang-fl ops`` lists the limits.

Nothing here imports torch at module level.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

LIMITS_ATTR = "__sglang_fl_limits__"
_DTYPE_NAMES = ("float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2",
                "int8", "int32", "int64", "bool")


class InputsDeclined(ValueError):
    """An implementation does not take this call's inputs (its declared `InputLimits`)."""


@dataclass(frozen=True)
class InputLimits:
    #: ``(argument name, accepted dtype names)``, e.g. ``(("q", ("bfloat16", "float16")),)``.
    dtypes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: ``check(*args_after_obj) -> reason or None`` for limits a dtype list cannot say.
    check: Callable[..., str | None] | None = None
    #: The limit described for ``sglang-fl ops`` when ``check`` is given.
    check_doc: str = ""
    #: Why the kernel has these limits (shown with the decline).
    why: str = ""

    def describe(self) -> str:
        parts = [f"{name} in {'|'.join(names)}" for name, names in self.dtypes]
        if self.check_doc:
            parts.append(self.check_doc)
        return "; ".join(parts) + (f" ({self.why})" if self.why else "")

    def guard(self, fn, spec):
        """``fn`` (signed as ``spec``) wrapped so that inputs outside the limits raise
        `InputsDeclined` naming the argument, its dtype and what is accepted."""
        import torch

        params = [p.name for p in spec.parameters]
        checks = []
        for name, names in self.dtypes:
            if name not in params:
                raise ValueError(f"accepts(): op {spec.name} has no parameter {name!r}; "
                                 f"parameters: {', '.join(params[1:])}")
            accepted = frozenset(getattr(torch, n) for n in names)
            checks.append((params.index(name), name, accepted, "|".join(names)))
        check, why = self.check, f" ({self.why})" if self.why else ""
        label = f"{spec.name} impl {getattr(fn, '__qualname__', fn)}"

        @functools.wraps(fn)
        def guarded(obj, *args, **kwargs):
            for pos, name, accepted, names in checks:
                x = args[pos - 1] if len(args) >= pos else kwargs.get(name)
                if x is not None and x.dtype not in accepted:
                    raise InputsDeclined(f"{label} takes {name} in {names}, not "
                                         f"{str(x.dtype).removeprefix('torch.')}{why}")
            if check is not None:
                reason = check(*args, **kwargs)
                if reason:
                    raise InputsDeclined(f"{label}: {reason}{why}")
            return fn(obj, *args, **kwargs)

        guarded.__sglang_fl_guarded__ = True
        return guarded


def accepts(*, why: str = "", check: Callable[..., str | None] | None = None, check_doc: str = "",
            **dtypes: tuple[str, ...]):
    """Declare the inputs a backend method's kernel takes (see the module docstring)."""
    for name, names in dtypes.items():
        bad = [n for n in names if n not in _DTYPE_NAMES]
        if isinstance(names, str) or bad:
            raise ValueError(f"accepts({name}=...): give a tuple of dtype names from "
                             f"{', '.join(_DTYPE_NAMES)}; got {names!r}")
    if check is not None and not check_doc:
        raise ValueError("accepts(check=...): say what it checks in check_doc (sglang-fl ops "
                         "shows it)")
    limits = InputLimits(tuple((k, tuple(v)) for k, v in dtypes.items()), check, check_doc, why)

    def mark(method):
        setattr(method, LIMITS_ATTR, limits)
        return method

    return mark


def limits_of(method) -> InputLimits | None:
    return getattr(getattr(method, "__func__", method), LIMITS_ATTR, None)
