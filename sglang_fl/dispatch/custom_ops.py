"""Routed ops as PyTorch custom ops (``torch.ops.sglang_fl.<op>``), for ``custom_ops: true``.

torch.compile (and so SGLang's piecewise CUDA graph, which compiles the model and captures the
pieces between attention calls) traces Python. Traced through, a FlagGems impl stops dynamo in
FlagGems' own Python (a ``logger.debug``, ``libentry``'s kernel-parameter slicing); as a custom
op the routed call is one opaque node: dynamo records it, a fake kernel gives its output shapes,
and the impl runs only when the compiled graph runs.

One op per op-table entry, schema generated from the entry: ``<op>(int fl_layer, <params>) ->
Tensor[]``. ``fl_layer`` indexes the (layer, slot) pairs registered here (a layer is no schema type;
vLLM passes its attention layers by name the same way); the other parameters are the op's
standard ones with `OpSpec.custom_op_types` as types. The kernel calls the slot (its token
buckets and fallback included).

Only a call that torch.compile traces goes through the op: an eager call (eager prefill, the
decode CUDA graph's capture) calls the slot as without ``custom_ops``, so the copies below are
paid only inside compiled graphs (H100, 2026-12-05: with every call through the op, decode ran
at 0.73x of the same server without it (4 pairs), and a traced prefill held 2.2x the kernels).

The op is functional: it mutates no input and its outputs alias none. An impl may write into
the parameters `OpSpec.mutates` names (a fused add-RMSNorm writes x and residual, in-place RoPE
query and key), so the kernel hands it copies of those: one copy kernel per such input and call,
the price of the opaque node (measure it on the device before turning this on by default). The
alternative, declaring the writes (``Tensor(a!)``) so that inductor's re-inplacing can drop the
copies, needs a fixed number of ``Tensor`` returns per op (functionalization refuses ``Tensor[]``
with mutated inputs); SGLang's callers use the returned tensors. Where the contract has an ``inplace`` parameter
(RoPE: "inplace writes into query and key and returns them"), the caller (Python, traced by
torch.compile) copies the outputs back into the `OpSpec.mutates` inputs and returns those.
The fake kernel runs the op's reference implementation on fake tensors (the layer's
``layer_attrs`` made fake), or `OpSpec.fake`.
"""

from __future__ import annotations

import inspect
import threading
import types

from sglang_fl.dispatch.ops import OpSpec

NAMESPACE = "sglang_fl"

_lock = threading.Lock()
_library = None
_defined: dict[str, object] = {}  # op name -> torch.ops.sglang_fl.<op>.default
_reference: dict[str, object] = {}  # op name -> reference fn (fake kernels)
#: key -> (obj, slot); a key is handed out once per (layer, slot) and never reused.
_entries: list[tuple[object, object]] = []


def schema(spec: OpSpec) -> str:
    """``rms_norm(int fl_layer, Tensor x, Tensor? residual=None, ...) -> Tensor[]``."""
    defaults = {p.name: p.default for p in spec.parameters}
    parts = ["int fl_layer"]  # not "key": RoPE has a parameter of that name
    for name, typ in spec.custom_op_types():
        text = f"{typ} {name}"
        if defaults[name] is not _EMPTY:
            text += "=" + _schema_default(defaults[name])
        parts.append(text)
    return f"{spec.name}({', '.join(parts)}) -> Tensor[]"


_EMPTY = inspect.Parameter.empty


class _Empty:
    """The ``obj`` a caller has seen before its first call (no layer is this)."""


def _schema_default(value) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def define(spec: OpSpec, reference_fn) -> object:
    """Define ``torch.ops.sglang_fl.<op>`` (once per process) and return its overload."""
    global _library
    with _lock:
        op = _defined.get(spec.name)
        if op is not None:
            return op
        import torch

        if _library is None:
            _library = torch.library.Library(NAMESPACE, "FRAGMENT")
        _library.define(schema(spec))
        _library.impl(spec.name, _kernel_for(spec), "CompositeExplicitAutograd")
        _reference[spec.name] = reference_fn
        torch.library.register_fake(f"{NAMESPACE}::{spec.name}", _fake_for(spec), lib=_library)
        op = getattr(getattr(torch.ops, NAMESPACE), spec.name).default
        _defined[spec.name] = op
        return op


def _kernel_for(spec: OpSpec):
    written = tuple(i for i, (name, _) in enumerate(spec.custom_op_types()) if name in spec.mutates)
    defaults = _trailing_defaults(spec)

    def kernel(key: int, *args):
        obj, slot = _entries[key]
        if len(args) < len(defaults):  # the dispatcher leaves out trailing defaults
            args = (*args, *defaults[len(args):])
        if written:  # the impl may write into these: let it write into copies
            args = list(args)
            for i in written:
                if args[i] is not None:
                    args[i] = args[i].clone()
        try:
            out = slot.fn(obj, *args)
        except Exception as exc:  # noqa: BLE001 - the slot's fallback, as the bridges do
            out = slot.call_after_failure(exc, obj, *args)
        return _unaliased(out, args)

    return kernel


def _unaliased(out, args) -> list:
    """``out`` as a list, each output that shares storage with an input copied."""
    import torch

    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    inputs = {a.untyped_storage().data_ptr() for a in args
              if isinstance(a, torch.Tensor) and a.numel()}
    return [o.clone() if o.numel() and o.untyped_storage().data_ptr() in inputs else o
            for o in outs]


def _trailing_defaults(spec: OpSpec) -> tuple:
    """Every parameter after ``obj``, as its default (placeholders where there is none)."""
    return tuple(p.default for p in spec.parameters[1:])


def _fake_for(spec: OpSpec):
    defaults = _trailing_defaults(spec)

    def fake(key: int, *args):
        if len(args) < len(defaults):
            args = (*args, *defaults[len(args):])
        obj = _fake_layer(spec, _entries[key][0], args)
        fn = spec.fake or _reference[spec.name]
        out = fn(obj, *args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        # A fresh tensor per output: the real kernel never returns an input either.
        return [o.clone() if any(o is a for a in args) else o for o in outs]

    return fake


def _fake_layer(spec: OpSpec, obj, args):
    """The attributes of ``obj`` an impl may read (``layer_attrs``), tensors made fake in the
    mode of ``args`` (a real parameter cannot enter a fake-tensor computation)."""
    import torch
    from torch._subclasses.fake_tensor import maybe_get_fake_mode

    mode = next((m for a in args if isinstance(a, torch.Tensor)
                 for m in (maybe_get_fake_mode(a),) if m is not None), None)
    attrs = {}
    for name in spec.layer_attrs:
        value = getattr(obj, name)
        if isinstance(value, torch.Tensor):
            value = mode.from_tensor(value) if mode is not None else value.to("meta")
        attrs[name] = value
    return types.SimpleNamespace(**attrs)


def register(obj, slot) -> int:
    """A key for ``(obj, slot)``: the custom op's kernel calls ``slot.fn(obj, ...)``."""
    with _lock:
        _entries.append((obj, slot))
        return len(_entries) - 1


def make_caller(spec: OpSpec, op, slot, obj=None):
    """``fn(obj, <op's parameters>)`` calling ``op(key, ...)``: the op's signature (so callers
    pass what they pass to any impl), the key registered for the first ``obj`` seen and
    re-registered if another one comes (a method object serving one FusedMoE layer sees one)."""
    import torch

    params = spec.parameters
    names = [p.name for p in params[1:]]
    every = ", ".join([params[0].name, *names])
    src = (f"def call{spec.signature}:\n"
           # Outside torch.compile (eager prefill, the decode CUDA graph's capture) the op node
           # buys nothing and its copies of written inputs cost kernels: call the slot itself.
           # Where dynamo traces, it folds is_compiling() to True: this branch is not traced.
           f"    if not _compiling():\n"
           f"        try:\n"
           f"            return _slot.fn({every})\n"
           f"        except Exception as _fl_exc:\n"
           f"            return _slot.call_after_failure(_fl_exc, {every})\n"
           f"    if {params[0].name} is not _seen[0]:\n"
           f"        _seen[0] = {params[0].name}\n"
           f"        _seen[1] = _register({params[0].name}, _slot)\n"
           f"    _fl_out = _op(_seen[1], {', '.join(names)})\n")
    if "inplace" in names and spec.mutates:
        # The contract: with inplace, the outputs are written into these inputs and returned.
        # The op itself is functional, so write them back here, where torch.compile sees it.
        written = ", ".join(spec.mutates)
        src += (f"    if inplace:\n"
                f"        for _fl_dst, _fl_src in zip(({written},), _fl_out):\n"
                f"            _fl_dst.copy_(_fl_src)\n"
                f"        return ({written},)\n")
    src += "    return _fl_out[0] if len(_fl_out) == 1 else tuple(_fl_out)\n"
    seen = [_Empty, -1] if obj is None else [obj, register(obj, slot)]
    scope = {"_seen": seen, "_register": register, "_slot": slot, "_op": op,
             "_compiling": torch.compiler.is_compiling}
    exec(compile(src, f"<sglang_fl custom op {spec.name}>", "exec"), scope)  # noqa: S102
    return scope["call"]


class CustomOpSlot:
    """A slot (`ImplSlot` / `SizeRoutedSlot`) called through ``torch.ops.sglang_fl.<op>``:
    ``fn`` is the custom-op caller; the wrapped slot picks and falls back inside the kernel."""

    __slots__ = ("inner", "fn")

    def __init__(self, inner, spec: OpSpec, reference_fn, obj=None) -> None:
        """``obj``: the layer the bridge will pass, registered now (a first call that
        torch.compile traces then finds no lock to take); another one is registered when seen."""
        self.inner = inner
        self.fn = make_caller(spec, define(spec, reference_fn), inner, obj)

    @property
    def resolved(self):
        return self.inner.resolved

    can_fall_back = False  # the kernel already ran the inner slot's fallback

    def direct(self):
        return self.fn

    def left_to_sglang(self, why: str) -> None:
        self.inner.left_to_sglang(why)

    def call_after_failure(self, exc: Exception, *args, **kwargs):
        raise exc

