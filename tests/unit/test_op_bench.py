"""benchmarks/op_bench.py's options and table (the timings themselves need a GPU:
benchmarks/gpu_session.sh ops, prefillprofile)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import op_bench  # noqa: E402


def _tokens(**kw):
    return op_bench.parse_tokens(argparse.ArgumentParser(),
                                 argparse.Namespace(**{"tokens": None, "quick": False, **kw}))


def test_token_counts_come_from_tokens_quick_or_the_default():
    assert _tokens(tokens="512,2048,4096,16384") == (512, 2048, 4096, 16384)
    assert _tokens(quick=True) == op_bench.QUICK_TOKENS and _tokens() == op_bench.DEFAULT_TOKENS
    cases = list(op_bench._cases((512, 16384)))
    assert {p["tokens"] for op, p in cases if op == "silu_and_mul"} == {512, 16384}
    gdn = list(op_bench._cases((64, 2048, 4096)))  # decode ops stop at tune's cap on sequences
    assert {p["tokens"] for op, p in gdn if op == "packed_recurrent_gated_delta_rule"} == {64}
    assert {p["tokens"] for op, p in gdn if op == "chunk_gated_delta_rule"} == {64, 2048}


@pytest.mark.parametrize("argv", [["--tokens", "0"], ["--tokens", "512,x"], ["--tokens", ""],
                                  ["--tokens", "512", "--quick"]])
def test_bad_token_lists_stop_before_any_backend_loads(argv, capsys):
    with pytest.raises(SystemExit):
        op_bench.main(argv)
    assert "--tokens" in capsys.readouterr().err


def test_table_shows_what_eager_pays_over_the_graph():
    def cell(graph, eager):
        stat = lambda v: {"median": v, "min": v, "max": v}  # noqa: E731
        return {"graph_us": stat(graph), "eager_us": stat(eager),
                "eager_minus_graph_us": eager - graph}

    doc = {"results": [{"op": "rms_norm", "tokens": 512, "hidden": 896, "dtype": "bfloat16",
                        "flagos": cell(2.0, 54.0), "vendor.cuda": cell(1.5, 9.5)}]}
    head, _, row = op_bench.table(doc).splitlines()
    assert "flagos eager-graph" in head and "vendor.cuda eager-graph" in head
    assert row.split(" | ")[-3:] == ["52.0", "8.0", "0.75x |"]


HYBRID_27B = {"hidden_size": 5120, "num_attention_heads": 24, "num_key_value_heads": 4,
              "head_dim": 256, "intermediate_size": 17408, "partial_rotary_factor": 0.25,
              "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6}
MOE = {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
       "intermediate_size": 6144, "num_experts": 128, "num_experts_per_tok": 8,
       "moe_intermediate_size": 768, "shared_expert_intermediate_size": 0}
GDN_PREFILL = ("gdn_gating", "chunk_gated_delta_rule", "causal_conv1d", "rms_norm_gated")


def _shapes(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return op_bench.ModelShapes.from_model(tmp_path)


def _tokens_of(cases):
    out = {}
    for name, _op, _variant, params in cases:
        out.setdefault(name, set()).add(params["tokens"])
    return out


def test_a_models_cases_are_the_ops_it_uses_at_its_shapes(tmp_path):
    hybrid = _shapes(tmp_path, HYBRID_27B)
    cases = list(op_bench.model_cases(hybrid, (64, 2048, 8192), ["flagos", "vendor.cuda"]))
    got = _tokens_of(cases)
    assert {"rms_norm", "fused_add_rms_norm", "gemma_rms_norm", "fused_add_gemma_rms_norm",
            "silu_and_mul", "rotary_embedding", *op_bench.GDN} == set(got)
    assert ("fused_add_gemma_rms_norm", "gemma_rms_norm", 1, {"tokens": 8192}) in cases
    assert got["packed_recurrent_gated_delta_rule"] == {64}  # decode ops: tune's sequence cap
    assert got["chunk_gated_delta_rule"] == got["silu_and_mul"] == {64, 2048, 8192}
    # the slow reference among the backends: GDN prefill ops stop at 2,048 as the built-in list
    slow = _tokens_of(op_bench.model_cases(hybrid, (64, 2048, 8192), ["flagos", "reference"]))
    assert all(slow[op] == {64, 2048} for op in GDN_PREFILL)
    assert slow["rms_norm"] == {64, 2048, 8192}

    moe = _tokens_of(op_bench.model_cases(_shapes(tmp_path, MOE), (256,), ["flagos"]))
    assert {"topk", "fused_moe", "silu_and_mul", "fused_add_rms_norm"} <= set(moe)
    assert not set(op_bench.GDN) & set(moe)


def test_model_ops_agree_with_what_build_case_builds(tmp_path):
    torch = pytest.importorskip("torch")
    tiny = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "intermediate_size": 32, "max_position_embeddings": 64}
    gdn = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
           "linear_value_head_dim": 8, "partial_rotary_factor": 0.5}
    experts = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8}
    mrope = {"rope_parameters": {"mrope_section": [1, 1, 0]}}
    for extra in ({}, gdn, experts, {**gdn, **experts, **mrope}):
        shapes = _shapes(tmp_path, {**tiny, **extra})
        used, unused = op_bench.model_ops(shapes)
        for op in op_bench.TUNABLE:
            case = op_bench.build_case(op, shapes, 3, torch.float32, "cpu")
            assert (case is not None) == (op in used) != (op in unused), (op, extra)
            if case is not None:
                assert len(case.variants) == len(op_bench.variant_names(op)), op


@pytest.mark.parametrize("model", ["missing", "empty"])
def test_a_bad_model_stops_before_any_backend_loads(model, tmp_path, monkeypatch, capsys):
    (tmp_path / "empty").mkdir()

    def load_backends(names):
        raise AssertionError("backends loaded for a bad --model")

    monkeypatch.setattr(op_bench, "load_backends", load_backends)
    with pytest.raises(SystemExit):
        op_bench.main(["--model", str(tmp_path / model), "--backends", "flagos"])
    assert "--model" in capsys.readouterr().err


def test_model_rows_name_the_case_and_the_table_heads_with_the_shapes():
    stat = {"median": 3.0, "min": 3.0, "max": 3.0}
    row = {"op": "fused_add_gemma_rms_norm", "tokens": 2048, "variant": 1, "dtype": "bfloat16",
           "flagos": {"graph_us": stat, "eager_us": stat, "eager_minus_graph_us": 0.0}}
    assert op_bench._shape(row) == "tokens=2048"
    assert op_bench._row_text(row, ["flagos"]).startswith("fused_add_gemma_rms_norm tokens=2048")
    doc = {"settings": {"model": {"path": "/m", "shapes": "hidden 5120"}}, "results": [row]}
    lines = op_bench.table(doc).splitlines()
    assert lines[0] == "Shapes of /m: hidden 5120" and lines[-1].startswith(
        "| fused_add_gemma_rms_norm | tokens=2048 | 3.00")


@pytest.mark.parametrize("model", [False, True])
def test_an_unknown_op_name_stops_naming_the_accepted_ones(model, tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text(json.dumps(HYBRID_27B))

    def load_backends(names):
        raise AssertionError("backends loaded for a bad --ops")

    monkeypatch.setattr(op_bench, "load_backends", load_backends)
    argv = ["--ops", "rms_norm,rms_nrom", "--backends", "flagos"]
    with pytest.raises(SystemExit):
        op_bench.main(argv + (["--model", str(tmp_path)] if model else []))
    err = capsys.readouterr().err
    assert "--ops: rms_nrom not known; accepted: " in err and "fused_add_rms_norm" in err
    assert ("fused_add_gemma_rms_norm" in err) == model
