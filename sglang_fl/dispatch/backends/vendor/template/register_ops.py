"""Registers the template vendor backend's ops when its runtime is present."""

from sglang_fl.dispatch.backends import register_backend
from sglang_fl.dispatch.backends.vendor.template.backend import TemplateBackend

BACKEND = TemplateBackend()


def register_builtins(registry) -> None:
    register_backend(registry, BACKEND)
