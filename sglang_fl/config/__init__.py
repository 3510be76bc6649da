"""Configuration: the process-wide `Settings`, built once, and the bundled YAML files."""

from __future__ import annotations

import threading

from sglang_fl.config.settings import (
    BACKEND_KINDS,
    CONFIG_DIR,
    FIELDS,
    OP_NAMES,
    ROUTED_CLASSES,
    Settings,
    SettingsError,
    build_settings,
)

# Public name kept from the product description: `_CONFIG_DIR / 'sample.yaml'`.
_CONFIG_DIR = CONFIG_DIR

_lock = threading.Lock()
_settings: Settings | None = None


def get_settings() -> Settings:
    """The process's Settings; built (and validated) on first use, then reused."""
    global _settings
    if _settings is None:
        with _lock:
            if _settings is None:
                from sglang_fl.devices import detect_platform

                _settings = build_settings(detect_platform=detect_platform)
    return _settings


def reset_settings() -> None:
    """Forget the cached Settings (tests, or a CLI that changed the environment)."""
    global _settings
    with _lock:
        _settings = None


__all__ = [
    "BACKEND_KINDS", "CONFIG_DIR", "FIELDS", "OP_NAMES", "ROUTED_CLASSES", "Settings",
    "SettingsError", "_CONFIG_DIR", "build_settings", "get_settings", "reset_settings",
]
