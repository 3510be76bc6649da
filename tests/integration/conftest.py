"""In-process integration tests against real SGLang layers.

The plugin is loaded once per pytest process through SGLang's own ``load_plugins()`` with the
reference backend pinned (strict), so a numerics test can never pass through a silent fallback.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

PINNED_ENV = {
    "SGLANG_FL_PLATFORM": "cpu",
    "SGLANG_FL_PREFER": "reference",
    "SGLANG_FL_STRICT": "1",
    # The attention-backend tests use the template's example backend, which is opt-in.
    "SGLANG_FL_ENABLE_VENDORS": "template",
}


@pytest.fixture(scope="session")
def sglang_with_plugin():
    """SGLang with sglang-fl's hooks applied in this process (reference backend, strict)."""
    for k, v in PINNED_ENV.items():
        os.environ[k] = v
    from sglang_fl.config import reset_settings
    from sglang_fl.dispatch import reset_manager

    reset_settings()
    reset_manager()
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    load_plugins()
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))
    from sglang_fl.config import get_settings

    settings = get_settings()
    assert settings.strict and settings.prefer == "reference"
    return settings


def run_python(code: str, env: dict | None = None, timeout: int = 240) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (real entry-point loading, no state from pytest)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True,
                          text=True, timeout=timeout)


@contextlib.contextmanager
def interpreted_kernel(launcher, kernel_module: str, kernel_name: str):
    """``launcher._kernel()`` returning ``kernel_module.kernel_name`` run by Triton's interpreter
    on this CPU (``TRITON_INTERPRET=1``: each program's block operations in numpy): the kernel
    module is imported afresh with the variable set (Triton reads it when ``@triton.jit`` runs),
    and the previous module is put back afterwards."""
    import importlib

    # ``from package import module`` finds the package's attribute before sys.modules: both
    # are put back, or a later `_kernel()` (the compile tests') gets the interpreted module.
    parent_name, _, child = kernel_module.rpartition(".")
    parent = importlib.import_module(parent_name)
    saved = sys.modules.pop(kernel_module, None)
    saved_attr = parent.__dict__.get(child)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRITON_INTERPRET", "1")
            module = importlib.import_module(kernel_module)
            mp.setattr(launcher, "_kernel", lambda: getattr(module, kernel_name))
            yield launcher
    finally:
        sys.modules.pop(kernel_module, None)
        if saved is not None:
            sys.modules[kernel_module] = saved
        if saved_attr is not None:
            setattr(parent, child, saved_attr)
        else:
            parent.__dict__.pop(child, None)


def interpreted_fixture(launcher_module: str, kernel_name: str):
    """A module-scoped fixture: the launcher ``launcher_module`` (``sglang_fl.kernels.rope``)
    running ``kernel_name`` from its Triton source (``<launcher_module>_triton``) through
    Triton's interpreter (`interpreted_kernel`). Assign it in a test module:
    ``interpreted = interpreted_fixture("sglang_fl.kernels.rope", "rope_inplace_kernel")``."""
    import importlib

    @pytest.fixture(scope="module")
    def interpreted():
        launcher = importlib.import_module(launcher_module)
        with interpreted_kernel(launcher, f"{launcher_module}_triton", kernel_name) as ready:
            yield ready

    return interpreted
