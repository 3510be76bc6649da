"""Server defaults that let an "empty" SGLang start on each platform, applied only to options
the user left at SGLang's default.

``remember_user_choices`` runs (as a BEFORE hook) when ``ServerArgs.__post_init__`` starts, i.e.
before SGLang fills its own device defaults, and records which options differ from the dataclass
defaults; ``apply_defaults`` (called from PlatformFL.apply_server_args_defaults) then changes only
the others and logs each change.
"""

from __future__ import annotations

import dataclasses
import importlib.util

from sglang_fl.dispatch.backends import real_module_available
from sglang_fl.logging_setup import get_logger

logger = get_logger("platform")

USER_CHOICES_ATTR = "_sglang_fl_user_choices"
POST_INIT_TARGET = "sglang.srt.server_args.ServerArgs.__post_init__"
CPU_MAX_TOTAL_TOKENS = 8192


def remember_user_choices(server_args, *args, **kwargs):
    chosen = set()
    for f in dataclasses.fields(server_args):
        if f.default is not dataclasses.MISSING and getattr(server_args, f.name, f.default) != f.default:
            chosen.add(f.name)
    object.__setattr__(server_args, USER_CHOICES_ATTR, frozenset(chosen))


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
        plan["disable_piecewise_cuda_graph"] = (True, "piecewise CUDA graph is incompatible with FlagGems")
    return plan


def apply_defaults(settings, server_args) -> dict[str, tuple[object, str]]:
    """Apply the platform's defaults to unchosen options; returns option -> (value, why) of
    what changed."""
    chosen = getattr(server_args, USER_CHOICES_ATTR, None)
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
