"""Server defaults that let an "empty" SGLang start on each platform, applied only to options
the user left at SGLang's default.

Which options the user chose is the SGLang version's business (the adapter's ``user_choices``):
in 0.5.11 ``remember_user_choices`` runs as a BEFORE hook on ``ServerArgs.__post_init__``, i.e.
before SGLang fills its own device defaults, and records which options differ from the field
defaults; 0.5.23 keeps the user's raw input on the record while it resolves. ``apply_defaults``
(called from PlatformFL.apply_server_args_defaults) then changes only the others and logs each
change.
"""

from __future__ import annotations

import importlib.util

from sglang_fl.dispatch.backends import real_module_available
from sglang_fl.logging_setup import get_logger
from sglang_fl.sglang_glue.adapters import get_adapter

logger = get_logger("platform")

CPU_MAX_TOTAL_TOKENS = 8192


def remember_user_choices(server_args, *args, **kwargs):
    """BEFORE hook of the adapter's ``SERVER_ARGS_POST_INIT`` (where the version has one)."""
    get_adapter().remember_user_choices(server_args)


def _plan(settings) -> dict[str, tuple[object, str]]:
    """option -> (value, why) for this platform."""
    platform = settings.platform
    plan: dict[str, tuple[object, str]] = {}
    if platform == "cpu":
        plan["attention_backend"] = ("torch_native", "intel_amx needs sgl_kernel's CPU build")
        plan["disable_cuda_graph"] = (True, "no device graphs on CPU")
        plan["max_total_tokens"] = (CPU_MAX_TOTAL_TOKENS, "SGLang would size the KV pool from host RAM")
    elif platform == "cuda" and not real_module_available("flashinfer")[0]:
        # (Ascend/MUSA keep SGLang's own per-device defaults, e.g. the "ascend" attention backend.)
        plan["attention_backend"] = ("triton", "flashinfer is not installed (empty mode)")
        plan["sampling_backend"] = ("pytorch", "flashinfer is not installed (empty mode)")
    if settings.attention_backend is not None:  # e.g. a vendor's backend, from its platform YAML
        plan["attention_backend"] = (settings.attention_backend,
                                     f"attention_backend from {settings.origins['attention_backend']}")
    if importlib.util.find_spec("xgrammar") is None:  # else SGLang's scheduler dies at start
        plan["grammar_backend"] = ("none", "xgrammar is not installed")
    if platform == "cuda":
        option, value = get_adapter().PREFILL_GRAPH_OFF
        plan[option] = (value, "piecewise (prefill) CUDA graph is incompatible with FlagGems")
    return plan


def apply_defaults(settings, server_args) -> dict[str, tuple[object, str]]:
    """Apply the platform's defaults to unchosen options; returns option -> (value, why) of
    what changed."""
    chosen = get_adapter().user_choices(server_args)
    changed = {}
    for name, (value, why) in _plan(settings).items():
        if not hasattr(server_args, name):
            continue
        if chosen is not None and name in chosen:
            continue
        if getattr(server_args, name) == value:
            continue
        setattr(server_args, name, value)
        changed[name] = (value, why)
        logger.info("server default: %s=%r (%s; pass the option to override)", name, value, why)
    return changed
