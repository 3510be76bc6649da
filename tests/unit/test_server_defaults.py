"""Which models get the CPU server defaults for hybrid (recurrent-state) models: read from the
model's config.json, so a dense model keeps SGLang's own scheduling."""

from __future__ import annotations

import json

import pytest

from sglang_fl.sglang_glue.server_defaults import model_is_hybrid


@pytest.mark.parametrize("config, hybrid", [
    ({"model_type": "qwen2", "hidden_size": 64}, False),
    ({"model_type": "gemma3", "layer_types": ["sliding_attention", "full_attention"]}, False),
    ({"model_type": "qwen3_5", "text_config": {
        "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 16}}, True),
    ({"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}, True),
    ({"model_type": "nemotron_h", "hybrid_override_pattern": "M-M*"}, True),
    ({"model_type": "falcon_h1", "mamba_d_state": 128}, True),
    ({"model_type": "jamba", "attn_layer_period": 8}, True),
])
def test_hybrid_models_are_told_from_their_config(tmp_path, config, hybrid):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert model_is_hybrid(tmp_path) is hybrid


def test_a_config_not_readable_here_is_unknown(tmp_path):
    assert model_is_hybrid("Qwen/Qwen3.6-27B") is None  # a hub name
    (tmp_path / "config.json").write_text("{not json")
    assert model_is_hybrid(tmp_path) is None
    (tmp_path / "config.json").write_text("[1, 2]")
    assert model_is_hybrid(tmp_path) is None
