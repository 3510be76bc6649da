"""Which chip this process runs on: the single place that probes vendor runtimes.

Probing is cheap and never initialises a device context, so it is safe before SGLang forks or
spawns its workers.
"""

from __future__ import annotations

import functools
import importlib.util


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


@functools.lru_cache(maxsize=1)
def detect_platform() -> str:
    """``ascend`` | ``musa`` | ``cuda`` | ``cpu`` for the current host."""
    import torch

    if _has_module("torch_npu"):
        import torch_npu  # noqa: F401  (registers torch.npu)

        if torch.npu.is_available():
            return "ascend"
    if _has_module("torch_musa"):
        import torch_musa  # noqa: F401  (registers torch.musa)

        if torch.musa.is_available():
            return "musa"
    if torch.cuda.is_available() and getattr(torch.version, "hip", None) is None:
        return "cuda"
    return "cpu"


# torch device type used by each platform name.
DEVICE_TYPE = {"cuda": "cuda", "ascend": "npu", "musa": "musa", "cpu": "cpu"}
