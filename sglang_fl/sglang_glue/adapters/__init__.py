"""One adapter per supported SGLang version, chosen once per process from the installed version.

Everything in sglang-fl that names an SGLang module, a private SGLang name or depends on an
SGLang signature asks the adapter (`get_adapter`) instead of importing SGLang by path. The rest
of the package (dispatch, Layer 1, the communicator's collectives) never names SGLang modules.

- `base.SGLangAdapter` declares what the glue needs and holds what every supported version
  shares; ``v0_5_11`` and ``v0_5_23`` hold each version's hook targets, layer-class paths,
  private helpers, native swaps and signature differences. Supporting a new SGLang release
  means writing one new module here and adding it to `ADAPTERS`.
- The choice reads the installed distribution's version (``importlib.metadata``) and never
  imports SGLang, so it can run in the ``.pth`` hook before SGLang's first import.
- An installed version without an adapter stops start-up (`UnsupportedSGLangVersion`, naming
  the installed and the supported versions). ``SGLANG_FL_SGLANG_ADAPTER=<version>`` (Settings
  field ``sglang_adapter``) tries that version's adapter anyway, with a warning in every process.
"""

from __future__ import annotations

import functools
import importlib
from importlib.metadata import PackageNotFoundError, version

from sglang_fl.sglang_glue.versions import ADAPTER_MODULES as ADAPTERS
from sglang_fl.sglang_glue.versions import SUPPORTED_VERSIONS

__all__ = ["ADAPTERS", "SUPPORTED_VERSIONS", "UnsupportedSGLangVersion", "get_adapter",
           "installed_sglang_version", "reset_adapter", "select_version"]


class UnsupportedSGLangVersion(RuntimeError):
    """The installed SGLang has no adapter (and no override was given)."""


def installed_sglang_version() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _release(v: str) -> str:
    """``0.5.11.post1`` / ``0.5.11rc0`` -> ``0.5.11``: patch releases share an adapter."""
    import re

    m = re.match(r"^(\d+\.\d+\.\d+)", v)
    return m.group(1) if m else v


def select_version(installed: str | None, override: str | None) -> tuple[str, str | None]:
    """(adapter version, warning or None) for ``installed`` SGLang and the user's override."""
    supported = ", ".join(SUPPORTED_VERSIONS)
    if override:
        if override not in ADAPTERS:
            raise UnsupportedSGLangVersion(
                f"SGLANG_FL_SGLANG_ADAPTER={override!r} names no adapter; supported: {supported}")
        if installed is not None and _release(installed) == override:
            return override, None
        return override, (
            f"SGLANG_FL_SGLANG_ADAPTER={override}: using the SGLang {override} adapter with "
            f"SGLang {installed or '(not installed)'} installed; this combination is untested "
            f"(supported: {supported})")
    if installed is None:
        raise UnsupportedSGLangVersion(f"SGLang is not installed; sglang-fl supports {supported}")
    release = _release(installed)
    if release not in ADAPTERS:
        raise UnsupportedSGLangVersion(
            f"SGLang {installed} is installed, but sglang-fl supports SGLang {supported} only. "
            f"Install a supported version, or set SGLANG_FL_SGLANG_ADAPTER=<one of {supported}> "
            "to try that version's adapter anyway (untested, logged as a warning)")
    return release, None


@functools.cache
def get_adapter():
    """The adapter of the installed SGLang, built once per process."""
    from sglang_fl.config import SettingsError, get_settings
    from sglang_fl.logging_setup import get_logger

    try:
        override = get_settings().sglang_adapter
    except SettingsError:  # reported by load_plugin with its message
        override = None
    chosen, warning = select_version(installed_sglang_version(), override)
    if warning:
        get_logger("sglang_glue").warning("%s", warning)
    module = importlib.import_module(f"{__name__}.{ADAPTERS[chosen]}")
    return module.ADAPTER


def reset_adapter() -> None:
    """Forget the chosen adapter (tests)."""
    get_adapter.cache_clear()
