"""Native swaps: rebind SGLang module globals that are hard-wired to a CUDA-only kernel.

A few SGLang functions pick their implementation at import time with ``if is_cuda(): ... =
<jit_kernel version>`` and are not fused ops, so no plugin API reaches them. When the JIT path
cannot run (``tvm_ffi`` absent), we rebind each to the native twin SGLang ships in the same
module, right after that module executes; where SGLang ships no twin but already has a native
branch behind a capability check, the check is rebound to answer "no". Which globals, in which
modules, is the SGLang version's business: the adapter's ``NATIVE_SWAPS``
(``sglang_glue/adapters``); each entry is also in the ledger in ``sglang_fl/compat/__init__.py``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_fl.compat")

applied: list[str] = []


_cpu = False  # install(cpu=True) adds the adapter's CPU_NATIVE_SWAPS


def native_swaps():
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    return adapter.NATIVE_SWAPS + (adapter.CPU_NATIVE_SWAPS if _cpu else ())


#: The swaps `install` armed: those whose ``needs`` package is absent on this host.
armed: list = []


def apply_swaps(module, swaps=None) -> None:
    """Rebind every swap of ``module`` (of ``swaps``, default all of the adapter's) whose
    global is not already the native twin."""
    for swap in native_swaps() if swaps is None else swaps:
        if swap.module != module.__name__:
            continue
        needed = swap.attr if swap.replacement is not None else swap.native
        if not hasattr(module, needed):
            if swap.cuda_only:
                continue  # this host is not CUDA: SGLang never bound the global
            raise RuntimeError(
                f"sglang-fl native swap: {swap.module}.{needed} no longer exists in this SGLang "
                f"version; update NATIVE_SWAPS of its adapter (sglang_fl/sglang_glue/adapters)"
            )
        native = swap.replacement or getattr(module, swap.native)
        if getattr(module, swap.attr, None) is not native:
            setattr(module, swap.attr, native)
            applied.append(f"{swap.module}.{swap.attr}")
            logger.debug("native swap: %s.%s -> %s", swap.module, swap.attr,
                         swap.native or swap.replacement.__name__)


_hooked: set[str] = set()


def install(absent=lambda name: False, cpu: bool = False) -> None:
    """Arm the swaps whose ``needs`` package is absent (``absent(name) -> bool``) and, on the
    CPU platform (``cpu``), the adapter's CPU swaps; hook each of their modules once."""
    global _cpu
    from sglang_fl.compat.module_hooks import add_hook
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    _cpu = _cpu or cpu
    armed[:] = [s for s in adapter.NATIVE_SWAPS if absent(s.needs)] + list(
        adapter.CPU_NATIVE_SWAPS if _cpu else ())
    for module in dict.fromkeys(s.module for s in armed):
        if module not in _hooked:
            _hooked.add(module)
            add_hook(module, after=lambda m: apply_swaps(m, armed))
