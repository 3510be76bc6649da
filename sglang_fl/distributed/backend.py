"""Which collectives backend Layer 3 uses, and whether sglang-fl owns communication at all.

Pure decisions over `Settings`; nothing here imports torch, so the plugin can call it in every
SGLang process at start-up for free.

The rule (documented for users in docs/distributed.md):

====================  =======================  ===========================================
effective backend      who runs collectives     why
====================  =======================  ===========================================
``flagcx``             sglang-fl, FlagCX engine  the point of Layer 3: one library on every chip
``gloo``               sglang-fl, torch engine   SGLang's CPU path lacks ``all_gatherv`` /
                                                 ``reduce_scatterv`` (pynccl only) and sends
                                                 fp32/bf16 all-reduce to ``sgl_kernel`` shared-
                                                 memory kernels on AMX/arm64 hosts, which an
                                                 "empty" SGLang does not have
``nccl`` (CUDA)        SGLang                    pynccl, custom all-reduce, symmetric memory
                                                 are faster than anything we would put on top
``hccl`` (Ascend)      SGLang                    SGLang's own NpuCommunicator
====================  =======================  ===========================================

The effective backend is ``Settings.dist_backend`` (where ``FLAGCX_PATH`` already beats a platform
YAML's default, not a user's choice), or the platform's native one if nothing set it. ``flagcx``
on a CPU-only group is refused when the group is built: FlagCX has no CPU device adaptor.
"""

from __future__ import annotations

from typing import Any

BACKENDS = ("nccl", "hccl", "flagcx", "gloo")

# Backends for which sglang-fl installs the GroupCoordinator hooks, and the engine each one uses.
OWNED_BACKENDS = {"flagcx": "flagcx", "gloo": "torch"}
#: The backend each engine serves (a `CommunicatorFL`'s ``engine_name`` -> backend).
ENGINE_BACKENDS = {engine: backend for backend, engine in OWNED_BACKENDS.items()}

# torch.distributed backend of each platform's device process group (what SGLang itself picks).
NATIVE_TORCH_BACKEND = {"cuda": "nccl", "ascend": "hccl", "musa": "mccl", "cpu": "gloo"}


class DistBackendError(ValueError):
    """A Layer-3 setting that cannot work; the message names the variable and what is accepted."""


def resolve_backend(settings: Any) -> str:
    """The backend Layer 3 uses: ``nccl`` | ``hccl`` | ``flagcx`` | ``gloo``."""
    backend = settings.dist_backend  # Settings already applied FLAGCX_PATH's precedence
    origin = settings.origins.get("dist_backend", "")
    if backend is None:
        backend = {"cuda": "nccl", "ascend": "hccl"}.get(settings.platform, "gloo")
    if backend not in BACKENDS:
        raise DistBackendError(
            f"SGLANG_FL_DIST_BACKEND={backend!r} is not a known collectives backend "
            f"(from {origin or 'unknown origin'}); accepted: {', '.join(BACKENDS)}"
        )
    return backend


def engine_kind(settings: Any) -> str | None:
    """``'flagcx'`` or ``'torch'`` when sglang-fl owns communication, else ``None`` (SGLang does)."""
    return OWNED_BACKENDS.get(resolve_backend(settings))


def dist_backend_string(settings: Any) -> str:
    """The torch.distributed backend of the device process group (what PlatformFL reports).

    ``nccl``/``hccl``/``gloo`` are reported as they are. ``flagcx`` reports the platform's native
    torch backend (cuda: nccl, ascend: hccl, musa: mccl, cpu: gloo): FlagCX runs as a ctypes
    engine *beside* SGLang's process groups, which SGLang still needs for barriers, object
    broadcasts and ``gather``; naming ``flagcx`` would require FlagCX's optional c10d plugin.
    """
    backend = resolve_backend(settings)
    if backend == "flagcx":
        return NATIVE_TORCH_BACKEND.get(settings.platform, "gloo")
    return backend
