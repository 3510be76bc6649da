"""Registers the cuda vendor backend's ops when its runtime is present."""

from sglang_fl.dispatch.backends import register_backend
from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend

BACKEND = CudaBackend()


def register_builtins(registry) -> None:
    register_backend(registry, BACKEND)
