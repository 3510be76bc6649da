"""The ``sglang_fl`` logger, configured once from Settings.log_level."""

from __future__ import annotations

import logging

_configured = False


def get_logger(name: str = "sglang_fl") -> logging.Logger:
    return logging.getLogger(name if name.startswith("sglang_fl") else f"sglang_fl.{name}")


def configure_logging(level: str) -> None:
    """Attach one stderr handler to ``sglang_fl`` (idempotent) so our INFO lines show even when
    the host application did not configure logging."""
    global _configured
    root = logging.getLogger("sglang_fl")
    root.setLevel(level)
    if _configured:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[sglang-fl %(levelname)s] %(message)s"))
    root.addHandler(handler)
    root.propagate = False
    _configured = True
