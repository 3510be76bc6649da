"""tools/apply_tune.py: a `sglang-fl tune` result written into a platform YAML replaces exactly
the orders it measured (with their timing comments) and the token buckets, keeps everything else
(other ops with their comments, Layer-1 keys, dist_backend), names its source, and `--check`
tells a platform YAML that is tune's output from one that is not; the shipped cuda.yaml is
checked by it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import apply_tune  # noqa: E402

PLATFORM = """\
# Platform defaults (hand-set).
prefer: flagos
token_buckets:
  decode: 32
  prefill: null
op_backends:
  # rms_norm: hand-set from op_bench.
  rms_norm: [vendor, flagos, reference]
  # RoPE: vendor faster.
  rotary_embedding: [vendor, flagos, reference]
  # MoE split by bucket.
  fused_moe:
    decode: [flagos, vendor, reference]
    prefill: [vendor, flagos, reference]
# Layer 1: embedding only.
flagos_whitelist: [embedding]
dist_backend: nccl
flagos_blacklist: [mul, pow_scalar]
"""

# The shape of `sglang-fl tune --out` (sglang_fl/tune.py to_yaml): an op-wide order with its
# timings as comments, and a per-bucket one.
TUNED = """\
# Per-op, per-token-bucket backend order written by `sglang-fl tune`; load it with
# date: 2026-12-06 10:00:00 UTC
# device: cuda: NVIDIA H200
# versions: torch 2.11.0, sglang 0.5.11, flag_gems 5.0.2, triton 3.6.0, sglang-fl 0.1.0
# shapes: hidden 896, intermediate 4864, heads 14/2 x 64 (from defaults)
# dtype: bfloat16
# buckets: decode<=64; prefill>64; token counts timed: decode 1,64; prefill 256,2048
# not tuned: topk: no MoE model given
token_buckets:
  decode: 64
  prefill: null
op_backends:
  rms_norm: [flagos, vendor, reference]
    # decode (1,64 tokens) us: flagos 1.4/1.5, vendor 1.5/1.6, reference 9.0/9.9
    # prefill (256,2048 tokens) us: flagos 20.1/30.2, vendor 21.0/33.0, reference 90.0/400.0
  silu_and_mul:
    decode: [flagos, vendor, reference]  # us at 1,64 tokens: flagos 1.2/1.6, vendor 1.7/1.8
    prefill: [vendor, flagos, reference]  # us at 256,2048 tokens: vendor 9.0/27.0, flagos 9.5/30.0
"""


def test_the_measured_orders_and_buckets_replace_the_platforms_and_the_rest_stays():
    out = apply_tune.apply(TUNED, PLATFORM, "benchmarks/results/h200/X/tuned.yaml")
    doc = yaml.safe_load(out)
    assert doc["token_buckets"] == {"decode": 64, "prefill": None}
    assert doc["op_backends"] == {
        "rms_norm": ["flagos", "vendor", "reference"],  # tune's, not the hand-set order
        "silu_and_mul": {"decode": ["flagos", "vendor", "reference"],
                         "prefill": ["vendor", "flagos", "reference"]},
        "rotary_embedding": ["vendor", "flagos", "reference"],  # not tuned: kept
        "fused_moe": {"decode": ["flagos", "vendor", "reference"],
                      "prefill": ["vendor", "flagos", "reference"]},
    }
    for key in ("prefer", "flagos_whitelist", "dist_backend", "flagos_blacklist"):
        assert doc[key] == yaml.safe_load(PLATFORM)[key]
    assert out.count("token_buckets:") == 1 and out.count("op_backends:") == 1
    # Provenance and timings travel; the replaced op's hand-set comment does not.
    assert "# tuned-from: benchmarks/results/h200/X/tuned.yaml" in out.splitlines()
    assert "  # device: cuda: NVIDIA H200" in out
    assert "flagos 1.4/1.5, vendor 1.5/1.6" in out
    assert "hand-set from op_bench" not in out
    # The kept ops keep their comments, under a line that says why they are there.
    assert out.index("kept as before") < out.index("  # RoPE: vendor faster.")
    assert "  # MoE split by bucket." in out and "# Layer 1: embedding only." in out
    apply_tune.validate(out)  # loads as sglang-fl loads a config


def test_a_bucket_tune_could_not_order_keeps_the_platforms_order_for_it():
    partial = TUNED + """  fused_moe:
    decode: [vendor, flagos, reference]  # us at 1,64 tokens: vendor 30.0/60.0, flagos 40.0/70.0
    # prefill: no order written: nothing, or only the reference, passed and could be timed (see above); the platform's order applies
"""
    doc = yaml.safe_load(apply_tune.apply(partial, PLATFORM, "t.yaml"))
    assert doc["op_backends"]["fused_moe"] == {"decode": ["vendor", "flagos", "reference"],
                                               "prefill": ["vendor", "flagos", "reference"]}
    platform = PLATFORM.replace("    prefill: [vendor, flagos, reference]",
                                "    prefill: [flagos, reference]")
    doc = yaml.safe_load(apply_tune.apply(partial, platform, "t.yaml"))
    assert doc["op_backends"]["fused_moe"]["prefill"] == ["flagos", "reference"]


def test_applying_twice_gives_the_same_file():
    once = apply_tune.apply(TUNED, PLATFORM, "t.yaml")
    assert apply_tune.apply(TUNED, once, "t.yaml") == once


def test_a_tuned_file_that_orders_nothing_is_refused():
    empty = TUNED.split("op_backends:")[0] + "op_backends: {}\n"
    with pytest.raises(ValueError, match="orders no op"):
        apply_tune.apply(empty, PLATFORM, "t.yaml")


def test_check_tells_tunes_output_from_a_hand_set_file(tmp_path, monkeypatch):
    monkeypatch.setattr(apply_tune, "REPO", tmp_path)
    (tmp_path / "tuned.yaml").write_text(TUNED)
    platform = tmp_path / "cuda.yaml"
    platform.write_text(PLATFORM)
    assert "names no tuned file" in apply_tune.check(platform)
    assert apply_tune.main(["--check", "--platform-yaml", str(platform)]) == 1

    assert apply_tune.main([str(tmp_path / "tuned.yaml"), "--platform-yaml", str(platform)]) == 0
    assert apply_tune.check(platform) is None
    assert apply_tune.main(["--check", "--platform-yaml", str(platform)]) == 0

    # An order edited by hand afterwards is no longer tune's output.
    platform.write_text(platform.read_text().replace("rms_norm: [flagos, vendor, reference]",
                                                     "rms_norm: [vendor, flagos, reference]"))
    assert "op_backends differs" in apply_tune.check(platform)


def test_a_tuned_file_outside_the_repository_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(apply_tune, "REPO", tmp_path / "repo")
    (tmp_path / "tuned.yaml").write_text(TUNED)
    with pytest.raises(SystemExit):
        apply_tune.main([str(tmp_path / "tuned.yaml"), "--platform-yaml", str(tmp_path / "p.yaml")])
    assert "outside the repository" in capsys.readouterr().err


REDO = """\
# date: 2026-12-06 11:00:00 UTC
# device: cuda: NVIDIA H200
# shapes: hidden 2048 (from /tmp/moe/config.json)
# MIXED fused_moe prefill: the fastest differs by token count (vendor at 256; flagos at 2048); its order is by their summed time
token_buckets:
  decode: 64
  prefill: null
op_backends:
  fused_moe:
    decode: [vendor, flagos]  # us at 1,64 tokens: vendor 34.2/494.5, flagos 38.7/508.6
    prefill: [flagos, vendor, reference]  # us at 256,2048 tokens: flagos 640/750, vendor 587/989
  rms_norm: [vendor, flagos, reference]
"""


def test_a_later_run_of_some_ops_replaces_theirs_and_check_names_both(tmp_path, monkeypatch):
    """A full tune, then `tune --ops` redoing some ops: each op's order is the last run's that
    orders it, both runs' provenance is kept, and --check recomputes from both files."""
    monkeypatch.setattr(apply_tune, "REPO", tmp_path)
    (tmp_path / "full.yaml").write_text(TUNED)
    (tmp_path / "redo.yaml").write_text(REDO)
    platform = tmp_path / "cuda.yaml"
    platform.write_text(PLATFORM)
    assert apply_tune.main([str(tmp_path / "full.yaml"), str(tmp_path / "redo.yaml"),
                            "--platform-yaml", str(platform)]) == 0
    text = platform.read_text()
    doc = yaml.safe_load(text)
    assert doc["op_backends"]["fused_moe"] == {"decode": ["vendor", "flagos"],
                                               "prefill": ["flagos", "vendor", "reference"]}
    assert doc["op_backends"]["rms_norm"] == ["vendor", "flagos", "reference"]  # redo's
    assert doc["op_backends"]["silu_and_mul"]["decode"] == ["flagos", "vendor", "reference"]
    assert doc["op_backends"]["rotary_embedding"] == ["vendor", "flagos", "reference"]  # kept
    assert "# tuned-from: full.yaml redo.yaml" in text
    assert "# source: full.yaml (orders rms_norm, silu_and_mul)" in text
    assert "# source: redo.yaml (orders fused_moe, rms_norm)" in text
    assert "2026-12-06 10:00:00" in text and "2026-12-06 11:00:00" in text
    assert "  # MIXED fused_moe prefill: the fastest differs by token count" in text  # kept
    assert apply_tune.check(platform) is None
    # The order of the files matters: the other way round is not this file.
    platform.write_text(text.replace("# tuned-from: full.yaml redo.yaml",
                                     "# tuned-from: redo.yaml full.yaml"))
    assert "op_backends differs" in apply_tune.check(platform)


def test_runs_over_different_buckets_do_not_combine(tmp_path):
    other = REDO.replace("decode: 64\n", "decode: 32\n", 1)
    with pytest.raises(ValueError, match="different token buckets"):
        apply_tune.merge([("a.yaml", TUNED), ("b.yaml", other)])


def test_the_shipped_cuda_yaml_is_tunes_output():
    assert apply_tune.check(apply_tune.DEFAULT_PLATFORM_YAML) is None
