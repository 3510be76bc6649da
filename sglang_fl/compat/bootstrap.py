"""The earliest hook: run by ``sglang_fl_compat.pth`` at interpreter start-up.

SGLang imports ``sgl_kernel``, ``flashinfer`` and ``torchvision.io`` at module level, long
before it calls ``load_plugins()``; SGLang's own plugin hooks therefore come too late to make
an "empty" install importable. A ``.pth`` file in site-packages is executed by ``site`` in every
interpreter of the environment -- the main process, and every scheduler, detokenizer and TP
worker SGLang spawns -- before any user code. That is our hook.

Because the ``.pth`` runs in *every* Python process of the environment (pip, pytest, ...), this
module does almost nothing: it installs a watcher on ``sys.meta_path`` that waits for the first
``import sglang`` and only then activates `sglang_fl.compat` (which may import torch). Processes
that never import SGLang pay one string comparison per import. Nothing happens when
``SGLANG_PLUGINS`` is set and does not name ``sglang_fl`` (SGLang's own plugin filter, e.g.
``__none__``): a user who switched the plugin off gets native SGLang.
"""

from __future__ import annotations

import os
import sys

PLUGIN_NAME = "sglang_fl"


def plugin_enabled() -> bool:
    """SGLang's rule: an unset/empty ``SGLANG_PLUGINS`` loads all plugins, else only those named."""
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    if not allowed.strip():
        return True
    return PLUGIN_NAME in {x.strip() for x in allowed.split(",")}


class _SGLangImportWatcher:
    """Meta-path entry that activates compat when ``sglang`` is first imported, then leaves."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "sglang":
            return None
        uninstall()
        from sglang_fl.compat import activate

        activate()
        return None  # the normal finders import SGLang itself


_WATCHER = _SGLangImportWatcher()


def install() -> None:
    """Called by the ``.pth`` line. Cheap, idempotent, and a no-op when the plugin is off."""
    if not plugin_enabled() or _WATCHER in sys.meta_path:
        return
    if "sglang" in sys.modules:  # imported before us (unusual): activate right away
        from sglang_fl.compat import activate

        activate()
        return
    sys.meta_path.insert(0, _WATCHER)


def uninstall() -> None:
    try:
        sys.meta_path.remove(_WATCHER)
    except ValueError:
        pass
