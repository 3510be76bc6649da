"""Tools that read a checkpoint's config.json find the language model's settings of multimodal
checkpoints under ``text_config`` (Qwen3.5/3.6): e2e_bench's vocabulary, tune's shapes and the
hybrid-model server defaults, on the tiny Qwen3.5 preset sglang-fl writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    from sglang_fl.models import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("m") / "qwen3.5", preset="qwen3.5")
    cfg = json.loads((path / "config.json").read_text())
    assert "vocab_size" not in cfg and "vocab_size" in cfg["text_config"], \
        "the preset no longer nests its settings: this test would prove nothing"
    return path, cfg["text_config"]


def test_e2e_bench_reads_the_vocabulary_under_text_config(qwen35):
    import e2e_bench

    path, text = qwen35
    assert e2e_bench.model_vocab(path) == text["vocab_size"]


def test_a_config_without_vocab_size_is_a_clear_error(tmp_path):
    import e2e_bench

    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 8}}))
    with pytest.raises(SystemExit, match="no integer vocab_size"):
        e2e_bench.model_vocab(tmp_path)


def test_tune_and_server_defaults_read_the_text_settings(qwen35):
    from sglang_fl.sglang_glue.server_defaults import model_is_hybrid
    from sglang_fl.tune import ModelShapes

    path, text = qwen35
    shapes = ModelShapes.from_model(path)
    assert shapes.hidden == text["hidden_size"]
    assert shapes.linear_value_heads == text["linear_num_value_heads"]
    assert model_is_hybrid(path) is True
