"""Say which server process died when SGLang stops the server because one did.

A pipeline stage or TP rank killed from outside (SIGKILL, the OOM killer) writes nothing; its
peers fail in their next send or receive and one of them makes launch_server stop the whole
server. SGLang's message then only says that "one child failed". A BEFORE hook on launch_server's
SIGQUIT handler logs each scheduler or detokenizer process that has exited, and how, before
SGLang kills the rest (the SGLang details are in the version adapter (``sglang_fl.sglang_glue.adapters``)).

A peer can see the closed connection before the killed process has finished exiting (the kernel
closes its sockets before it becomes reapable), so when no process has exited yet the report
waits up to ``DEATH_GRACE_S`` for one to; only a failure with no death behind it pays that wait.
"""

from __future__ import annotations

import signal
import time

from sglang_fl.logging_setup import get_logger
from sglang_fl.sglang_glue.adapters import get_adapter

logger = get_logger("platform")

#: How long a failure report waits for a dying process to become visible as exited.
DEATH_GRACE_S = 2.0
_POLL_S = 0.05


def register_process_report() -> None:
    adapter = get_adapter()
    adapter.register_hook(adapter.SIGQUIT_HANDLER_TARGET, report_dead_children, "before")


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _dead(children) -> list[tuple[str, int, int]]:
    return [(label, proc.pid, proc.exitcode) for label, proc in children
            if not proc.is_alive() and proc.exitcode not in (None, 0)]


def report_dead_children(signal_handler, *args, **kwargs) -> None:
    try:
        children = get_adapter().server_children(signal_handler)
        dead = _dead(children)
        deadline = time.monotonic() + DEATH_GRACE_S
        while children and not dead and time.monotonic() < deadline:
            time.sleep(_POLL_S)
            dead = _dead(children)
    except Exception:  # noqa: BLE001 - a report must never stand in the way of SGLang's cleanup
        logger.debug("could not inspect the server's processes", exc_info=True)
        return None
    for label, pid, code in dead:
        logger.error("server stopping: process %s (pid %d) %s", label, pid, describe_exit(code))
    if children and not dead:
        logger.error("server stopping: a server process reported a failure; its traceback is "
                     "above in the log")
    return None
