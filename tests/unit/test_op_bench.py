"""benchmarks/op_bench.py's options and table (the timings themselves need a GPU:
benchmarks/gpu_session.sh ops, prefillprofile)."""

from __future__ import annotations

import argparse
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
