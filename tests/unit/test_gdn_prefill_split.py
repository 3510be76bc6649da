"""benchmarks/gdn_prefill_split.py's refusals and table (the timings need a GPU: docs/performance.md
gives the command and the H200's numbers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gdn_prefill_split  # noqa: E402
from test_op_bench import HYBRID_27B, MOE  # noqa: E402


def _model(tmp_path, cfg):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


@pytest.mark.parametrize(("cfg", "why"), [(MOE, "no Gated DeltaNet layers"),
                                          (None, "no config.json")])
def test_a_model_without_gdn_layers_or_config_stops_with_the_reason(cfg, why, tmp_path, capsys):
    model = _model(tmp_path, cfg) if cfg else str(tmp_path / "missing")
    with pytest.raises(SystemExit):
        gdn_prefill_split.main(["--model", model])
    assert why in capsys.readouterr().err


def test_a_gdn_model_without_a_gpu_stops_naming_the_device(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(gdn_prefill_split.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gdn_prefill_split.main(["--model", _model(tmp_path, HYBRID_27B), "--tokens", "64"])
    assert "needs a CUDA device" in capsys.readouterr().err


def test_bad_token_lists_stop(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gdn_prefill_split.main(["--model", _model(tmp_path, HYBRID_27B), "--tokens", "0"])
    assert "--tokens" in capsys.readouterr().err


def test_the_table_has_the_whole_op_each_way_then_the_pieces():
    stat = lambda m: {"median": m, "min": m - 1, "max": m + 1}  # noqa: E731
    rows = [{"tokens": t, "whole_us": {n: stat(10.0 * t) for n in gdn_prefill_split.WHOLE},
             "pieces_us": {"v copy (strided view)": stat(2.0)}} for t in (2048, 8192)]
    lines = gdn_prefill_split.table({"rows": rows}).splitlines()
    assert lines[0] == "| | 2048 tokens, us | 8192 tokens, us |"
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| whole op, flagos", "| whole op, flagos-torch-qk", "| whole op, flagos-new-cu",
        "| whole op, vendor.cuda",
        "| v copy (strided view)"]
    assert lines[2].endswith("| 20480.0 (20479.0-20481.0) | 81920.0 (81919.0-81921.0) |")


class _FlagGemsChunkDouble:
    """``flag_gems.chunk_gated_delta_rule_fwd``'s signature and result layout (output at 1, final
    state at 3), computing nothing: what `row` needs to run on CPU."""

    def chunk_gated_delta_rule_fwd(self, q, k, v, g, beta, scale, h0, final, cu_seqlens=None):
        assert cu_seqlens.dtype == gdn_prefill_split.torch.int64
        return None, v.clone(), None, h0, None


def test_a_row_times_every_way_and_piece_and_compares_the_flagos_outputs(tmp_path, monkeypatch):
    """`row` end to end on CPU: the 27B shape's inputs, FlagGems' kernel a stand-in, the
    reference backend as vendor.cuda, and a clock in place of CUDA events."""
    import argparse

    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.reference import ReferenceBackend
    from sglang_fl.tune import ModelShapes

    monkeypatch.setattr(gdn_prefill_split, "DEVICE", "cpu")
    monkeypatch.setattr(gdn_prefill_split, "time_us", lambda fn, iters: (fn(), 1.0)[1])
    flagos = FlagGemsBackend()
    flagos._gems = _FlagGemsChunkDouble()
    shapes = ModelShapes.from_model(_model(tmp_path, HYBRID_27B))
    got = gdn_prefill_split.row(flagos, ReferenceBackend(), shapes, 64,
                                argparse.Namespace(repeats=2, iters=1))
    assert set(got["whole_us"]) == set(gdn_prefill_split.WHOLE)
    assert got["whole_us"]["flagos"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    assert len(got["pieces_us"]) == 7
    assert got["flagos_vs_torch_qk_out_max_abs_diff"] == 0.0  # on CPU both take PyTorch's path
    assert got["qk_kernel_vs_torch"] == {"max_abs_diff": 0.0, "equal_share": 1.0}
    assert gdn_prefill_split.table({"rows": [got]}).count("\n") == 2 + 4 + 7 - 1
