"""AROUND hooks on SGLang's ``GroupCoordinator`` (the adapter's ``GROUP_COORDINATOR``) that hand its collectives to `CommunicatorFL`.

SGLang-facing glue only; the collectives themselves live in `communicator.py` / `flagcx.py`.

- ``__init__``: after SGLang built the group (process groups, its own communicators), attach a
  `CommunicatorFL` as ``group.fl_communicator`` -- ``None`` for a group of one rank. Every rank of
  a group constructs it at the same time, which is what FlagCX's unique-id exchange needs.
- each collective: delegate when the group has a communicator, else call SGLang's original.
- ``destroy``: close the communicator before SGLang tears down its process groups.
"""

from __future__ import annotations

from collections.abc import Callable

from sglang_fl.logging_setup import get_logger

logger = get_logger("sglang_fl.distributed")

ATTR = "fl_communicator"

# Methods whose SGLang signature (after ``self``) CommunicatorFL repeats exactly.
DELEGATED = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
    "reduce_scatter", "all_gatherv", "reduce_scatterv", "broadcast", "send", "recv",
)
# Methods that also need the coordinator itself (SGLang's object channel for metadata).
WITH_COORDINATOR = ("broadcast_tensor_dict", "send_tensor_dict", "recv_tensor_dict")

_registered: tuple[str, str | None] | None = None


def _delegate(name: str) -> Callable:
    def hook(original, group, *args, **kwargs):
        comm = group.__dict__.get(ATTR)
        if comm is None:
            return original(group, *args, **kwargs)
        try:
            return getattr(comm, name)(*args, **kwargs)
        except RuntimeError as exc:  # torch.distributed / FlagCX: say which group and call
            comm.report_failure(name, exc)
            raise

    hook.__name__ = hook.__qualname__ = f"fl_{name}"
    return hook


def _delegate_with_coordinator(name: str) -> Callable:
    def hook(original, group, *args, **kwargs):
        comm = group.__dict__.get(ATTR)
        if comm is None:
            return original(group, *args, **kwargs)
        try:
            return getattr(comm, name)(group, *args, **kwargs)
        except RuntimeError as exc:
            comm.report_failure(name, exc)
            raise

    hook.__name__ = hook.__qualname__ = f"fl_{name}"
    return hook


def make_hooks(engine_kind: str, flagcx_path: str | None) -> dict[str, Callable]:
    """method name -> AROUND hook, for one engine kind (``'flagcx'`` or ``'torch'``)."""

    def fl_init(original, group, *args, **kwargs):
        original(group, *args, **kwargs)
        from sglang_fl.distributed.communicator import CommunicatorFL

        group.__dict__[ATTR] = CommunicatorFL.for_group(group, engine_kind, flagcx_path)

    def fl_destroy(original, group, *args, **kwargs):
        comm = group.__dict__.pop(ATTR, None)
        if comm is not None:
            try:
                comm.close()
            except Exception:  # SGLang's own teardown must still run
                logger.exception("closing CommunicatorFL of %s failed", group.unique_name)
        return original(group, *args, **kwargs)

    hooks = {"__init__": fl_init, "destroy": fl_destroy}
    hooks.update({name: _delegate(name) for name in DELEGATED})
    hooks.update({name: _delegate_with_coordinator(name) for name in WITH_COORDINATOR})
    return hooks


def register(engine_kind: str, flagcx_path: str | None) -> bool:
    """Register the hooks once per process; returns False if they already were."""
    global _registered
    if _registered is not None:
        if _registered != (engine_kind, flagcx_path):
            raise RuntimeError(f"Layer-3 hooks already registered for {_registered}, "
                               f"not for {(engine_kind, flagcx_path)}")
        return False
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    for name, hook in make_hooks(engine_kind, flagcx_path).items():
        adapter.register_hook(f"{adapter.GROUP_COORDINATOR}.{name}", hook, "around")
    _registered = (engine_kind, flagcx_path)
    return True
