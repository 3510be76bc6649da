"""Native swaps: rebind SGLang module globals that are hard-wired to a CUDA-only kernel.

A few SGLang functions pick their implementation at import time with ``if is_cuda(): ... =
<jit_kernel version>`` and are not fused ops, so no plugin API reaches them. When the JIT path
cannot run (``tvm_ffi`` absent), we rebind each to the native twin SGLang ships in the same
module, right after that module executes; where SGLang ships no twin but already has a native
branch behind a capability check, the check is rebound to answer "no". The list is `NATIVE_SWAPS`; each entry is also in the
ledger in ``sglang_fl/compat/__init__.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

logger = logging.getLogger("sglang_fl.compat")


class NativeSwap(NamedTuple):
    module: str
    attr: str  # the hard-wired global the module's own code calls
    native: str  # SGLang's native twin in the same module, or "" when `replacement` is given
    replacement: Callable | None = None  # used instead of a twin


def _jit_store_cache_unavailable(row_bytes: int) -> bool:
    """memory_pool asks ``can_use_store_cache`` before its JIT KV-store kernel, which compiles
    through apache-tvm-ffi; without it the answer is no, and SGLang takes its own index-put path
    (the same one it takes for unsupported row sizes) without calling the tvm_ffi stand-in."""
    return False


NATIVE_SWAPS: tuple[NativeSwap, ...] = (
    NativeSwap("sglang.srt.model_executor.forward_batch_info", "clamp_position", "_clamp_position_native"),
    NativeSwap("sglang.srt.managers.overlap_utils", "_resolve_future_token_ids", "_resolve_future_token_ids_native"),
    NativeSwap("sglang.srt.mem_cache.memory_pool", "can_use_store_cache", "",
               _jit_store_cache_unavailable),
)

applied: list[str] = []


def apply_swaps(module) -> None:
    """Rebind every swap of ``module`` whose global is not already the native twin."""
    for swap in NATIVE_SWAPS:
        if swap.module != module.__name__:
            continue
        needed = swap.attr if swap.replacement is not None else swap.native
        if not hasattr(module, needed):
            raise RuntimeError(
                f"sglang-fl native swap: {swap.module}.{needed} no longer exists in this SGLang "
                f"version; update sglang_fl/compat/swaps.py NATIVE_SWAPS"
            )
        native = swap.replacement or getattr(module, swap.native)
        if getattr(module, swap.attr, None) is not native:
            setattr(module, swap.attr, native)
            applied.append(f"{swap.module}.{swap.attr}")
            logger.debug("native swap: %s.%s -> %s", swap.module, swap.attr,
                         swap.native or swap.replacement.__name__)


def install() -> None:
    from sglang_fl.compat.module_hooks import add_hook

    for module in dict.fromkeys(s.module for s in NATIVE_SWAPS):
        add_hook(module, after=apply_swaps)
