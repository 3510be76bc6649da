"""The statistics behind every published GPU ratio (benchmarks/paired_stats.py) and the
e2e benchmark's pairing by repeat: a ratio is only taken within one repeat, and the verdict
follows the confidence interval."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import paired_stats  # noqa: E402


def test_ci_covers_the_true_ratio_and_verdict_follows_it():
    rng = random.Random(3)
    base = [100 * (1 + rng.gauss(0, 0.15)) for _ in range(80)]  # drift shared by the pair
    slower = [b * 0.9 * (1 + rng.gauss(0, 0.02)) for b in base]
    same = [b * (1 + rng.gauss(0, 0.02)) for b in base]
    s = paired_stats.summarize_pairs(slower, base)
    assert s["n"] == 80 and s["ci95"][0] < 0.9 < s["ci95"][1] and s["verdict"] == "slower"
    s = paired_stats.summarize_pairs(same, base)
    assert s["ci95"][0] < 1.0 < s["ci95"][1] and s["verdict"] == "no difference shown"
    assert paired_stats.verdict(1.01, 1.2) == "faster"


def test_unpaired_series_are_refused():
    with pytest.raises(ValueError, match="unpaired"):
        paired_stats.paired_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="two pairs"):
        paired_stats.bootstrap_median_ci([1.0])


def test_e2e_pairs_only_repeats_both_configurations_completed():
    import e2e_bench

    def res(reps, values):
        return {k: e2e_bench.summarize(list(values), list(reps)) for k in e2e_bench.METRICS}

    # "b" lost repeat 1 (an error): its repeat 2 must pair with the anchor's repeat 2.
    results = {"native-L1off": res([0, 1, 2], [10.0, 20.0, 40.0]), "b": res([0, 2], [5.0, 20.0])}
    paired = e2e_bench.paired_to_anchor(results)
    assert paired["b"]["prefill_tok_s"]["n"] == 2
    assert paired["b"]["prefill_tok_s"]["median"] == pytest.approx(0.5)
    doc = {"results": results, "paired": paired, "greedy": {}, "start_errors": {}}
    assert "0.500 [0.500-0.500]" in e2e_bench.table(doc)


def test_prefill_graph_variants_use_the_installed_sglangs_spelling_and_combine():
    import e2e_bench
    import e2e_plan

    from sglang_fl.sglang_glue.adapters import get_adapter

    env_on, flags_on = get_adapter().PREFILL_GRAPH_ON
    configs = e2e_bench.resolve_configs(["flagos-L1off", "flagos-L1off+pcg",
                                         "flagos-L1off+pcg+mtp"])
    flagos_env = e2e_bench.CONFIGS["flagos-L1off"]
    assert configs["flagos-L1off+pcg"] == ({**flagos_env, **dict(env_on)}, list(flags_on))
    assert configs["flagos-L1off+pcg+mtp"] == ({**flagos_env, **dict(env_on)},
                                               [*flags_on, *e2e_bench.MTP_ARGS])
    assert configs["flagos-L1off"] == (flagos_env, [])
    with pytest.raises(SystemExit, match="unknown configuration 'nope\\+pcg'.*NAME\\+pcg, NAME\\+noradix"):
        e2e_bench.resolve_configs(["nope+pcg"])
    # twins stay in one group (their ratio is paired), a chain too
    assert e2e_plan.twin_units(list(configs) + ["native-L1off"], "native-L1off",
                               e2e_bench.SUFFIXES) == [list(configs)]

    def res(values):
        return {k: e2e_bench.summarize(list(values), [0, 1]) for k in e2e_bench.METRICS}

    results = {"flagos-L1off": res([10.0, 10.0]), "flagos-L1off+pcg": res([12.0, 13.0])}
    paired = e2e_bench.paired_twins(results, e2e_bench.PCG_SUFFIX)
    assert paired["flagos-L1off+pcg"]["prefill_tok_s"]["median"] == pytest.approx(1.25)
    assert e2e_bench.paired_speculation(results) == {}
    greedy = {"flagos-L1off": [[1, 2], [3, 4]], "flagos-L1off+pcg": [[1, 2], [3, 5]]}
    exact = e2e_bench.twin_exact(greedy, e2e_bench.PCG_SUFFIX)
    assert exact == {"flagos-L1off+pcg": [True, False]}
    doc = {"results": results, "paired": {}, "greedy": {"servers": greedy},
           "start_errors": {}, "paired_prefill_graph": paired}
    assert "| flagos-L1off+pcg | 1.250 [" in e2e_bench.table(doc)
    assert "prefill CUDA graph" in e2e_bench.table(doc) and "1/2 prompts" in e2e_bench.table(doc)
    # the radix cache off, alone or with the graph
    more = e2e_bench.resolve_configs(["fl-defaults+noradix", "fl-defaults+pcg+noradix"])
    assert more["fl-defaults+noradix"] == ({}, ["--disable-radix-cache"])
    assert more["fl-defaults+pcg+noradix"] == (dict(env_on), [*flags_on, "--disable-radix-cache"])


def test_mtp_configurations_pair_with_their_plain_twin():
    import e2e_bench

    configs = e2e_bench.resolve_configs(["fl-defaults", "fl-defaults+mtp"],
                                        ["mine=USE_FLAGGEMS=1"])
    assert configs["fl-defaults"] == ({}, [])
    assert configs["fl-defaults+mtp"] == ({}, e2e_bench.MTP_ARGS)
    assert configs["mine"] == ({"USE_FLAGGEMS": "1"}, [])
    assert "--speculative-algorithm" in e2e_bench.MTP_ARGS
    with pytest.raises(SystemExit, match="unknown configuration 'nope\\+mtp'.*fl-defaults"):
        e2e_bench.resolve_configs(["nope+mtp"])

    def res(values, accept=None):
        out = {k: e2e_bench.summarize(list(values), [0, 1, 2]) for k in e2e_bench.METRICS}
        if accept:
            out["spec_accept_length"] = e2e_bench.summarize(accept, [0, 1, 2])
        return out

    results = {"native-L1off": res([10.0, 10.0, 10.0]), "fl-defaults": res([10.0, 20.0, 40.0]),
               "fl-defaults+mtp": res([15.0, 30.0, 60.0], [1.5, 1.6, 1.7])}
    spec = e2e_bench.paired_speculation(results)
    assert list(spec) == ["fl-defaults+mtp"]
    assert spec["fl-defaults+mtp"]["decode_bs1_tok_s"]["median"] == pytest.approx(1.5)
    greedy = {"fl-defaults": [[1, 2], [3, 4]], "fl-defaults+mtp": [[1, 2], [3, 5]]}
    assert e2e_bench.speculation_exact(greedy) == {"fl-defaults+mtp": [True, False]}
    doc = {"results": results, "paired": e2e_bench.paired_to_anchor(results), "anchor": "native-L1off",
           "paired_speculation": spec, "start_errors": {},
           "greedy": {"speculative_equals_plain": e2e_bench.speculation_exact(greedy)}}
    text = e2e_bench.table(doc)
    assert "| fl-defaults+mtp | 1.500 [1.500-1.500]" in text
    assert "1.60 (1.50-1.70) | 1/2 prompts |" in text


def test_a_per_op_variant_repins_only_the_named_ops_of_its_base(monkeypatch):
    """--variant derives a bisecting configuration from a known one: its other ops and its
    environment stay; a bad base, op or kind is refused naming the accepted values."""
    import e2e_bench

    import sglang_fl.devices

    monkeypatch.setattr(sglang_fl.devices, "detect_platform", lambda: "cuda")  # cuda.yaml
    for key in [k for k in os.environ if k.startswith("SGLANG_FL_")]:  # tests/integration pins
        monkeypatch.delenv(key)  # some for the whole process (its conftest)

    configs = e2e_bench.resolve_configs(
        ["flagos-L1off"], variants=["fo-gdn=flagos-L1off:chunk_gated_delta_rule=vendor;"
                                    "packed_recurrent_gated_delta_rule@decode=vendor|flagos",
                                    "fd-rope=fl-defaults:rotary_embedding=vendor"])
    base_env = configs["flagos-L1off"][0]
    env, flags = configs["fo-gdn"]
    assert flags == [] and env["USE_FLAGGEMS"] == base_env["USE_FLAGGEMS"]
    base = base_env["SGLANG_FL_PER_OP"].split(";")
    got = env["SGLANG_FL_PER_OP"].split(";")
    assert "chunk_gated_delta_rule=vendor" in got and "chunk_gated_delta_rule=flagos" not in got
    assert got[-1] == "packed_recurrent_gated_delta_rule@decode=vendor|flagos"
    assert [e for e in got if not e.startswith(("chunk_", "packed_recurrent_gated_delta_rule@"))] == [
        e for e in base if not e.startswith("chunk_")]
    from sglang_fl.config import build_settings

    # a base whose orders come from YAML keeps every other op's YAML order (the variable
    # replaces op_backends whole)
    def orders(env):
        return dict(build_settings(env=env, detect_platform=lambda: "cuda").op_backends)

    yaml = orders({})
    assert yaml, "the platform YAML names per-op orders"
    assert orders(configs["fd-rope"][0]) == {**yaml, "rotary_embedding": ("vendor",)}

    settings = build_settings(env=env, detect_platform=lambda: "cuda")
    assert settings.op_backends["chunk_gated_delta_rule"] == ("vendor",)
    assert settings.op_backends["packed_recurrent_gated_delta_rule@decode"] == ("vendor", "flagos")
    for bad, says in (("x=nope:rms_norm=vendor", "unknown base configuration 'nope'.*flagos-L1off"),
                      ("x=flagos-L1off:rms_nrom=vendor", "bad entry 'rms_nrom=vendor'; ops: .*rms_norm"),
                      ("x=flagos-L1off:rms_norm=cuda", "kinds: flagos, vendor, reference"),
                      ("x=flagos-L1off", "expected NAME=BASE:op=kind")):
        with pytest.raises(SystemExit, match=says):
            e2e_bench.resolve_configs(["flagos-L1off"], variants=[bad])


def test_a_twin_parting_takes_the_hf_verdict_of_the_one_that_left_hfs_ids_there():
    """NEXTN verifies with other kernels than plain decode, so at a near-tie the twins may part:
    the parting is judged by HF's reference at that step (the H100 run of 2026-12-06 parted so
    on native-L1off too); a parting after both left HF's ids is undecided."""
    import e2e_bench

    def row(i, step=None, verdict="equal"):
        return {"prompt": i, "equal": step is None, "step": step, "verdict": verdict}

    greedy = {"a+noradix": [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 2, 3]],
              "a+noradix+mtp": [[1, 2, 3], [1, 2, 4], [1, 5, 3], [1, 9, 8], [1, 9, 3]],
              "b": [[1, 2]], "b+pcg": "ServerStartError: exited"}
    verdicts = {"a+noradix": [row(0), row(1), row(2, 1, "near-tie"), row(3), row(4, 1, "near-tie")],
                "a+noradix+mtp": [row(0), row(1, 2, "near-tie"), row(2), row(3, 1, "DEFECT"),
                                  row(4, 1, "near-tie")],
                "b": [row(0)], "b+pcg": {"error": "no ids"}}
    greedy["a+noradix"][4] = [1, 9, 7]  # both left HF's ids at step 1, then parted at step 2
    parts = e2e_bench.twin_partings(greedy, verdicts)
    assert parts["b+pcg"] is None and "b" not in parts
    # a+noradix is itself the twin of a, which did not run: only the mtp pair is judged
    assert "a+noradix" not in parts
    got = [(r["step"], r["verdict"], r["by"]) for r in parts["a+noradix+mtp"]]
    assert got == [(None, "equal", []), (2, "near-tie", ["a+noradix+mtp"]),
                   (1, "near-tie", ["a+noradix"]), (1, "DEFECT", ["a+noradix+mtp"]),
                   (2, "undecided", ["a+noradix", "a+noradix+mtp"])]
    assert e2e_bench._twin_summary(parts["a+noradix+mtp"], None) == (
        "1/5 prompts (2 near-tie, 1 DEFECT, 1 undecided)")
    assert e2e_bench._twin_summary(None, [True, False]) == "1/2 prompts"


@pytest.mark.parametrize("refuses", [True, False])
def test_speculation_on_a_hybrid_model_with_the_radix_cache_is_refused_before_any_start(
        tmp_path, monkeypatch, refuses):
    """SGLang 0.5.11 refuses NEXTN on a GDN/Mamba model while the radix cache is on: the
    benchmark stops before starting a server and names the pair that can run."""
    import e2e_bench

    from sglang_fl.sglang_glue.adapters import get_adapter

    monkeypatch.setattr(type(get_adapter()), "SPECULATIVE_HYBRID_NEEDS_NO_RADIX", refuses)
    hybrid, dense = tmp_path / "hybrid", tmp_path / "dense"
    for path, cfg in ((hybrid, {"linear_num_key_heads": 16}), (dense, {"hidden_size": 64})):
        path.mkdir()
        (path / "config.json").write_text(__import__("json").dumps(cfg))
    asked = e2e_bench.resolve_configs(["fl-defaults", "fl-defaults+mtp", "flagos-L1off+mtp+pcg"])
    if refuses:
        with pytest.raises(SystemExit, match=r"fl-defaults\+mtp, flagos-L1off\+mtp\+pcg cannot start"
                           r".*Ask for fl-defaults\+noradix\+mtp, flagos-L1off\+pcg\+noradix\+mtp"):
            e2e_bench.refuse_unstartable(asked, str(hybrid), e2e_bench.SERVER_ARGS)
    else:
        e2e_bench.refuse_unstartable(asked, str(hybrid), e2e_bench.SERVER_ARGS)
    # what it names starts: the radix cache off in the variant and in its twin
    fixed = e2e_bench.resolve_configs(["fl-defaults+noradix", "fl-defaults+noradix+mtp"])
    e2e_bench.refuse_unstartable(fixed, str(hybrid), e2e_bench.SERVER_ARGS)
    assert fixed["fl-defaults+noradix+mtp"][1] == ["--disable-radix-cache", *e2e_bench.MTP_ARGS]
    # common flags that turn it off (a --server-args run) do too; a dense model is never refused
    e2e_bench.refuse_unstartable(asked, str(hybrid), ["--disable-radix-cache"])
    e2e_bench.refuse_unstartable(asked, str(dense), e2e_bench.SERVER_ARGS)


def test_the_installed_adapter_says_whether_hybrid_speculation_needs_the_radix_cache_off():
    """0.5.11's ServerArgs raise on it; 0.5.23 resolves the mamba strategy itself."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    assert adapter.SPECULATIVE_HYBRID_NEEDS_NO_RADIX is (adapter.version == "0.5.11")
    if adapter.version == "0.5.11":
        import inspect

        from sglang.srt import server_args

        assert "is not compatible with radix cache when using" in inspect.getsource(server_args)
