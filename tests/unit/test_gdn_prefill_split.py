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
