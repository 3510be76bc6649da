"""sglang-fl: run SGLang's unchanged launch command on many AI chips.

This module holds only the two entry points SGLang calls (declared in pyproject.toml):

- ``load_plugin`` (group ``sglang.srt.plugins``): installs the Layer 1/2/3 hooks in every SGLang
  process that runs ``load_plugins()``.
- ``activate_platform`` (group ``sglang.srt.platforms``): hands SGLang our `PlatformFL`.

Everything else lives in the layer packages: ``config``, ``aten`` (Layer 1), ``dispatch`` and
``sglang_glue`` (Layer 2), ``distributed`` (Layer 3), ``platform``, ``compat``.
"""

from __future__ import annotations

__version__ = "0.1.0"


def load_plugin() -> None:
    from sglang_fl.plugin import install

    install()


def activate_platform() -> str | None:
    from sglang_fl.platform import platform_qualname

    return platform_qualname()
