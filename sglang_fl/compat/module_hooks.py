"""Run code around the execution of specific SGLang modules, without touching SGLang's files.

`ModuleHookFinder` sits first on ``sys.meta_path`` but answers only for the module names that
have hooks; it finds the real spec through the other finders and wraps its loader so that
``before(name)`` runs just before the module body and ``after(module)`` right after it, when the
body ran to its end (a body that raises keeps its own error). Used by the native swaps, the
SGLang fixes and the scoped torchvision stand-in.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable

_before: dict[str, list[Callable[[str], None]]] = {}
_after: dict[str, list[Callable[[object], None]]] = {}


class _HookedLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        name = module.__name__
        for fn in _before.get(name, ()):
            fn(name)
        # After-hooks run on a module that executed: one that raised (an import inside it
        # failed) is left to raise its own error, which a hook checking for the module's
        # contents would otherwise replace (seen on the H200: "fix grammar_mask_device: ...
        # apply_vocab_mask no longer exists" hid xgrammar's own import error).
        self._loader.exec_module(module)
        for fn in _after.get(name, ()):
            fn(module)

    def __getattr__(self, name):  # get_source, is_package ... for tracebacks and inspect
        return getattr(self._loader, name)


class ModuleHookFinder:
    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _before and fullname not in _after:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader)
        return spec


def add_hook(module: str, *, before: Callable[[str], None] | None = None,
             after: Callable[[object], None] | None = None) -> None:
    """Register hooks for ``module``; if it is already imported, ``after`` runs now."""
    if before is not None:
        _before.setdefault(module, []).append(before)
    if after is not None:
        _after.setdefault(module, []).append(after)
        if module in sys.modules:
            after(sys.modules[module])
    if not any(isinstance(f, ModuleHookFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ModuleHookFinder())
