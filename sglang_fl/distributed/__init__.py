"""Layer 3: SGLang's collectives on FlagCX or torch.distributed.

Public surface (used by ``sglang_fl.plugin`` and ``sglang_fl.platform``):

- `register_hooks(settings)`: install the ``GroupCoordinator`` hooks when sglang-fl owns
  communication (backend ``flagcx``, or ``gloo`` on CPU), return whether it did. With ``nccl``
  on CUDA or ``hccl`` on Ascend SGLang's own fast paths stay in charge. See `backend` for the
  rule and why.
- `dist_backend_string(settings)`: the torch.distributed backend PlatformFL reports.
- `CommunicatorFL`: what the hooks delegate to (imported lazily: it needs torch).

Registration is cheap: it imports neither torch nor SGLang's parallel_state; the hooks are
applied by SGLang's ``HookRegistry.apply_hooks()`` and build communicators when SGLang builds
its groups.
"""

from __future__ import annotations

from typing import Any

from sglang_fl.distributed.backend import (
    DistBackendError,
    dist_backend_string,
    engine_kind,
    resolve_backend,
)
from sglang_fl.logging_setup import get_logger

logger = get_logger("sglang_fl.distributed")


def register_hooks(settings) -> bool:
    """Register the Layer-3 AROUND hooks if sglang-fl should own communication.

    A missing ``libflagcx.so`` is reported here at ERROR level but does not stop start-up: a
    single-rank server never needs it, and a multi-rank one fails with the same message as soon
    as SGLang builds its first group of more than one rank.
    """
    kind = engine_kind(settings)
    backend = resolve_backend(settings)
    if kind is None:
        logger.info("Layer 3: backend %s -> SGLang's own communicators stay in charge", backend)
        return False
    if kind == "flagcx":
        from sglang_fl.distributed.flagcx import FlagCXError, find_library

        try:
            find_library(settings.flagcx_path)
        except FlagCXError as exc:
            logger.error("Layer 3: %s", exc)
    from sglang_fl.distributed.hooks import register

    register(kind, settings.flagcx_path)
    logger.info("Layer 3: backend %s -> GroupCoordinator collectives via CommunicatorFL(%s)",
                backend, kind)
    return True


def __getattr__(name: str) -> Any:
    if name == "CommunicatorFL":
        from sglang_fl.distributed.communicator import CommunicatorFL

        return CommunicatorFL
    raise AttributeError(name)


__all__ = ["CommunicatorFL", "DistBackendError", "dist_backend_string", "engine_kind",
           "register_hooks", "resolve_backend"]
