"""The ``[OOT-DISPATCH]`` log: one line per (layer class, route taken) per process.

Format (contract): ``[OOT-DISPATCH] RMSNorm → flagos(flagos)``, written by the bridge when a
call first takes the route (``sglang_glue.bridges.ImplSlot``), so it never names a route that did
not run. A routed layer (or a kind of call) that the bridge hands back to SGLang gets
``[OOT-DISPATCH] RMSNorm → left to SGLang (fp32_residual)``, the reason in parentheses. Lines go
to the sglang_fl logger and, when ``SGLANG_FL_DISPATCH_LOG`` is set, are appended to that file
(several SGLang processes may share it, so each line is one small append).
"""

from __future__ import annotations

import threading

from sglang_fl.logging_setup import get_logger

logger = get_logger("dispatch")
_seen: set[tuple[str, str, str | None]] = set()
_lock = threading.Lock()


def format_line(class_name: str, label: str) -> str:
    return f"[OOT-DISPATCH] {class_name} → {label}"


def log_left_to_sglang(class_name: str, why: str, path: str | None) -> None:
    log_dispatch(class_name, f"left to SGLang ({why})", path)


def log_dispatch(class_name: str, label: str, path: str | None) -> None:
    key = (class_name, label, path)
    with _lock:
        if key in _seen:
            return
        _seen.add(key)
    line = format_line(class_name, label)
    logger.info("%s", line)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
