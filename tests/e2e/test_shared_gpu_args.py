"""How served tests share one GPU (`shared_gpu_args`): none beside no other worker, ``0.8 / N``
of the memory each beside N - 1 others, and the GPU verify's override
(``SGLANG_FL_TEST_MEM_FRACTION``, used where the GPU suite runs beside the servers) validated
with a message that names it; and the checkpoints the GPU verify writes ahead (`made_ahead`)."""

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


def test_made_ahead_waits_for_the_writer_then_reuses_its_checkpoint(tmp_path, monkeypatch):
    """With ``SGLANG_FL_TEST_MODELS`` set, a test's checkpoint comes from there once the writer
    (the GPU verify's `make_ahead`) has removed its ``.writing`` marker; a writer that never
    finishes is reported by name, not waited for without end."""
    import threading
    import time

    import e2e_support

    import sglang_fl.models as models

    made = []
    monkeypatch.setattr(models, "make_tiny_model",
                        lambda path, **options: made.append((path, options)) or path)
    monkeypatch.setenv("SGLANG_FL_TEST_MODELS", str(tmp_path))
    marker = tmp_path / e2e_support.WRITING
    marker.touch()
    threading.Timer(1.0, marker.unlink).start()
    start = time.monotonic()
    path = e2e_support.made_ahead("qwen3.6-27b-4l", tmp_path_factory=None)
    assert time.monotonic() - start >= 0.9 and path == tmp_path / "qwen3.6-27b-4l"
    assert made == [(path, {"preset": "qwen3.6-27b", "num_layers": 4, "vocab_size": 32768})]

    marker.touch()
    monkeypatch.setenv("SGLANG_FL_TEST_AHEAD_WAIT", "0.5")
    with pytest.raises(TimeoutError, match=r"\.writing still there after 0.5 s"):
        e2e_support.made_ahead("qwen3.6-27b-4l", tmp_path_factory=None)


def test_make_ahead_moves_whole_checkpoints_in_and_always_clears_its_marker(tmp_path, monkeypatch):
    """Each checkpoint is written beside its place and moved in whole; a leftover without a
    manifest (a killed writer's) is replaced, a whole one reused; `.writing` goes also when
    writing fails."""
    import e2e_support

    import sglang_fl.models as models
    from sglang_fl.models.tiny import MANIFEST

    seen = []

    def fake_make(path, **options):
        seen.append((path.name, (tmp_path / e2e_support.WRITING).exists()))
        path.mkdir(parents=True, exist_ok=True)
        (path / MANIFEST).write_text("{}")
        return path

    monkeypatch.setattr(models, "make_tiny_model", fake_make)
    leftover = tmp_path / "qwen3.6-27b-4l"
    leftover.mkdir()
    (leftover / "model.safetensors").write_text("half")
    e2e_support.make_ahead(str(tmp_path))
    assert seen == [("qwen3.6-27b-4l.partial", True), ("qwen3.6-27b-4l", True)]
    assert (leftover / MANIFEST).exists() and not (leftover / "model.safetensors").exists()
    assert not (tmp_path / "qwen3.6-27b-4l.partial").exists()
    assert not (tmp_path / e2e_support.WRITING).exists()

    seen.clear()
    e2e_support.make_ahead(str(tmp_path))  # whole: reused, not rewritten
    assert seen == [("qwen3.6-27b-4l", True)]

    def failing(path, **options):
        raise RuntimeError("disk full")

    monkeypatch.setattr(models, "make_tiny_model", failing)
    (leftover / MANIFEST).unlink()
    with pytest.raises(RuntimeError, match="disk full"):
        e2e_support.make_ahead(str(tmp_path))
    assert not (tmp_path / e2e_support.WRITING).exists()
