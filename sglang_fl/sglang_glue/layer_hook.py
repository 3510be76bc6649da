"""Layer 2 hook: decide, once per SGLang layer instance, which forward it runs.

The AROUND hook on the method that resolves a fused op's forward (the adapter's
``DISPATCH_HOOK_TARGET``: ``dispatch_forward`` in SGLang 0.5.11, run in ``__init__``;
``_resolve_forward_method`` in 0.5.23, run lazily on the first call) gets the method SGLang
picked (``native``).
For a routed layer it resolves the op (cached per op and token bucket by the manager: one
resolution, or one per bucket where the op's order depends on the token count) and returns a
one-shot binder; SGLang stores that as the layer's ``_forward_method``. The binder runs on the layer's
first call (the layer's attributes, e.g. ``cos_sin_cache``, may not exist yet when the hook
runs), builds the bridge and replaces itself, so every
later call is SGLang's ``forward`` -> bridge -> impl (-> with token buckets, one comparison
first; with ``custom_ops``, through ``torch.ops.sglang_fl.<op>``). The bridge writes the dispatch log line
when a call takes the route, or says the layer was left to SGLang.
"""

from __future__ import annotations

import functools
import pkgutil

from sglang_fl.config import Settings
from sglang_fl.dispatch.custom_ops import CustomOpSlot
from sglang_fl.dispatch.manager import OpManager
from sglang_fl.dispatch.ops import OPS, OPS_BY_NAME
from sglang_fl.logging_setup import get_logger
from sglang_fl.sglang_glue.adapters import get_adapter
from sglang_fl.sglang_glue.bridges import bridge_for, make_slot

logger = get_logger("sglang_glue")


class LayerRouter:
    """Maps a layer class to its route (or None), once per class."""

    def __init__(self, settings: Settings, manager: OpManager) -> None:
        self.settings = settings
        self.manager = manager
        self.adapter = get_adapter()
        self._routes = [(pkgutil.resolve_name(r.class_path), r)
                        for r in self.adapter.layer_routes(OPS)]
        self._route_of_class = dict(self._routes)

    def routed_ops(self) -> tuple[str, ...]:
        """The ops that routed layer classes will ask for (the SGLANG_FL_OOT_* settings applied),
        and the ops SGLang calls as functions (``called_as``), in the op table's order."""
        routed = {route.op_name for _, route in self._routes
                  if self.settings.routes_class((route.class_name,))}
        return tuple(spec.name for spec in OPS if spec.name in routed or spec.called_as)

    def resolve_routed_ops(self) -> None:
        """Resolve every routed op now, at plugin load, so a configuration that cannot be met
        fails before SGLang builds a model (naming every op at once) and each op that misses its
        preferred backend kind is logged once, instead of being found layer by layer."""
        self.manager.resolve_all(self.routed_ops())

    @functools.cache  # noqa: B019 - one router per process, classes are few
    def route_for(self, cls: type):
        """The route of the nearest routed class in ``cls``'s MRO (``MRotaryEmbedding`` has its
        own, though it subclasses ``RotaryEmbedding``), unless ``cls`` overrides its forward
        methods or the OOT white/blacklist says no."""
        for base in cls.__mro__:
            route = self._route_of_class.get(base)
            if route is None:
                continue
            overridden = [m for m in self.adapter.FORWARD_METHODS
                          if getattr(cls, m, None) is not getattr(base, m, None)]
            if overridden:
                logger.debug("%s overrides %s of %s: left to SGLang", cls.__name__, overridden,
                             base.__name__)
                return None
            names = ((route.class_name,) if route.class_name in self.adapter.MODULE_ROUTES
                     else (route.class_name, cls.__name__))  # FLA's "RMSNorm" is not RMSNorm
            if not self.settings.routes_class(names):
                logger.debug("%s not routed (SGLANG_FL_OOT_* settings)", cls.__name__)
                return None
            return route
        return None

    def bind(self, layer, native):
        """What the dispatch hook target returns for ``layer``."""
        route = self.route_for(type(layer))
        if route is None:
            return native
        routes = self.manager.resolve_by_size(route.op_name)
        # A plain-module route is logged by its routed name (SGLang's FLA norm is also "RMSNorm").
        class_name = (route.class_name if route.class_name in self.adapter.MODULE_ROUTES
                      else type(layer).__name__)
        log_path = self.settings.dispatch_log
        make_bridge = bridge_for(route.op_name)
        spec = OPS_BY_NAME[route.op_name]

        slot = make_slot(routes, class_name, log_path, spec)
        if self.settings.custom_ops:  # defined and keyed now: a first call may be traced
            slot = CustomOpSlot(slot, spec, self.reference_fn(route.op_name), layer)

        def bind_on_first_call(*args, **kwargs):
            forward = make_bridge(layer, slot, native)
            layer._forward_method = forward
            return forward(*args, **kwargs)

        return bind_on_first_call


    def reference_fn(self, op_name: str):
        """The reference impl of ``op_name`` (the custom op's fake kernel runs it)."""
        return next(i.fn for i in self.manager.registry.impls(op_name) if i.kind.value == "reference")


def register_layer_hook(router: LayerRouter) -> None:
    def around_dispatch_forward(original, layer, *args, **kwargs):
        return router.bind(layer, original(layer, *args, **kwargs))

    router.adapter.register_hook(router.adapter.DISPATCH_HOOK_TARGET, around_dispatch_forward,
                                 "around")
    register_module_routes(router)


def register_module_routes(router: LayerRouter) -> None:
    """Route the adapter's ``MODULE_ROUTES`` (plain ``nn.Module`` classes) through ``router``:
    their ``forward`` binds each instance on its first call, as the dispatch hook binds a fused
    op, and then calls what it bound (ledger entry ``route:RMSNormGated``)."""
    for class_name in router.adapter.MODULE_ROUTES:
        cls = router.adapter.layer_class(class_name)
        native = cls.forward
        if getattr(native, "__sglang_fl_routed__", False):
            continue

        def forward(self, *args, _native=native, **kwargs):
            bound = self.__dict__.get("_forward_method")
            if bound is None:
                bound = router.bind(self, _native.__get__(self))
                if bound is not None and router.route_for(type(self)) is None:
                    self.__dict__["_forward_method"] = bound  # left to SGLang: call it directly
            return bound(*args, **kwargs)

        forward.__sglang_fl_routed__ = True
        forward.__wrapped__ = native
        cls.forward = forward
