"""Fixtures of the GPU suite: the backends under test (helpers live in gpu_support.py).

Every module here skips itself at import when no CUDA device is present (CI has none).
"""

from __future__ import annotations

import pytest
from gpu_support import sglang_ready


def pytest_addoption(parser):
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="run the exhaustive GPU grids too (tests marked exhaustive)")


def pytest_collection_modifyitems(config, items):
    """Without --exhaustive, the grid points marked ``exhaustive`` are deselected: the default
    suite covers every op x backend x dtype on representative shapes and fits one device call."""
    if config.getoption("--exhaustive"):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker("exhaustive") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def reference():
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    return ReferenceBackend()


@pytest.fixture(scope="session")
def flaggems():
    """The FlagGems backend itself, so a test can never fall back silently to another one."""
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend

    backend = FlagGemsBackend()
    assert backend.available(), f"FlagGems must run on this GPU: {backend.unavailable_reason}"
    return backend


@pytest.fixture(scope="session")
def cuda_vendor():
    """SGLang's own CUDA kernels (sgl_kernel, sglang.jit_kernel); skipped where not installed."""
    sglang_ready()
    from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend

    backend = CudaBackend()
    if not backend.available():
        pytest.skip(f"vendor.cuda unavailable: {backend.unavailable_reason}")
    return backend


@pytest.fixture(params=["flagos", "vendor.cuda"])
def backend(request):
    """Each non-reference backend in turn."""
    return request.getfixturevalue("flaggems" if request.param == "flagos" else "cuda_vendor")
