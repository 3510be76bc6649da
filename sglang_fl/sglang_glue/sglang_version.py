"""Everything that depends on the SGLang version, in one place.

SGLang 0.5.11: fused ops subclass ``MultiPlatformOp``, whose ``__init__`` stores
``self._forward_method = self.dispatch_forward()`` and whose ``forward`` calls it. We wrap
``dispatch_forward`` with an AROUND hook, so each layer instance is bound once, at construction.
The layer classes each op serves are declared in the op table (``OpSpec.serves``, paths of
this version); a version whose classes moved maps them here.
SGLang 0.5.23 replaced ``dispatch_forward`` with a lazy ``_resolve_forward_method`` on
``sglang.kernels.fused_op.BaseFusedOp``; supporting it means adding its target and layer table here.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from sglang_fl.dispatch.ops import OPS


@dataclass(frozen=True)
class LayerRoute:
    """An SGLang layer class routed through op ``op_name``; subclasses that keep its forward
    methods (they only change e.g. the RoPE cache) are routed too."""

    class_path: str  # "module:ClassName"
    op_name: str

    @property
    def class_name(self) -> str:
        return self.class_path.rsplit(":", 1)[1]


DISPATCH_HOOK_TARGET = "sglang.srt.layers.utils.multi_platform.MultiPlatformOp.dispatch_forward"

LAYER_ROUTES = tuple(LayerRoute(path, spec.name) for spec in OPS for path in spec.serves)

# Methods a subclass must not override for the base's bridge to stay correct.
FORWARD_METHODS = ("forward", "forward_native", "forward_cuda")

SUPPORTED_VERSIONS = ("0.5.11",)


def sglang_version() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None
