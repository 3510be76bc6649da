"""Vendor attention backends in SGLang: registration by name, the platform default, and the
check that every attention backend a server is asked for exists.

A vendor folder registers an `AttentionBackendImpl` in its ``register_ops.py``
(``registry.register_attention_backend``); discovery keeps it (see
``sglang_fl.dispatch.discovery``). In every SGLang process, `register_attention_backends` then
adds each one that the allow/deny vendor lists admit to SGLang's registry, so
``--attention-backend <name>`` selects it, and answers SGLang's by-name question "may Triton
helpers run beside this backend" from the backend's ``triton_helpers``. The names and private
details of SGLang involved are in the version adapter (``sglang_fl.sglang_glue.adapters``).
"""

from __future__ import annotations

from sglang_fl.logging_setup import get_logger
from sglang_fl.sglang_glue.adapters import get_adapter

logger = get_logger("platform")

_registered: dict[str, str] = {}  # name -> "vendor.<name>", in this process
_no_triton: set[str] = set()
_hooked = False


class UnknownAttentionBackendError(ValueError):
    """An attention backend name no backend registered; the message lists the registered ones."""


def register_attention_backends(manager) -> dict[str, str]:
    """Add the vendors' attention backends to SGLang's registry (once per process); returns
    name -> vendor impl id of those added."""
    builtin = set(get_adapter().attention_backend_registry()) - set(_registered)
    for impl in manager.registry.attention_backends():
        vendor_id = f"vendor.{impl.vendor}"
        if impl.name in _registered:
            continue
        excluded = manager.policy.vendor_excluded(impl.vendor)
        if excluded:
            logger.info("attention backend %r of %s not registered: %s", impl.name, vendor_id, excluded)
            continue
        if impl.name in builtin:
            logger.error("attention backend %r of %s not registered: SGLang has its own backend of "
                         "that name; the vendor must pick another", impl.name, vendor_id)
            continue
        get_adapter().add_attention_backend(impl.name, _built_and_logged(impl, vendor_id))
        _registered[impl.name] = vendor_id
        if not impl.triton_helpers:
            _no_triton.add(impl.name)
        logger.info("attention backend %r registered by %s", impl.name, vendor_id)
    global _hooked
    if _no_triton and not _hooked:
        get_adapter().register_hook(get_adapter().SUPPORT_TRITON_TARGET, support_triton, "around")
        _hooked = True
    return dict(_registered)


def _built_and_logged(impl, vendor_id: str):
    """The vendor's factory, logging what it built: the proof that a server really runs it."""

    def factory(model_runner):
        backend = impl.factory(model_runner)
        logger.info("attention backend %r of %s built: %s", impl.name, vendor_id,
                    type(backend).__name__)
        return backend

    factory.__name__ = factory.__qualname__ = f"create_{impl.name}"
    return factory


def support_triton(original, backend: str) -> bool:
    return False if backend in _no_triton else original(backend)


def registered_names() -> list[str]:
    """Every attention backend name SGLang can build here, SGLang's and the vendors'."""
    return sorted(get_adapter().attention_backend_registry())


def check_attention_backends(server_args, origins: dict[str, str] | None = None) -> None:
    """Refuse an attention backend name that nothing registered, naming the ones that exist.

    Runs in ``ServerArgs.__post_init__`` (the platform's server defaults): a name from the
    command line already met SGLang's argparse choices, but one from a platform or user YAML,
    an env variable or ``Engine(attention_backend=...)`` would otherwise fail only in the
    scheduler process, as a bare ``KeyError``-like message."""
    known = get_adapter().attention_backend_registry()
    for option in get_adapter().ATTENTION_BACKEND_OPTIONS:
        name = getattr(server_args, option, None)
        if name is None or name in known:
            continue
        vendors = [f"{n} ({v})" for n, v in sorted(_registered.items())]
        where = (origins or {}).get(option, "the server arguments")
        raise UnknownAttentionBackendError(
            f"--{option.replace('_', '-')} {name!r} (from {where}) is not a registered attention "
            f"backend; registered: {', '.join(registered_names())}"
            + (f"; of these, registered by vendor folders: {', '.join(vendors)}" if vendors else
               "; no vendor folder registered one"))

