"""Install ``sglang_fl_compat.pth`` next to the package: the earliest hook of empty mode.

Everything else about the package is in pyproject.toml. A ``.pth`` file in site-packages runs in
every interpreter of the environment, including the processes SGLang spawns, before SGLang's
module-level imports -- see sglang_fl/compat/bootstrap.py and docs/empty-mode.md.
Both install kinds carry it: ``pip install .`` (the wheel holds it at its root, via build_py)
and ``pip install -e .`` (the editable wheel gets it added, via editable_wheel).
"""

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_NAME = "sglang_fl_compat.pth"
PTH_LINE = "import sglang_fl.compat.bootstrap; sglang_fl.compat.bootstrap.install()\n"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            target = f"{self.build_lib}/{PTH_NAME}"
            with open(target, "w", encoding="utf-8") as fh:
                fh.write(PTH_LINE)
            self._pth_outputs = [target]

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + list(getattr(self, "_pth_outputs", []))


cmdclass = {"build_py": BuildPyWithPth}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: "pip install -e" runs develop; see docs/empty-mode.md
    editable_wheel = None

if editable_wheel is not None and hasattr(editable_wheel, "_select_strategy"):

    class _StrategyWithPth:
        """Wraps setuptools' editable strategy: same files, plus our .pth at the wheel root."""

        def __init__(self, inner):
            self._inner = inner

        def __call__(self, wheel, files, mapping):
            self._inner(wheel, files, mapping)
            wheel.writestr(PTH_NAME, PTH_LINE)

        def __enter__(self):
            self._inner.__enter__()
            return self

        def __exit__(self, *exc):
            return self._inner.__exit__(*exc)

    class EditableWheelWithPth(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _StrategyWithPth(super()._select_strategy(*args, **kwargs))

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(cmdclass=cmdclass)
