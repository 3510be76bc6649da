"""Registers the template vendor backend's ops when its runtime is present, and its example
attention backend (which needs only SGLang, so it is registered everywhere)."""

from sglang_fl.dispatch.backends import register_backend
from sglang_fl.dispatch.backends.vendor.template.attention import ATTENTION
from sglang_fl.dispatch.backends.vendor.template.backend import TemplateBackend

BACKEND = TemplateBackend()


def register_builtins(registry) -> None:
    register_backend(registry, BACKEND)
    registry.register_attention_backend(ATTENTION)
