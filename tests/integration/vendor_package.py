"""Write a vendor backend as its own installed distribution (package + dist-info with an entry
point in the ``sglang_fl.vendors`` group, the layout pip produces) under a folder that a test
puts on PYTHONPATH: how the vendor-package tests reach discovery through real entry points."""

from __future__ import annotations

import textwrap
from pathlib import Path

REGISTER_OPS = '''
{imports}from sglang_fl.dispatch.backends import Backend, register_backend

class {cls}(Backend):
    name = "{name}"

    def is_available(self):
        return True
{methods}
BACKEND = {cls}()

def register_builtins(registry):
    register_backend(registry, BACKEND)
'''


def write_vendor_package(root: Path, name: str, methods: str, imports: str = "") -> Path:
    """``<name>_fl_vendor`` under ``root`` with a Backend named ``name`` whose op methods are
    ``methods`` (class-body source, indented by 4); returns ``root``."""
    package = f"{name}_fl_vendor"
    pkg = root / package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "register_ops.py").write_text(REGISTER_OPS.format(
        imports=imports, cls=f"{name.capitalize()}Backend", name=name,
        methods=textwrap.indent(textwrap.dedent(methods), "    ")))
    dist = root / f"{package}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}-fl-vendor\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[sglang_fl.vendors]\n{name} = {package}.register_ops\n")
    return root
