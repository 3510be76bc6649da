"""Registers the template vendor backend's ops when its runtime is present, and its example
attention backend (which needs only SGLang). Discovery imports this module only where the user
enabled the template (``SGLANG_FL_ENABLE_VENDORS=template``)."""

from sglang_fl.dispatch.backends import register_backend
from sglang_fl.dispatch.backends.vendor.template.attention import ATTENTION
from sglang_fl.dispatch.backends.vendor.template.backend import TemplateBackend

BACKEND = TemplateBackend()


def register_builtins(registry) -> None:
    register_backend(registry, BACKEND)
    registry.register_attention_backend(ATTENTION)
