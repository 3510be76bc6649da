"""A Layer-2 router over the reference backend plus one stand-in ``flagos`` rms_norm impl, and a
real SGLang RMSNorm to bind: what the binding and size-dispatch tests drive."""

from __future__ import annotations

from sglang_fl.config import build_settings
from sglang_fl.dispatch.manager import OpManager
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import OpImpl


def router_with(env, impl):
    """(LayerRouter, OpManager) for settings from ``env`` on the CPU platform, with ``impl``
    registered as the flagos rms_norm."""
    from sglang_fl.dispatch.backends.reference import ReferenceBackend
    from sglang_fl.sglang_glue.layer_hook import LayerRouter

    settings = build_settings(env=env, detect_platform=lambda: "cpu")
    registry = OpRegistry()
    registry.register_many(ReferenceBackend().op_impls())
    registry.register(OpImpl("rms_norm", "flagos", "flagos", impl))
    manager = OpManager(registry, SelectionPolicy.from_settings(settings))
    return LayerRouter(settings, manager), manager


def make_layer():
    """A real SGLang RMSNorm(64) with non-trivial weights, and the forward SGLang picks for it."""
    from sglang.srt.layers.layernorm import RMSNorm

    from sglang_fl.sglang_glue.adapters import get_adapter

    layer = RMSNorm(64)
    layer.weight.data.normal_(1.0, 0.1)
    return layer, get_adapter().sglang_forward_choice(layer)
