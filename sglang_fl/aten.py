"""Layer 1: FlagGems replaces PyTorch ATen ops (``flag_gems.enable`` / ``only_enable``).

Driven by Settings: ``USE_FLAGGEMS``, ``SGLANG_FL_FLAGOS_WHITELIST`` (-> only_enable) or the
blacklist (env or platform/user YAML ``flagos_blacklist`` -> enable(unused=...)), and the ATen log
(``SGLANG_FLAGGEMS_RECORD``/``_LOG_PATH``/``_LOG_ONCE``). Where FlagGems cannot run (no Triton
device, e.g. this CPU) Layer 1 reports itself disabled with the reason instead of failing.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from sglang_fl.config import Settings
from sglang_fl.logging_setup import get_logger

logger = get_logger("aten")

_LAYER2_FLAGGEMS_FILE = "sglang_fl/dispatch/backends/flaggems.py"


@dataclass(frozen=True)
class Layer1Status:
    enabled: bool
    reason: str
    mode: str = ""  # "enable" | "only_enable"
    ops: tuple[str, ...] = ()  # the whitelist or the blacklist, per mode


_status: Layer1Status | None = None


def layer1_status() -> Layer1Status | None:
    return _status


class Layer1RecordFilter(logging.Filter):
    """Keep ATen-log records of Layer-1 calls only: FlagGems ``ops`` modules, not reached from a
    Layer-2 flagos impl (those show in the dispatch log instead). Runs only while recording."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("flag_gems.ops"):
            return False
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.replace("\\", "/").endswith(_LAYER2_FLAGGEMS_FILE):
                return False
            frame = frame.f_back
        return True


def enable_layer1(settings: Settings) -> Layer1Status:
    """Turn Layer 1 on as configured (once per process) and return what happened."""
    global _status
    if _status is not None:
        return _status
    _status = _enable(settings)
    logger.info("Layer 1 (FlagGems ATen): %s", "enabled, " + _status.reason if _status.enabled
                else "disabled: " + _status.reason)
    return _status


def layer1_plan(settings: Settings) -> Layer1Status:
    """What `enable_layer1` does here, without doing it (``sglang-fl doctor`` shows it)."""
    if not settings.use_flaggems:
        return Layer1Status(False, f"USE_FLAGGEMS=0 ({settings.origins.get('use_flaggems')})")
    try:
        import flag_gems  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - FlagGems raises RuntimeError without a device
        return Layer1Status(False, f"flag_gems cannot run here: {type(exc).__name__}: {' '.join(str(exc).split())}")
    if settings.flagos_whitelist:
        return Layer1Status(True, f"only {len(settings.flagos_whitelist)} whitelisted ops",
                            "only_enable", settings.flagos_whitelist)
    return Layer1Status(True, f"all ops except {list(settings.flagos_blacklist)}",
                        "enable", settings.flagos_blacklist)


def _enable(settings: Settings) -> Layer1Status:
    status = layer1_plan(settings)
    if not status.enabled:
        return status
    import flag_gems

    log = dict(record=settings.flaggems_record, once=settings.flaggems_log_once,
               path=settings.flaggems_log_path)
    if status.mode == "only_enable":
        flag_gems.only_enable(include=list(status.ops), **log)
    else:
        flag_gems.enable(unused=list(status.ops), **log)
    if settings.flaggems_record:
        for handler in logging.getLogger("flag_gems").handlers:
            if getattr(handler, "_flaggems_owned", False):
                handler.addFilter(Layer1RecordFilter())
    return status
