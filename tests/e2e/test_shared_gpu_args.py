"""How served tests share one GPU (`shared_gpu_args`): none beside no other worker, ``0.8 / N``
of the memory each beside N - 1 others, and the GPU verify's override
(``SGLANG_FL_TEST_MEM_FRACTION``, used where the GPU suite runs beside the servers) validated
with a message that names it."""

from __future__ import annotations

import pytest
from e2e_support import SHARED_GPU_MAX_MAMBA_CACHE_SIZE, shared_gpu_args


def _fraction(args):
    return float(args[args.index("--mem-fraction-static") + 1])


def test_one_worker_keeps_sglangs_own_memory_defaults(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "1")
    monkeypatch.setenv("SGLANG_FL_TEST_MEM_FRACTION", "0.3")
    assert shared_gpu_args() == ()


def test_workers_split_the_memory_and_cap_their_pools(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    monkeypatch.delenv("SGLANG_FL_TEST_MEM_FRACTION", raising=False)
    args = shared_gpu_args(hybrid=True)
    assert _fraction(args) == 0.2
    assert "--max-total-tokens" in args
    assert args[args.index("--max-mamba-cache-size") + 1] == str(SHARED_GPU_MAX_MAMBA_CACHE_SIZE)
    assert "--max-mamba-cache-size" not in shared_gpu_args()


def test_the_verify_override_sets_each_servers_fraction(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    monkeypatch.setenv("SGLANG_FL_TEST_MEM_FRACTION", "0.3")
    assert _fraction(shared_gpu_args()) == 0.3


@pytest.mark.parametrize("raw", ["0", "1", "1.5", "-0.1", "a third", ""])
def test_a_bad_override_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    monkeypatch.setenv("SGLANG_FL_TEST_MEM_FRACTION", raw)
    with pytest.raises(ValueError, match="SGLANG_FL_TEST_MEM_FRACTION=.*between 0 and 1"):
        shared_gpu_args()
