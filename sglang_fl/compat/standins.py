"""Import stand-ins for CUDA-only packages that are not installed.

A stand-in module imports, and hands out a `Standin` for any attribute. A `Standin` is
callable and usable as a base class or a namespace, so SGLang's module-level
``from sgl_kernel import rmsnorm`` / ``from flashinfer import sampling`` /
``class X(flashinfer.Wrapper)`` succeed. Calling one (or instantiating a class derived from
one) never returns a value: it raises `StandinCalledError` naming the function, the package and
what routes around it, and records the call (``standin_calls()`` in-process, and a
``[SGLANG-FL-STANDIN-CALL]`` line on stderr that a server log captures) so a test can prove a
served run never reached one.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
from collections import Counter
from types import ModuleType

STANDIN_MARKER = "__sglang_fl_standin__"  # same value as sglang_fl.dispatch.backends.STANDIN_MARKER
CALL_LOG_PREFIX = "[SGLANG-FL-STANDIN-CALL]"
STANDIN_VERSION = "0.0.0+sglangfl.standin"

# What routes around a missing function: longest matching prefix of "package.name" wins.
_ROUTES: dict[str, str] = {
    "sgl_kernel": "no sglang-fl op covers it; install sglang-kernel or pick SGLang options that do not use it",
    "sgl_kernel.rmsnorm": "op rms_norm: keep RMSNorm routed (SGLANG_FL_OOT_ENABLED=1, RMSNorm not in SGLANG_FL_OOT_BLACKLIST)",
    "sgl_kernel.fused_add_rmsnorm": "op rms_norm: keep RMSNorm routed (SGLANG_FL_OOT_ENABLED=1, RMSNorm not in SGLANG_FL_OOT_BLACKLIST)",
    "sgl_kernel.gemma": "op gemma_rms_norm: keep GemmaRMSNorm routed (SGLANG_FL_OOT_ENABLED=1, not in SGLANG_FL_OOT_BLACKLIST)",
    "sgl_kernel.silu_and_mul": "op silu_and_mul: keep SiluAndMul routed (SGLANG_FL_OOT_ENABLED=1, not in SGLANG_FL_OOT_BLACKLIST)",
    "sgl_kernel.apply_rope": "op rotary_embedding: keep RotaryEmbedding routed (SGLANG_FL_OOT_ENABLED=1, not in SGLANG_FL_OOT_BLACKLIST)",
    "sgl_kernel.rotary": "op rotary_embedding: keep RotaryEmbedding routed (SGLANG_FL_OOT_ENABLED=1, not in SGLANG_FL_OOT_BLACKLIST)",
    "sgl_kernel.kvcacheio": "the hierarchical KV cache needs the real sgl_kernel; leave --enable-hierarchical-cache off",
    "flashinfer": "pick non-flashinfer SGLang backends (--attention-backend triton|torch_native, --sampling-backend pytorch); sglang-fl sets SGLANG_IS_FLASHINFER_AVAILABLE=false",
    "tvm_ffi": "SGLang's JIT CUDA kernels (sglang.jit_kernel) need apache-tvm-ffi; sglang-fl routes SiluAndMul/RotaryEmbedding and swaps clamp_position/_resolve_future_token_ids, other JIT kernels need the package",
    "torchvision": "image/video inputs need a torchvision build that matches the installed torch",
}

_calls: Counter[str] = Counter()
_lock = threading.Lock()


class StandinCalledError(RuntimeError, ValueError):
    """A stand-in for an absent CUDA-only package was called: the run needs the real package.
    Also a ValueError: SGLang's HTTP handlers answer a request whose input needs it (an image
    without torchvision) with a 400 carrying this message instead of a bare 500."""


def route_hint(qualname: str) -> str:
    parts = qualname.split(".")
    for n in range(len(parts), 0, -1):
        hint = _ROUTES.get(".".join(parts[:n]))
        if hint:
            return hint
    for prefix, hint in _ROUTES.items():  # e.g. "sgl_kernel.rmsnorm_xyz" -> "sgl_kernel.rmsnorm"
        if "." in prefix and qualname.startswith(prefix):
            return hint
    return "install the real package"


def record_call(qualname: str) -> None:
    from sglang_fl.metrics import record_standin_call  # here: this module stays cheap to import

    with _lock:
        _calls[qualname] += 1
    record_standin_call(qualname)
    try:
        sys.stderr.write(f"{CALL_LOG_PREFIX} {qualname}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # closed stderr in a daemon: the counter still has it
        pass


def standin_calls() -> dict[str, int]:
    """Stand-in calls made in this process so far, by qualified name."""
    with _lock:
        return dict(_calls)


def _error(qualname: str) -> StandinCalledError:
    package = qualname.partition(".")[0]
    return StandinCalledError(
        f"{qualname} was called, but {package} is not installed: sglang-fl only provides an "
        f"import stand-in for it so SGLang can import (empty mode). Route around it: "
        f"{route_hint(qualname)}."
    )


class Standin:
    """A missing function, class or namespace of an absent package."""

    def __init__(self, qualname: str):
        object.__setattr__(self, "_qualname", qualname)
        object.__setattr__(self, STANDIN_MARKER, True)

    def __call__(self, *args, **kwargs):
        record_call(self._qualname)
        raise _error(self._qualname)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = Standin(f"{self._qualname}.{name}")
        object.__setattr__(self, name, child)
        return child

    def __mro_entries__(self, bases):
        """``class X(standin)``: X imports; instantiating it raises like a call."""
        qualname = self._qualname

        def __init__(obj, *args, **kwargs):
            record_call(qualname)
            raise _error(qualname)

        cls = type(qualname.rpartition(".")[2], (), {"__init__": __init__, STANDIN_MARKER: True,
                                                     "__module__": qualname.rpartition(".")[0]})
        return (cls,)

    def __or__(self, other):
        """``Standin | X`` in a type annotation evaluated at class creation (transformers 5.19's
        video processors annotate ``PILImageResampling | InterpolationMode``): the stand-in
        stands for the union, which nothing calls."""
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<sglang-fl stand-in {self._qualname}>"


class StandinModule(ModuleType):
    """A stand-in package: every attribute is a `Standin`, submodules are stand-in modules."""

    def __init__(self, name: str, namespace_only: bool = False):
        self._namespace_only = namespace_only  # first: __getattr__ reads it
        super().__init__(name, f"sglang-fl import stand-in for the absent package {name.partition('.')[0]}")
        setattr(self, STANDIN_MARKER, True)
        self.__path__ = []  # a package, so "import pkg.sub" reaches StandinFinder
        if "." not in name:
            # A version older than any release: transformers 5.19 parses torchvision's
            # ``__version__`` once it finds the package (``is_torchvision_greater_or_equal``).
            self.__version__ = STANDIN_VERSION

    def __getattr__(self, name: str):
        if self._namespace_only or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"stand-in module {self.__name__!r} has no attribute {name!r}")
        child = Standin(f"{self.__name__}.{name}")
        setattr(self, name, child)
        return child


class StandinFinder:
    """Last entry of ``sys.meta_path``: serves stand-ins for the absent packages it was given.

    ``packages`` maps a top-level name to the submodules served under it (``None``: any). A
    package limited to some submodules is a bare namespace: only those submodules exist, so
    e.g. ``import torchvision.transforms`` still fails the way it would without torchvision.
    ``on_exec`` maps a module name to a function run once the stand-in module exists.
    """

    def __init__(self, packages: dict[str, frozenset[str] | None], on_exec=None):
        self.packages = dict(packages)
        self.on_exec = dict(on_exec or {})

    def covers(self, fullname: str) -> bool:
        top, _, rest = fullname.partition(".")
        if top not in self.packages:
            return False
        allowed = self.packages[top]
        return allowed is None or not rest or rest.partition(".")[0] in allowed

    def find_spec(self, fullname, path=None, target=None):
        if not self.covers(fullname):
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, origin="sglang-fl stand-in", is_package=True
        )

    def create_module(self, spec):
        top, _, rest = spec.name.partition(".")
        return StandinModule(spec.name, namespace_only=not rest and self.packages[top] is not None)

    def exec_module(self, module):
        hook = self.on_exec.get(module.__name__)
        if hook is not None:
            hook(module)
