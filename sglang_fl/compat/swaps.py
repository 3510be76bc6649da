"""Native swaps: rebind SGLang module globals that are hard-wired to a CUDA-only kernel.

A few SGLang functions pick their implementation at import time with ``if is_cuda(): ... =
<jit_kernel version>`` and are not fused ops, so no plugin API reaches them. When the JIT path
cannot run (``tvm_ffi`` absent), we rebind each to the native twin SGLang ships in the same
module, right after that module executes. The list is `NATIVE_SWAPS`; each entry is also in the
ledger in ``sglang_fl/compat/__init__.py``.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import NamedTuple

logger = logging.getLogger("sglang_fl.compat")


class NativeSwap(NamedTuple):
    module: str
    attr: str  # the hard-wired global the module's own code calls
    native: str  # SGLang's native twin in the same module


NATIVE_SWAPS: tuple[NativeSwap, ...] = (
    NativeSwap("sglang.srt.model_executor.forward_batch_info", "clamp_position", "_clamp_position_native"),
    NativeSwap("sglang.srt.managers.overlap_utils", "_resolve_future_token_ids", "_resolve_future_token_ids_native"),
)

applied: list[str] = []


def apply_swaps(module) -> None:
    """Rebind every swap of ``module`` whose global is not already the native twin."""
    for swap in NATIVE_SWAPS:
        if swap.module != module.__name__:
            continue
        native = getattr(module, swap.native, None)
        if native is None:
            raise RuntimeError(
                f"sglang-fl native swap: {swap.module}.{swap.native} no longer exists in this SGLang "
                f"version; update sglang_fl/compat/swaps.py NATIVE_SWAPS"
            )
        if getattr(module, swap.attr, None) is not native:
            setattr(module, swap.attr, native)
            applied.append(f"{swap.module}.{swap.attr}")
            logger.debug("native swap: %s.%s -> %s", swap.module, swap.attr, swap.native)


class _SwapLoader:
    """Wraps the real loader: runs the module, then `apply_swaps`."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        apply_swaps(module)

    def __getattr__(self, name):  # get_source, is_package ... for tracebacks and inspect
        return getattr(self._loader, name)


class SwapFinder:
    """First entry of ``sys.meta_path`` for the modules in `NATIVE_SWAPS` only."""

    def __init__(self):
        self.modules = frozenset(s.module for s in NATIVE_SWAPS)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.modules:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _SwapLoader(spec.loader)
        return spec


def install() -> None:
    for swap in NATIVE_SWAPS:
        if swap.module in sys.modules:  # already imported: swap in place
            apply_swaps(sys.modules[swap.module])
    if not any(isinstance(f, SwapFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SwapFinder())
