"""Native swaps: rebind SGLang module globals that are hard-wired to a CUDA-only kernel.

A few SGLang functions pick their implementation at import time with ``if is_cuda(): ... =
<jit_kernel version>`` and are not fused ops, so no plugin API reaches them. When the JIT path
cannot run (``tvm_ffi`` absent), we rebind each to the native twin SGLang ships in the same
module, right after that module executes. The list is `NATIVE_SWAPS`; each entry is also in the
ledger in ``sglang_fl/compat/__init__.py``.
"""

from __future__ import annotations

import logging
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


def install() -> None:
    from sglang_fl.compat.module_hooks import add_hook

    for module in dict.fromkeys(s.module for s in NATIVE_SWAPS):
        add_hook(module, after=apply_swaps)
