"""Bridges: turn an SGLang layer's forward call into a call of the resolved op impl.

``bridge_for(op)(layer, slot, native)`` returns the callable stored as the layer's
``_forward_method``. An op whose standard signature is SGLang's forward signature plus ``obj``
needs no bridge of its own: `bind_passthrough` calls ``slot.fn(layer, *args)``. The others have
one ``bind_<op>`` in `BRIDGES`, doing only the argument adaptation SGLang's signature needs.
``native`` is the method SGLang itself chose; a bridge uses it for the few call shapes the
standard op cannot express (logged once).
"""

from __future__ import annotations

import functools

from sglang_fl.dispatch.manager import ResolvedOp
from sglang_fl.dispatch.ops import OpSpec
from sglang_fl.dispatch.types import OpImpl
from sglang_fl.sglang_glue.adapters import get_adapter
from sglang_fl.sglang_glue.dispatch_log import log_dispatch, log_left_to_sglang


class ImplSlot:
    """The impl a layer currently calls, and the layer's ``[OOT-DISPATCH]`` lines.

    ``fn`` is read on every call. It starts as a trampoline that writes the routed line (the
    route is being taken now, not merely chosen) and puts the impl in its place; a bridge that
    hands a layer or a call back to SGLang calls `left_to_sglang` instead. ``call_after_failure``
    runs only when the impl raised (non-strict fallback to the next candidate). ``where`` is
    the token bucket's note in the log line (`SizeRoutedSlot`), empty without buckets."""

    __slots__ = ("impl", "fn", "resolved", "class_name", "log_path", "where")

    def __init__(self, resolved: ResolvedOp, class_name: str, log_path: str | None,
                 where: str = "") -> None:
        self.resolved = resolved
        self.class_name = class_name
        self.log_path = log_path
        self.where = where
        self.impl = resolved.impl
        self.fn = self._first_call

    @property
    def can_fall_back(self) -> bool:
        return not self.resolved.strict and len(self.resolved.candidates) > 1

    @property
    def bucket_impls(self) -> tuple[OpImpl, ...]:
        """The impl each token bucket is resolved to (one: no buckets of its own)."""
        return (self.resolved.impl,)

    def _first_call(self, *args, **kwargs):
        # Logged once the impl has returned: a first call it declined or failed is logged
        # under the impl that took it instead (call_after_failure).
        self._current()
        result = self.impl.fn(*args, **kwargs)
        self.taken()
        return result

    def _current(self) -> None:
        """Take the resolution's current impl: another layer's fallback may have dropped the
        one this slot was built with (then nothing is left to fall back to, and calling that
        one would raise on every call)."""
        if self.impl not in self.resolved.candidates and self.resolved.candidates:
            self.impl = self.resolved.impl

    def taken(self) -> None:
        """The route is taken: log it, and call the impl directly from now on."""
        self._current()
        self.fn = self.impl.fn
        log_dispatch(self.class_name, self.impl.label + self.where, self.log_path)

    def direct(self):
        """What to bind where nothing can fall back: the impl itself (the route is taken)."""
        self.taken()
        return self.fn

    def left_to_sglang(self, why: str) -> None:
        log_left_to_sglang(self.class_name, why, self.log_path)

    def call_after_failure(self, exc: Exception, *args, **kwargs):
        """Fall back (or re-raise in strict mode) until an impl succeeds; a call the impl
        declined (its declared limits) is logged under the impl that took it."""
        return self.resolved.retry(self.impl, exc, args, kwargs, on_switch=self._switch,
                                   on_decline=self._declined_to)[1]

    def _declined_to(self, taker: OpImpl, decliner: OpImpl) -> None:
        log_dispatch(self.class_name, f"{taker.label}{self.where} (inputs declined by "
                     f"{decliner.impl_id})", self.log_path)

    def _switch(self, impl: OpImpl) -> None:
        self.impl = impl
        self.taken()


class SizeRoutedSlot:
    """One `ImplSlot` per token bucket whose candidates differ, and ``fn``, which picks the
    bucket's slot by the token count of the op's size argument (`OpSpec.size_arg`): one
    comparison per bucket boundary (one with two buckets), then the bucket's own ``fn``.
    Each bucket logs its route (``[decode: tokens<=64]``) the first time a call takes it."""

    __slots__ = ("slots", "bounds", "fn", "class_name", "log_path", "_spec")

    def __init__(self, routes, class_name: str, log_path: str | None, spec: OpSpec) -> None:
        self.class_name, self.log_path = class_name, log_path
        self.bounds = tuple(hi for hi, _, _ in routes[:-1])
        self.slots = tuple(ImplSlot(r, class_name, log_path, f" [{name}: {_range(routes, i)}]")
                           for i, (_, name, r) in enumerate(routes))
        self._spec = spec
        self.fn = self._router(spec)

    def _router(self, spec: OpSpec):
        """``fn`` with the op's own signature (no ``*args`` packing on the hot path): read the
        token count, pick the bucket's slot (one comparison per boundary), call its ``fn``."""
        names = [p.name for p in spec.parameters]
        chain = "".join(f"_s{i} if _t <= {b} else " for i, b in enumerate(self.bounds))
        src = (f"def by_tokens{spec.signature}:\n"
               f"    _t = {names[spec.size_position]}.shape[{spec.size_dim}]\n"
               f"    return ({chain}_s{len(self.bounds)}).fn({', '.join(names)})\n")
        scope = {f"_s{i}": slot for i, slot in enumerate(self.slots)}
        exec(compile(src, f"<sglang_fl token buckets {spec.name}>", "exec"), scope)  # noqa: S102
        return scope["by_tokens"]

    def pick(self, args: tuple, kwargs: dict) -> ImplSlot:
        """The slot of the bucket holding this call's token count (`OpSpec.token_count`)."""
        tokens = self._spec.token_count(args, kwargs)
        for bound, slot in zip(self.bounds, self.slots, strict=False):
            if tokens is not None and tokens <= bound:
                return slot
        return self.slots[-1]

    @property
    def resolved(self) -> ResolvedOp:
        return self.slots[-1].resolved

    @property
    def can_fall_back(self) -> bool:
        return any(s.can_fall_back for s in self.slots)

    @property
    def bucket_impls(self) -> tuple[OpImpl, ...]:
        return tuple(s.resolved.impl for s in self.slots)

    def direct(self):
        return self.fn

    def left_to_sglang(self, why: str) -> None:
        log_left_to_sglang(self.class_name, why, self.log_path)

    def call_after_failure(self, exc: Exception, *args, **kwargs):
        return self.pick(args, kwargs).call_after_failure(exc, *args, **kwargs)


def _range(routes, i: int) -> str:
    hi, lo = routes[i][0], routes[i - 1][0] if i else 0
    if hi is None:
        return f"tokens>{lo}"
    return f"tokens<={hi}" if not lo else f"{lo}<tokens<={hi}"


def make_slot(routes, class_name: str, log_path: str | None, spec: OpSpec):
    """`ImplSlot` for one resolution, `SizeRoutedSlot` for per-bucket ones
    (`OpManager.resolve_by_size`)."""
    if isinstance(routes, ResolvedOp):
        return ImplSlot(routes, class_name, log_path)
    return SizeRoutedSlot(routes, class_name, log_path, spec)


def bind_passthrough(layer, slot: ImplSlot, native):
    """SGLang's forward arguments are the op's, after ``obj``."""
    if not slot.can_fall_back:
        # Nothing to fall back to: the signature matches, so bind without a Python frame (the
        # binder makes the first call through it right away).
        return functools.partial(slot.direct(), layer)

    def forward(*args, **kwargs):
        try:
            return slot.fn(layer, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            return slot.call_after_failure(exc, layer, *args, **kwargs)

    return forward


def bind_rms_norm(layer, slot: ImplSlot, native):
    unsupported = [a for a, ok in get_adapter().RMSNORM_UNSUPPORTED if getattr(layer, a, ok) != ok]
    if unsupported:
        slot.left_to_sglang(", ".join(unsupported))
        return native

    adapter = get_adapter()
    why = adapter.rms_norm_call_unsupported(layer, None)
    if why:
        slot.left_to_sglang(why)
        return native

    def forward(x, residual=None, post_residual_addition=None, quant_linear=None):
        # quant_linear: SGLang 0.5.23's RMSNorm.forward (the adapter says when it matters).
        if quant_linear is not None:
            why = adapter.rms_norm_call_unsupported(layer, quant_linear)
            if why:
                slot.left_to_sglang(f"calls with {why}")
                return native(x, residual, post_residual_addition, quant_linear)
        if residual is None:  # forward_native ignores post_residual_addition without a residual
            try:
                return slot.fn(layer, x)
            except Exception as exc:  # noqa: BLE001
                return slot.call_after_failure(exc, layer, x)
        # The impl adds post_residual_addition itself: RMSNorm sums all three in fp32.
        try:
            return slot.fn(layer, x, residual, post_residual_addition)
        except Exception as exc:  # noqa: BLE001
            return slot.call_after_failure(exc, layer, x, residual, post_residual_addition)

    return forward


bind_gemma_rms_norm = bind_rms_norm


class _RopeCaches:
    """cos/sin halves of the layer's ``cos_sin_cache``, split once (not per call) and
    re-split only if SGLang replaces the cache (e.g. moves it to another device)."""

    __slots__ = ("source", "cos", "sin")

    def __init__(self) -> None:
        self.source = None

    def get(self, layer):
        cache = layer.cos_sin_cache
        if cache is not self.source:
            cos, sin = cache.chunk(2, dim=-1)
            self.cos, self.sin, self.source = cos.contiguous(), sin.contiguous(), cache
        return self.cos, self.sin


def bind_rotary_embedding(layer, slot: ImplSlot, native):
    caches = _RopeCaches()
    interleaved = not layer.is_neox_style

    def forward(positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
        if fused_set_kv_buffer_arg is not None:  # SGLang's kernel also stores K/V: its own path
            slot.left_to_sglang("calls with fused_set_kv_buffer_arg")
            return native(positions, query, key, offsets, fused_set_kv_buffer_arg)
        if offsets is not None:
            positions = positions + offsets
        cos, sin = caches.get(layer)
        try:
            return slot.fn(layer, query, key, cos, sin, positions, interleaved, True)
        except Exception as exc:  # noqa: BLE001
            return slot.call_after_failure(exc, layer, query, key, cos, sin, positions, interleaved, True)

    return forward


def bind_mrotary_embedding(layer, slot: ImplSlot, native):
    if getattr(layer, "mrope_interleaved_glm", False):  # GLM-V's axis map: not in the op
        slot.left_to_sglang("mrope_interleaved_glm")
        return native
    caches = _RopeCaches()
    section = tuple(layer.mrope_section or ())
    mrope_interleaved = bool(layer.mrope_interleaved)
    interleaved = not layer.is_neox_style

    def forward(positions, query, key, fused_set_kv_buffer_arg=None):
        if fused_set_kv_buffer_arg is not None:
            slot.left_to_sglang("calls with fused_set_kv_buffer_arg")
            return native(positions, query, key, fused_set_kv_buffer_arg)
        cos, sin = caches.get(layer)
        args = (query, key, cos, sin, positions, section, mrope_interleaved, interleaved, True)
        try:
            return slot.fn(layer, *args)
        except Exception as exc:  # noqa: BLE001
            return slot.call_after_failure(exc, layer, *args)

    return forward


def bind_topk(layer, slot: ImplSlot, native):
    adapter = get_adapter()
    kwargs, unsupported = adapter.topk_op_kwargs(layer)
    if unsupported:
        slot.left_to_sglang(", ".join(unsupported))
        return native

    def forward(hidden_states, router_logits, **extras):
        # extras: the version's TOPK_CALL_EXTRAS (expert-parallel / dynamic routing arguments).
        why = adapter.topk_call_unsupported(layer, extras)
        if why:
            slot.left_to_sglang(why)
            return native(hidden_states, router_logits, **extras)
        try:
            weights, ids = slot.fn(layer, hidden_states, router_logits, **kwargs)
        except Exception as exc:  # noqa: BLE001
            weights, ids = slot.call_after_failure(exc, layer, hidden_states, router_logits, **kwargs)
        return adapter.topk_output(layer, weights, ids, router_logits)

    return forward


def bind_fused_moe(method, slot: ImplSlot, native):
    """``method`` is SGLang's ``UnquantizedFusedMoEMethod``; the op's ``obj`` is the FusedMoE
    layer it is called with (``w13_weight``, ``w2_weight``)."""
    routed = None  # decided on the first call, once the layer's weights are loaded
    adapter = get_adapter()

    def forward(layer, dispatch_output):
        nonlocal routed
        if routed is None:
            unsupported = adapter.fused_moe_unsupported(method, layer)
            if unsupported:
                slot.left_to_sglang(", ".join(unsupported))
            routed = not unsupported
        routing = adapter.standard_routing(dispatch_output) if routed else None
        if routing is None:
            if routed:
                slot.left_to_sglang("calls with a quantized or non-standard top-k dispatch")
            return native(layer, dispatch_output)
        try:
            out = slot.fn(layer, *routing)
        except Exception as exc:  # noqa: BLE001
            out = slot.call_after_failure(exc, layer, *routing)
        return adapter.combine_input(out)

    return forward


def bind_rms_norm_gated(layer, slot: ImplSlot, native):
    """SGLang's FLA gated RMSNorm: ``forward(x, z=None)``; eps, group size and gate order are
    layer attributes there, arguments of the op."""
    activation = getattr(layer, "activation", "swish")
    if activation not in ("swish", "silu"):
        slot.left_to_sglang(f"activation={activation}")
        return native
    eps, group_size = layer.eps, layer.group_size
    norm_before_gate = bool(getattr(layer, "norm_before_gate", True))

    def forward(x, z=None):
        args = (x, z, eps, group_size, norm_before_gate)
        try:
            return slot.fn(layer, *args)
        except Exception as exc:  # noqa: BLE001
            return slot.call_after_failure(exc, layer, *args)

    return forward


#: Ops whose SGLang forward signature differs from the standard one.
BRIDGES = {
    "rms_norm": bind_rms_norm,
    "gemma_rms_norm": bind_gemma_rms_norm,
    "rotary_embedding": bind_rotary_embedding,
    "mrotary_embedding": bind_mrotary_embedding,
    "topk": bind_topk,
    "fused_moe": bind_fused_moe,
    "rms_norm_gated": bind_rms_norm_gated,
}


def bridge_for(op_name: str):
    return BRIDGES.get(op_name, bind_passthrough)
