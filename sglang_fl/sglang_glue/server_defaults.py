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
import os

from sglang_fl.dispatch.backends import real_module_available
from sglang_fl.logging_setup import get_logger
from sglang_fl.models.config import read_config, text_settings
from sglang_fl.sglang_glue.adapters import get_adapter

logger = get_logger("platform")

CPU_MAX_TOTAL_TOKENS = 8192
#: Mamba/GDN state slots of a hybrid model on CPU: one per running request (and cached prefix);
#: the token budget at 64 tokens a request. SGLang would size the pool from host RAM (about
#: 800k slots, 7-8 GB, for a 64-wide model).
CPU_MAX_MAMBA_CACHE_SIZE = CPU_MAX_TOTAL_TOKENS // 64
STATE_DTYPES = ("float32", "bfloat16", "float16")
#: ``--dtype`` spellings SGLang accepts for those (SGLANG_MAMBA_CONV_DTYPE knows only the names
#: above: it reads anything else as bf16, silently).
DTYPE_ALIASES = {"float": "float32", "half": "float16"}


#: config.json keys only a model with recurrent-state (Mamba/GDN) layers has.
HYBRID_CONFIG_KEYS = ("linear_num_key_heads", "linear_conv_kernel_dim", "mamba_d_state",
                      "mamba_n_heads", "ssm_state_size", "hybrid_override_pattern",
                      "layers_block_type", "attn_layer_period")
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "attention")


def model_is_hybrid(model_path) -> bool | None:
    """Whether the model at ``model_path`` has recurrent-state layers, from its config.json;
    None when that cannot be read here (a hub name, say)."""
    try:
        cfg = text_settings(read_config(model_path))
    except (OSError, ValueError):
        return None
    if any(key in cfg for key in HYBRID_CONFIG_KEYS):
        return True
    layer_types = cfg.get("layer_types")
    return isinstance(layer_types, list) and any(t not in ATTENTION_LAYER_TYPES for t in layer_types)


def remember_user_choices(server_args, *args, **kwargs):
    """BEFORE hook of the adapter's ``SERVER_ARGS_POST_INIT`` (where the version has one)."""
    get_adapter().remember_user_choices(server_args)


def _plan(settings, server_args) -> dict[str, tuple[object, str]]:
    """option -> (value, why) for this platform (and, on CPU, this model)."""
    platform = settings.platform
    plan: dict[str, tuple[object, str]] = {}
    if platform == "cpu":
        plan["attention_backend"] = ("torch_native", "intel_amx needs sgl_kernel's CPU build")
        plan["disable_cuda_graph"] = (True, "no device graphs on CPU")
        plan["max_total_tokens"] = (CPU_MAX_TOTAL_TOKENS, "SGLang would size the KV pool from host RAM")
        # The entry scheduler polls its sockets without blocking: an idle CPU server keeps one
        # core at 100 % (measured: 9.8 CPU-s per idle 10 s; 0.16 with this), which the model's
        # own threads then lack. It waits on the same sockets instead; other ranks block anyway.
        # (Pipeline stages too: a --pp-size 2 server with it served as fast, measured here.)
        plan["sleep_on_idle"] = (True, "an idle scheduler would keep one CPU core busy polling")
        plan["max_mamba_cache_size"] = (CPU_MAX_MAMBA_CACHE_SIZE,
                                        "SGLang would size the hybrid models' state pool from host RAM")
        hybrid_defaults = get_adapter().CPU_HYBRID_DEFAULTS
        if hybrid_defaults:  # they would change how a dense model is scheduled: read the config
            model = getattr(server_args, "model_path", "")
            hybrid = model_is_hybrid(model)
            if hybrid is None:
                logger.info("server defaults for hybrid models applied: %s/config.json is not "
                            "readable here, so it may be one", model)
            if hybrid is not False:
                plan.update(hybrid_defaults)
    elif platform == "cuda" and not real_module_available("flashinfer")[0]:
        # (Ascend/MUSA keep SGLang's own per-device defaults, e.g. the "ascend" attention backend.)
        plan["attention_backend"] = ("triton", "flashinfer is not installed (empty mode)")
        plan["sampling_backend"] = ("pytorch", "flashinfer is not installed (empty mode)")
        # 0.5.23 picks FlashInfer's GDN kernels on SM90/SM100 unless these are set (seen on
        # the H200, 2026-12-03: the flashinfer stand-in was called at the first prefill).
        for option in ("linear_attn_prefill_backend", "linear_attn_decode_backend"):
            plan[option] = ("triton", "flashinfer is not installed (empty mode)")
    if settings.attention_backend is not None:  # e.g. a vendor's backend, from its platform YAML
        plan["attention_backend"] = (settings.attention_backend,
                                     f"attention_backend from {settings.origins['attention_backend']}")
    if importlib.util.find_spec("xgrammar") is None:  # else SGLang's scheduler dies at start
        plan["grammar_backend"] = ("none", "xgrammar is not installed")
    off = get_adapter().prefill_graph_off_default(server_args) if platform == "cuda" else None
    if off is not None:
        plan[off[0]] = (off[1], "piecewise (prefill) CUDA graph is incompatible with FlagGems")
    return plan


def apply_defaults(settings, server_args) -> dict[str, tuple[object, str]]:
    """Apply the platform's defaults to unchosen options; returns option -> (value, why) of
    what changed."""
    adapter = get_adapter()
    chosen = adapter.user_choices(server_args)
    changed = {}
    plan = _plan(settings, server_args)
    dtype = getattr(server_args, "dtype", None)
    dtype = DTYPE_ALIASES.get(dtype, dtype)
    # SGLang keeps the GDN/Mamba conv state in bf16 whatever the model's dtype. On CPU an fp32
    # model then drifts from HF after a few tokens, so there both states follow --dtype. On a
    # GPU, 0.5.11's Triton causal_conv1d_fn does not compile for an input whose dtype is not the
    # state's ("Mismatched type for col0", H100 2026-12-05: an fp32 model's conv fell to the
    # PyTorch reference), so there the conv state follows an fp32 or fp16 --dtype. (--dtype
    # auto is not covered: what it resolves to is read from the checkpoint later.)
    conv_why = None
    if settings.platform == "cpu" and dtype in STATE_DTYPES:
        plan["mamba_ssm_dtype"] = (dtype, "hybrid models' recurrent state follows --dtype on CPU")
        conv_why = "hybrid models' conv state follows --dtype on CPU"
    elif settings.platform != "cpu" and dtype in ("float32", "float16"):
        conv_why = ("hybrid models' conv state follows --dtype: SGLang's Triton "
                    "causal_conv1d_fn needs the input's dtype")
    env = adapter.MAMBA_CONV_DTYPE_ENV
    if conv_why and env and env not in os.environ:
        os.environ[env] = dtype  # read by the scheduler processes, which inherit it
        changed[env] = (dtype, conv_why)
        logger.info("server default: %s=%s (%s; set the variable to override)", env, dtype,
                    conv_why)
    for name, (value, why) in plan.items():
        if not hasattr(server_args, name):
            continue
        if chosen is not None and name in chosen:
            continue
        if getattr(server_args, name) == value:
            continue
        setattr(server_args, name, value)
        changed[name] = (value, why)
        logger.info("server default: %s=%r (%s; pass the option to override)", name, value, why)
    if settings.platform == "cuda":
        problems = adapter.graph_backend_problems(server_args)
        if problems:
            raise ValueError("; ".join(problems))
    return changed
