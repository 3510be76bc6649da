"""``sglang-fl tune`` on this CPU: over the tiny model it writes a YAML that Settings loads, an
implementation outside the op table's tolerance is excluded and reported, bad arguments fail
with a message naming them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from sglang_fl.config import build_settings
from sglang_fl.dispatch.backends.reference import ReferenceBackend
from sglang_fl.dispatch.manager import OpManager
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import OpImpl
from sglang_fl.tune import (
    ModelShapes,
    TuneError,
    assign_tokens,
    default_tokens,
    split_bucket,
    to_yaml,
    tune,
)

pytestmark = pytest.mark.integration

FAST = dict(iters=2, warmup=1, repeats=1)
BUCKETS = (("decode", 2), ("prefill", None))


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory):
    """The tiny Qwen3-MoE (routing of Qwen3-30B-A3B at tiny sizes): every dense op plus topk
    and fused_moe."""
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "moe", preset="qwen3-moe", hidden_size=64,
                           num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                           moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                           vocab_size=600)


def manager_with(*extra):
    settings = build_settings(env={"SGLANG_FL_PREFER": "reference"}, detect_platform=lambda: "cpu")
    registry = OpRegistry()
    registry.register_many(ReferenceBackend().op_impls())
    registry.register_many(extra)
    return OpManager(registry, SelectionPolicy.from_settings(settings))


def cli(*args, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    full.update({"SGLANG_FL_PLATFORM": "cpu", **(env or {})})
    return subprocess.run([sys.executable, "-m", "sglang_fl.cli", "tune", *args], env=full,
                          capture_output=True, text=True, timeout=240)


def test_tune_over_the_tiny_model_writes_a_yaml_settings_load(tiny_moe, tmp_path):
    out = tmp_path / "tuned.yaml"
    proc = cli("--model", str(tiny_moe), "--buckets", "decode=2;prefill", "--tokens", "1,2,8",
               "--iters", "2", "--warmup", "1", "--repeats", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    for needle in ("# device: cpu", "# versions: torch " + torch.__version__, "sglang ", "flag_gems ",
                   "# date: ", "hidden 64", "8 experts top-2", str(tiny_moe), "# dtype: bfloat16",
                   "decode 1,2; prefill 8", "not tuned: mrotary_embedding: the model has no mRoPE"):
        assert needle in text, (needle, text)
    s = build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")
    assert s.token_buckets == BUCKETS
    assert s.origins["op_backends"] == f"yaml {out}"
    for op in ("silu_and_mul", "rms_norm", "gemma_rms_norm", "rotary_embedding", "topk", "fused_moe"):
        assert s.backend_order(op, "decode") == ("reference",), op
        assert s.backend_order(op, "prefill") == ("reference",), op
    assert "mrotary_embedding" not in s.op_backends
    # the measured microseconds are in the file, one number per token count
    assert "# decode (1,2 tokens) us: reference " in text


def wrong_silu(obj, x):
    """SiLU-and-mul 5% too large: a kernel with a bug the accuracy gate must catch."""
    return ReferenceBackend().silu_and_mul(obj, x) * 1.05


def test_an_impl_outside_the_tolerance_is_excluded_and_reported(monkeypatch):
    fast_but_wrong = OpImpl("silu_and_mul", "flagos", "flagos", wrong_silu)
    manager = manager_with(fast_but_wrong)
    result = tune(manager, ModelShapes(hidden=32, intermediate=48, heads=2, kv_heads=1, head_dim=16,
                                       max_positions=64), BUCKETS, {"decode": (1,), "prefill": (4,)},
                  torch.bfloat16, "cpu", ops=["silu_and_mul", "rms_norm"], **FAST)
    silu = result.ops["silu_and_mul"]
    assert list(silu.excluded) == ["flagos(flagos)"]
    assert "max abs error" in silu.excluded["flagos(flagos)"] and "bfloat16" in silu.excluded["flagos(flagos)"]
    assert silu.orders == {"decode": ["reference"], "prefill": ["reference"]}
    assert "flagos" not in silu.us  # never timed
    text = to_yaml(result)
    assert "# EXCLUDED silu_and_mul flagos(flagos): variant 0 output 0: max abs error" in text
    assert "silu_and_mul: [reference]" in text


def test_a_correct_faster_impl_leads_its_bucket(monkeypatch):
    """Two correct impls: the one that is faster at small sizes leads the small bucket, the
    other the large one (the order follows the measured time, not the kind)."""
    import time

    ref = ReferenceBackend().silu_and_mul

    def slow_when_large(obj, x):
        if x.shape[0] > 2:
            time.sleep(0.002)
        return ref(obj, x)

    def slow_when_small(obj, x):
        if x.shape[0] <= 2:
            time.sleep(0.002)
        return ref(obj, x)

    manager = manager_with(OpImpl("silu_and_mul", "flagos", "flagos", slow_when_large),
                           OpImpl("silu_and_mul", "vendor.chip", "vendor", slow_when_small, vendor="chip"))
    shapes = ModelShapes(hidden=32, intermediate=48, heads=2, kv_heads=1, head_dim=16, max_positions=64)
    result = tune(manager, shapes, BUCKETS, {"decode": (1, 2), "prefill": (16,)}, torch.float32, "cpu",
                  ops=["silu_and_mul"], **FAST)
    orders = result.ops["silu_and_mul"].orders
    rank = {b: {k: i for i, k in enumerate(o)} for b, o in orders.items()}
    assert rank["decode"]["flagos"] < rank["decode"]["vendor"]
    assert rank["prefill"]["vendor"] < rank["prefill"]["flagos"]
    assert set(orders["decode"]) == set(orders["prefill"]) == {"flagos", "vendor", "reference"}
    text = to_yaml(result)
    assert "  silu_and_mul:\n    decode: [" in text and "    prefill: [" in text
    path = "tuned.yaml"
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = pathlib.Path(d) / path
        p.write_text(text)
        s = build_settings(env={"SGLANG_FL_CONFIG": str(p)}, detect_platform=lambda: "cpu")
    assert s.backend_order("silu_and_mul", "decode") == tuple(orders["decode"])
    assert s.backend_order("silu_and_mul", "prefill") == tuple(orders["prefill"])


def test_token_counts_per_bucket():
    assert default_tokens((("decode", 64), ("prefill", None))) == {"decode": (1, 64),
                                                                    "prefill": (256, 2048, 8192)}
    # Nothing above the larger of SGLang's served chunk and 4x the bound: SGLang never runs it.
    assert default_tokens((("decode", 512), ("prefill", None)))["prefill"] == (2048, 8192)
    assert default_tokens((("decode", 64), ("prefill", 2048), ("chunk", None))) == {
        "decode": (1, 64), "prefill": (65, 2048), "chunk": (8192,)}
    assert default_tokens((("decode", 4096), ("prefill", None)))["prefill"] == (8192, 16384)
    assert default_tokens((("decode", 8192), ("prefill", None)))["prefill"] == (32768,)
    assert default_tokens((("all", None),)) == {"all": (1, 256)}
    assert assign_tokens(BUCKETS, [8, 1, 2]) == {"decode": (1, 2), "prefill": (8,)}
    with pytest.raises(TuneError, match=r"no count in bucket\(s\) prefill"):
        assign_tokens(BUCKETS, [1, 2])


@pytest.mark.parametrize("args, needles", [
    (["--tokens", "1,x"], ["--tokens '1,x'", "positive integers"]),
    (["--tokens", "1,2", "--buckets", "decode=2;prefill"], ["no count in bucket(s) prefill"]),
    (["--tokens", "0,8", "--buckets", "decode=2;prefill"], ["0 is not a positive token count"]),
    (["--buckets", "decode=2;prefill=9"], ["--buckets", "'prefill'", "must be unbounded"]),
    (["--ops", "rmsnorm"], ["--ops", "'rmsnorm'", "did you mean 'rms_norm'", "silu_and_mul"]),
    (["--iters", "0"], ["--iters 0", "at least 1"]),
    (["--device", "nosuchdevice"], ["--device 'nosuchdevice'", "not usable"]),
    (["--model", "/nonexistent/model"], ["--model '/nonexistent/model'", "no config.json"]),
    (["--dtype", "int8"], ["--dtype", "'int8'", "bfloat16"]),
    (["--graph-buckets", "fast", "--buckets", "decode=2;prefill"],
     ["--graph-buckets 'fast'", "unknown bucket(s) 'fast'", "'none'", "decode, prefill"]),
    (["--graph-buckets", "decode", "--buckets", "decode=2;prefill", "--device", "cpu"],
     ["--graph-buckets 'decode'", "needs a CUDA device", "--graph-buckets none"]),
])
def test_bad_arguments_fail_naming_the_argument(args, needles):
    proc = cli(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


def test_a_model_config_without_the_needed_sizes_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "hidden_size": 64}')
    with pytest.raises(TuneError, match="no numeric 'num_attention_heads'"):
        ModelShapes.from_model(tmp_path)


@pytest.fixture(scope="module")
def tiny_hybrid(tmp_path_factory):
    """The tiny Qwen3.5-MoE: Gated DeltaNet layers, partial interleaved mRoPE, shared expert."""
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "hybrid", preset="qwen3.5-moe",
                           vocab_size=600)


def test_a_hybrid_models_gdn_and_rope_shapes_come_from_its_config(tiny_hybrid):
    s = ModelShapes.from_model(tiny_hybrid)
    assert (s.linear_key_heads, s.linear_value_heads, s.linear_key_dim, s.linear_value_dim,
            s.conv_kernel) == (2, 4, 16, 16, 4)
    assert s.conv_dim == 2 * 2 * 16 + 4 * 16
    assert (s.head_dim, s.rotary) == (32, 8)  # a quarter of each head rotates
    assert s.mrope_interleaved and sum(s.mrope_section) == s.rotary // 2
    assert (s.experts, s.top_k, s.moe_intermediate) == (16, 4, 32)
    assert "GDN heads 2/4 x 16/16, conv 4" in s.describe() and "rotary 8 of 32" in s.describe()
    assert ModelShapes().linear_key_heads == 0 and ModelShapes().rotary == ModelShapes().head_dim


def test_tune_times_and_gates_every_gdn_op_of_a_hybrid_model(tiny_hybrid, tmp_path):
    from sglang_fl.tune import GDN

    shapes = ModelShapes.from_model(tiny_hybrid)
    result = tune(manager_with(), shapes, BUCKETS, {"decode": (1, 2), "prefill": (70,)},
                  torch.bfloat16, "cpu", ops=[*GDN, "mrotary_embedding"], **FAST)
    for op in (*GDN, "mrotary_embedding"):
        r = result.ops[op]
        assert not r.skipped and not r.excluded, (op, r)
        assert r.orders == {"decode": ["reference"], "prefill": ["reference"]}, op
        assert set(r.us["reference"]) == {1, 2, 70}, op
    out = tmp_path / "tuned.yaml"
    out.write_text(to_yaml(result))
    s = build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")
    assert all(s.backend_order(op, "prefill") == ("reference",) for op in GDN)
    dense = tune(manager_with(), ModelShapes(), BUCKETS, {"decode": (1,), "prefill": (4,)},
                 torch.float32, "cpu", ops=list(GDN), **FAST)
    assert {r.skipped for r in dense.ops.values()} == {"the model has no Gated DeltaNet layers"}


def test_an_impl_that_writes_a_wrong_state_is_excluded(tiny_hybrid):
    """The decode ops' state pools are outputs too: a kernel whose returned value is right but
    whose written state is off must fail the gate."""
    ref = ReferenceBackend()

    def stale_state(obj, x, conv_state, *args):
        out = ref.causal_conv1d_update(obj, x, conv_state, *args)
        conv_state[1:] *= 1.5  # the slots it wrote, scaled
        return out

    manager = manager_with(OpImpl("causal_conv1d_update", "flagos", "flagos", stale_state))
    result = tune(manager, ModelShapes.from_model(tiny_hybrid), BUCKETS,
                  {"decode": (1,), "prefill": (8,)}, torch.float32, "cpu",
                  ops=["causal_conv1d_update"], **FAST)
    r = result.ops["causal_conv1d_update"]
    assert list(r.excluded) == ["flagos(flagos)"]
    assert "output 1: max abs error" in r.excluded["flagos(flagos)"]
    assert r.orders["decode"] == ["reference"]


SHAPES = ModelShapes(hidden=32, intermediate=48, heads=2, kv_heads=1, head_dim=16, max_positions=64)


def test_graph_buckets_are_timed_under_a_graph_and_uncapturable_impls_leave_them(tmp_path):
    """The graph buckets go through the graph timer (CUDA-graph replay on a GPU; a stand-in here,
    where CUDA graphs cannot run), the rest through the eager one. An impl whose capture fails
    is reported and left out of the graph buckets' orders only."""
    from sglang_fl.tune import time_case

    ref = ReferenceBackend().silu_and_mul

    def host_reading(obj, x):  # stands for an impl that syncs with the host
        return ref(obj, x)

    calls = []

    def graph_timer(fn, case, device, iters, warmup, repeats):
        calls.append(case)
        if fn is host_reading:
            raise RuntimeError("operation not permitted when stream is capturing")
        return 1.0

    manager = manager_with(OpImpl("silu_and_mul", "flagos", "flagos", host_reading))
    result = tune(manager, SHAPES, BUCKETS, {"decode": (1, 2), "prefill": (8,)}, torch.float32,
                  "cpu", ops=["silu_and_mul"], graph_buckets=("decode",),
                  timers={"graph": graph_timer, "eager": time_case}, **FAST)
    r = result.ops["silu_and_mul"]
    assert r.not_capturable == {"flagos(flagos)": "RuntimeError: operation not permitted when "
                                                  "stream is capturing"}
    assert r.orders["decode"] == ["reference"]
    assert set(r.orders["prefill"]) == {"flagos", "reference"}
    assert r.us["reference"][1] == r.us["reference"][2] == 1.0  # the graph timer's numbers
    assert set(r.us["flagos"]) == {8}  # one failed capture: its other graph count is skipped
    assert len(calls) == 3  # reference at 1 and 2, flagos once
    text = to_yaml(result)
    assert "under a CUDA graph in decode" in text
    assert ("# NOT CAPTURABLE silu_and_mul flagos(flagos) (left out of decode): RuntimeError"
            in text)
    out = tmp_path / "tuned.yaml"
    out.write_text(text)
    s = build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")
    assert s.backend_order("silu_and_mul", "decode") == ("reference",)
    assert set(s.backend_order("silu_and_mul", "prefill")) == {"flagos", "reference"}


def test_a_bucket_whose_fastest_kind_changes_with_the_token_count_is_reported(tmp_path):
    """The fused_moe case of the H100 (2026-12-06): one kind fastest at the bucket's small
    counts, another at its large one. The order is by the sum; the terminal and the YAML say
    where each kind was fastest, and a bucket where one kind wins everywhere says nothing."""
    from sglang_fl.tune import report

    ref = ReferenceBackend().silu_and_mul

    def flagos(obj, x):
        return ref(obj, x)

    def vendor(obj, x):
        return ref(obj, x)

    us = {flagos: {1: 1.0, 2: 1.0, 8: 5.0, 64: 50.0}, vendor: {1: 2.0, 2: 2.0, 8: 10.0, 64: 20.0}}

    def timer(fn, case, device, iters, warmup, repeats):
        tokens = case.variants[0][1][0].shape[0]
        return us.get(fn, {}).get(tokens, 1000.0)

    manager = manager_with(OpImpl("silu_and_mul", "flagos", "flagos", flagos),
                           OpImpl("silu_and_mul", "vendor.chip", "vendor", vendor, vendor="chip"))
    result = tune(manager, SHAPES, BUCKETS, {"decode": (1, 2), "prefill": (8, 64)}, torch.float32,
                  "cpu", ops=["silu_and_mul"], timers={"eager": timer}, **FAST)
    r = result.ops["silu_and_mul"]
    assert r.orders == {"decode": ["flagos", "vendor", "reference"],
                        "prefill": ["vendor", "flagos", "reference"]}
    assert r.fastest_by_tokens((8, 64)) == {"flagos": (8,), "vendor": (64,)}
    line = ("MIXED silu_and_mul prefill: the fastest differs by token count (flagos at 8; "
            "vendor at 64); its order is by their summed time; to order each size apart, tune "
            "with --buckets 'decode=2;prefill=8;prefill_above_8'")
    assert report(result).splitlines()[-1] == line
    assert split_bucket(BUCKETS, "decode", 1) == "decode=1;decode_above_1=2;prefill"
    text = to_yaml(result)
    assert f"# {line}\n" in text and "MIXED silu_and_mul decode" not in text
    out = tmp_path / "tuned.yaml"
    out.write_text(text)
    s = build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")
    assert s.backend_order("silu_and_mul", "prefill") == ("vendor", "flagos", "reference")


def test_a_graph_bucket_nothing_could_be_captured_in_keeps_the_platforms_order(tmp_path):
    def never(fn, case, device, iters, warmup, repeats):
        raise RuntimeError("capture failed")

    result = tune(manager_with(), SHAPES, BUCKETS, {"decode": (1,), "prefill": (8,)},
                  torch.float32, "cpu", ops=["silu_and_mul"], graph_buckets=("decode",),
                  timers={"graph": never}, **FAST)
    text = to_yaml(result)
    assert "# decode: no order written: nothing, or only the reference, passed" in text
    out = tmp_path / "tuned.yaml"
    out.write_text(text)
    s = build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")
    assert s.backend_order("silu_and_mul", "prefill") == ("reference",)
    assert "silu_and_mul@decode" not in s.op_backends


def test_which_buckets_are_timed_under_a_graph():
    from sglang_fl.cli_tune import graph_buckets

    assert graph_buckets(None, BUCKETS, "cuda") == ("decode",)
    assert graph_buckets(None, BUCKETS, "cuda:1") == ("decode",)
    assert graph_buckets(None, BUCKETS, "cpu") == ()
    assert graph_buckets(None, (("all", None),), "cuda") == ()
    assert graph_buckets("none", BUCKETS, "cuda") == ()
    assert graph_buckets("prefill,decode", BUCKETS, "cuda") == ("prefill", "decode")
    with pytest.raises(TuneError, match="needs a CUDA device"):
        graph_buckets("decode", BUCKETS, "npu")


def test_the_graph_timer_refuses_a_device_without_cuda_graphs():
    from sglang_fl.tune import build_case, time_case_graph

    case = build_case("silu_and_mul", SHAPES, 1, torch.float32, "cpu")
    with pytest.raises(TuneError, match="CUDA graph timing needs a CUDA device, not 'cpu'"):
        time_case_graph(ReferenceBackend().silu_and_mul, case, "cpu", 2, 1, 1)


def test_several_models_each_op_on_those_that_use_it(tiny_moe, tiny_hybrid, tmp_path):
    """One YAML for a platform that serves a dense MoE model and a hybrid: MoE ops come from the
    MoE model, GDN ops from the hybrid, the shared ops from both (their variants side by side,
    so the gate sees both models' shapes and the time is summed)."""
    from sglang_fl.tune import GDN

    out = tmp_path / "tuned.yaml"
    proc = cli("--model", str(tiny_moe), "--model", str(tiny_hybrid), "--buckets", "decode=2;prefill",
               "--tokens", "1,8", "--iters", "1", "--warmup", "0", "--repeats", "1",
               "--ops", "rms_norm,topk," + ",".join(GDN), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert text.count("# shapes: ") == 2 and str(tiny_moe) in text and str(tiny_hybrid) in text
    assert "summed over the models that use it" in text
    s = build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")
    for op in ("rms_norm", "topk", *GDN):
        assert s.backend_order(op, "prefill") == ("reference",), op


def test_an_impl_wrong_on_one_models_shapes_is_excluded():
    ref = ReferenceBackend().silu_and_mul

    def wrong_when_wide(obj, x):
        out = ref(obj, x)
        return out * 1.05 if x.shape[-1] > 100 else out

    wide = ModelShapes(hidden=32, intermediate=96, heads=2, kv_heads=1, head_dim=16, max_positions=64)
    manager = manager_with(OpImpl("silu_and_mul", "flagos", "flagos", wrong_when_wide))
    alone = tune(manager, SHAPES, BUCKETS, {"decode": (1,), "prefill": (4,)}, torch.float32,
                 "cpu", ops=["silu_and_mul"], **FAST)
    assert not alone.ops["silu_and_mul"].excluded
    both = tune(manager, [SHAPES, wide], BUCKETS, {"decode": (1,), "prefill": (4,)},
                torch.float32, "cpu", ops=["silu_and_mul"], **FAST)
    assert list(both.ops["silu_and_mul"].excluded) == ["flagos(flagos)"]
    assert "variant 1" in both.ops["silu_and_mul"].excluded["flagos(flagos)"]
    unused = tune(manager, [SHAPES, wide], BUCKETS, {"decode": (1,), "prefill": (4,)},
                  torch.float32, "cpu", ops=["topk"], **FAST)
    assert unused.ops["topk"].skipped == "none of the 2 models uses it (the model has no experts)"


def test_a_context_broken_by_a_failed_capture_stops_the_run_with_what_to_do():
    """Where the device no longer answers after a failed capture (here: a CUDA device on a host
    without one), tune stops instead of timing the next ops on a broken context."""
    from sglang_fl.tune import _check_device_after_capture

    _check_device_after_capture("cpu", "rms_norm", "flagos(flagos)")  # nothing to check
    with pytest.raises(TuneError, match="unusable after rms_norm flagos.flagos. failed its graph "
                                        "capture.*--graph-buckets none.*--ops leaving rms_norm out"):
        _check_device_after_capture("cuda", "rms_norm", "flagos(flagos)")


def test_a_multi_line_error_stays_a_comment_and_the_yaml_loads(tmp_path):
    """A CUDA error's text spans lines; each reason is one comment line (H100 2026-12-05: a
    second line without ``#`` made the written YAML unloadable)."""
    def raises_multi_line(obj, x):
        raise RuntimeError("Tensor match failed\n- Root cause:\n  the cache is bf16")

    result = tune(manager_with(OpImpl("silu_and_mul", "flagos", "flagos", raises_multi_line)), SHAPES,
                  BUCKETS, {"decode": (1,), "prefill": (8,)}, torch.float32, "cpu",
                  ops=["silu_and_mul"], **FAST)
    text = to_yaml(result)
    assert ("# EXCLUDED silu_and_mul flagos(flagos): raised RuntimeError: Tensor match failed "
            "- Root cause: the cache is bf16") in text
    assert all(line.startswith(("#", " ", "token_buckets", "op_backends")) for line in text.splitlines())
    out = tmp_path / "tuned.yaml"
    out.write_text(text)
    build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")


def test_no_reference_only_order_where_the_faster_kinds_only_raised(tmp_path):
    """Kinds that could not run the case (they raised) are not shown wrong: the bucket keeps the
    platform's order rather than making the reference the only path. A kind shown inaccurate
    still leaves the reference alone in the order."""
    def raises(obj, x):
        raise RuntimeError("Triton Error [CUDA]: invalid argument")

    result = tune(manager_with(OpImpl("silu_and_mul", "flagos", "flagos", raises)), SHAPES, BUCKETS,
                  {"decode": (1,), "prefill": (8,)}, torch.float32, "cpu", ops=["silu_and_mul"], **FAST)
    assert result.ops["silu_and_mul"].orders == {"decode": [], "prefill": []}
    out = tmp_path / "tuned.yaml"
    out.write_text(to_yaml(result))
    assert "# not tuned: silu_and_mul: only the reference passed; the others raised" in out.read_text()
    s = build_settings(env={"SGLANG_FL_CONFIG": str(out)}, detect_platform=lambda: "cpu")
    assert "silu_and_mul" not in s.op_backends and "silu_and_mul@prefill" not in s.op_backends
    wrong = tune(manager_with(OpImpl("silu_and_mul", "flagos", "flagos", wrong_silu)), SHAPES, BUCKETS,
                 {"decode": (1,), "prefill": (8,)}, torch.float32, "cpu", ops=["silu_and_mul"], **FAST)
    assert wrong.ops["silu_and_mul"].orders == {"decode": ["reference"], "prefill": ["reference"]}
    alone = tune(manager_with(), SHAPES, BUCKETS, {"decode": (1,), "prefill": (8,)}, torch.float32,
                 "cpu", ops=["silu_and_mul"], **FAST)  # the reference is the only impl here
    assert alone.ops["silu_and_mul"].orders == {"decode": ["reference"], "prefill": ["reference"]}


def test_rope_cases_follow_the_models_rope_and_sglangs_fp32_cache(tiny_hybrid):
    """An mRoPE model's RoPE layers are all MRotaryEmbedding: plain rotary_embedding is not its
    op. The cos/sin cache is fp32, as SGLang keeps it (its CUDA kernel refuses a bf16 one)."""
    from sglang_fl.tune import build_case

    hybrid = ModelShapes.from_model(tiny_hybrid)
    assert build_case("rotary_embedding", hybrid, 4, torch.bfloat16, "cpu") is None
    mrope = build_case("mrotary_embedding", hybrid, 4, torch.bfloat16, "cpu")
    dense = build_case("rotary_embedding", SHAPES, 4, torch.bfloat16, "cpu")
    assert build_case("mrotary_embedding", SHAPES, 4, torch.bfloat16, "cpu") is None
    for case in (mrope, dense):
        q, _k, cos, sin = case.variants[0][1][:4]
        assert q.dtype == torch.bfloat16 and cos.dtype == sin.dtype == torch.float32
    # a dense model's q and k: views of one [tokens, q|k|v] row, as its attention splits them
    q, k = dense.variants[0][1][:2]
    width = (SHAPES.heads + 2 * SHAPES.kv_heads) * SHAPES.head_dim
    assert q.stride() == k.stride() == (width, 1) and q.untyped_storage().data_ptr() == \
        k.untyped_storage().data_ptr()
    result = tune(manager_with(), hybrid, BUCKETS, {"decode": (1,), "prefill": (8,)}, torch.bfloat16,
                  "cpu", ops=["rotary_embedding"], **FAST)
    assert "mRoPE" in result.ops["rotary_embedding"].skipped


def test_gdn_decode_ops_are_timed_at_most_at_a_servers_decode_batch(tiny_hybrid):
    """One token per sequence: a prefill-sized token count becomes MAX_DECODE_SEQUENCES
    sequences (2,048 x 48 value heads exceed the kernels' launch grid)."""
    from sglang_fl.tune import GDN_DECODE_OPS, MAX_DECODE_SEQUENCES, build_case

    hybrid = ModelShapes.from_model(tiny_hybrid)
    big = MAX_DECODE_SEQUENCES * 4
    for op in GDN_DECODE_OPS:
        small = build_case(op, hybrid, 3, torch.float32, "cpu").variants[0][1]
        large = build_case(op, hybrid, big, torch.float32, "cpu").variants[0][1]
        assert small[0].shape[1 if op == "recurrent_gated_delta_rule" else 0] == 3, op
        assert large[0].shape[1 if op == "recurrent_gated_delta_rule" else 0] == MAX_DECODE_SEQUENCES, op
    chunk = build_case("chunk_gated_delta_rule", hybrid, big, torch.float32, "cpu").variants[0][1]
    assert chunk[0].shape[1] == big  # a prefill op keeps its one long sequence


def test_a_slow_impl_is_timed_one_call_per_repeat(monkeypatch):
    """A call over SLOW_CALL_US (after the first warm-up call, which may compile) is timed once
    per repeat instead of ``iters`` times: the GDN references took most of a GPU tune run."""
    import time

    from sglang_fl.tune import SLOW_CALL_US, build_case, time_case

    calls = []

    def slow(obj, x):
        calls.append(1)
        time.sleep(SLOW_CALL_US * 1.5e-6)
        return x

    def fast(obj, x):
        calls.append(1)
        return x

    case = build_case("silu_and_mul", SHAPES, 1, torch.float32, "cpu")
    us = time_case(slow, case, "cpu", iters=20, warmup=2, repeats=3)
    assert len(calls) == 2 + 3 and us > SLOW_CALL_US
    calls.clear()
    monkeypatch.setattr("sglang_fl.tune.SLOW_CALL_US", 1e9)  # no host is that loaded
    time_case(fast, case, "cpu", iters=20, warmup=2, repeats=3)
    assert len(calls) == 2 + 3 * 20


def test_tune_publishes_sglangs_default_server_args_and_keeps_a_published_one():
    """SGLang's kernels read the ServerArgs a server publishes (0.5.11's fused-MoE config reads
    ``enable_deterministic_inference``). Tune is no server: on the H100 on 2026-12-05 it
    excluded SGLang's fused_moe with "Global server args is not set yet!". It now publishes
    SGLang's defaults first. A fresh process, so that nothing is published before."""
    code = (
        "from sglang_fl.cli_tune import publish_sglang_defaults\n"
        "from sglang_fl.sglang_glue.adapters import get_adapter\n"
        "a = get_adapter()\n"
        "try:\n"
        "    a._published_server_args()\n"
        "    raise SystemExit('published before tune published')\n"
        "except ValueError:\n"
        "    pass\n"
        "publish_sglang_defaults()\n"
        "first = a._published_server_args()\n"
        "publish_sglang_defaults()\n"
        "print(type(first).__name__, first.enable_deterministic_inference,\n"
        "      a._published_server_args() is first)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "SGLANG_FL_PLATFORM": "cpu"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["ServerArgs", "False", "True"], proc.stdout


def test_gdn_prefill_ops_are_timed_eagerly_in_a_graph_bucket_too(tiny_hybrid):
    """SGLang's decode graph never holds the chunked rule or the prefill conv1d: a graph bucket
    is a small prefill for them, run eagerly. On the H100 (2026-12-05) their captures failed
    for every kind, so their decode bucket got no order; now it gets an eager one. The decode
    ops stay under the graph timer."""
    from sglang_fl.tune import GDN_EXTEND_OPS

    graphed = []

    def graph_timer(fn, case, device, iters, warmup, repeats):
        graphed.append(fn)
        return 1.0

    ops = [*GDN_EXTEND_OPS, "causal_conv1d_update"]
    result = tune(manager_with(), ModelShapes.from_model(tiny_hybrid), BUCKETS,
                  {"decode": (1, 2), "prefill": (8,)}, torch.float32, "cpu", ops=ops,
                  graph_buckets=("decode",), **FAST,
                  timers={"graph": graph_timer})
    for op in GDN_EXTEND_OPS:
        r = result.ops[op]
        assert r.orders == {"decode": ["reference"], "prefill": ["reference"]}, op
        assert not r.not_capturable and r.us["reference"][1] != 1.0, op  # the eager timer's
    assert result.ops["causal_conv1d_update"].us["reference"][1] == 1.0
    assert len(graphed) == 2  # causal_conv1d_update at 1 and 2 sequences only
    assert "eager in every bucket" in to_yaml(result)


def test_gdn_prefill_cases_hold_several_sequences_as_a_prefill_batch_does(tiny_hybrid):
    """A prefill batch holds several requests: the chunked rule and the prefill conv1d are timed
    on sequences of at most PREFILL_SEQUENCE tokens, so an impl that loops over sequences on
    the host pays per request (the H100 tune of 2026-12-05 timed one sequence and put the
    reference conv1d first)."""
    from sglang_fl.tune import PREFILL_SEQUENCE, build_case

    shapes = ModelShapes.from_model(tiny_hybrid)
    tokens = 3 * PREFILL_SEQUENCE + 10
    conv = build_case("causal_conv1d", shapes, tokens, torch.float32, "cpu")
    _, (x, _, _, states, starts, slots, has, _, lens) = conv.variants[0]
    assert lens == [512, 512, 512, 10]  # the host lengths SGLang passes beside query_start_loc
    assert starts.tolist() == [0, 512, 1024, 1536, tokens] and x.shape[1] == tokens
    # channel-last, as SGLang's gdn_backend passes mixed_qkv.transpose(0, 1)
    assert x.shape == (shapes.conv_dim, tokens) and x.stride() == (1, shapes.conv_dim)
    assert slots.tolist() == [1, 2, 3, 4] and states.shape[0] == 5  # slot 0 idle
    assert has.tolist() == [True, False, True, False]
    chunk = build_case("chunk_gated_delta_rule", shapes, 64, torch.float32, "cpu")
    _, (q, k, v, *_, state, cu) = chunk.variants[0]
    assert cu.tolist() == [0, 64] and state.shape[0] == 1 and q.shape[1] == 64
    # views of one [tokens, q|k|v] row each, as SGLang's gdn_backend splits the conv's output
    width = 2 * shapes.linear_key_heads * shapes.linear_key_dim + v.shape[2] * v.shape[3]
    assert q.stride(1) == k.stride(1) == v.stride(1) == width
    assert k.data_ptr() - q.data_ptr() == q.shape[2] * q.shape[3] * q.element_size()


def test_the_moe_case_is_a_single_device_layer_so_vendor_times_the_unfiltered_kernels():
    """A single-device server's FusedMoE holds every expert; the timed layer says so, so that
    vendor.cuda's fused_moe is timed on the kernels it serves there (not the expert-parallel,
    filtered ones)."""
    import dataclasses

    from sglang_fl.dispatch.backends.vendor.cuda.backend import _filters_experts
    from sglang_fl.tune import build_case

    shapes = dataclasses.replace(SHAPES, experts=8, top_k=2, moe_intermediate=32)
    (layer, _), = build_case("fused_moe", shapes, 3, torch.float32, "cpu").variants
    assert layer.moe_runner_config.num_experts == layer.moe_runner_config.num_local_experts == 8
    assert not _filters_experts(layer)


def test_the_reference_outside_the_tolerance_by_its_own_rounding_stays_the_last_fallback(
        monkeypatch, tmp_path):
    """The reference in bf16 against itself in fp32 measures bf16's rounding, not a defect (the
    H100 tune of 2026-12-06 left it out of RoPE's orders for it at 2,048+ tokens). Under a
    tolerance that bf16 cannot meet, the same function is excluded as a flagos impl and kept,
    reported as KEPT, as the reference."""
    import dataclasses

    from sglang_fl.dispatch import ops
    from sglang_fl.tune import OPS

    tight = dataclasses.replace(ops.OPS_BY_NAME["rotary_embedding"],
                                tolerance=ops.Tolerance((1e-7, 0), (1e-7, 0), (1e-7, 0)))
    monkeypatch.setattr("sglang_fl.tune.OPS", tuple(tight if o.name == "rotary_embedding" else o
                                                    for o in OPS))
    ref = ReferenceBackend()
    same = OpImpl("rotary_embedding", "flagos", "flagos",
                  lambda obj, *args: ref.rotary_embedding(obj, *args))
    result = tune(manager_with(same), SHAPES, BUCKETS, {"decode": (1,), "prefill": (64,)},
                  torch.bfloat16, "cpu", ops=["rotary_embedding"], **FAST)
    r = result.ops["rotary_embedding"]
    assert list(r.excluded) == ["flagos(flagos)"] and "exceeds" in r.excluded["flagos(flagos)"]
    assert list(r.rounding) == ["reference(reference)"]
    assert r.rounding["reference(reference)"] == r.excluded["flagos(flagos)"]
    assert all(o == ["reference"] for o in r.orders.values())
    text = to_yaml(result)
    assert "# KEPT rotary_embedding reference(reference): variant 0 output 0: max abs error" in text
    path = tmp_path / "t.yaml"
    path.write_text(text)
    assert build_settings(env={"SGLANG_FL_CONFIG": str(path)}, detect_platform=lambda: "cpu")


def test_a_reference_that_gives_non_finite_values_is_still_excluded(monkeypatch):
    def nan_rope(self, obj, query, key, *args, **kwargs):
        return query * float("nan"), key

    monkeypatch.setattr(ReferenceBackend, "rotary_embedding", nan_rope)
    result = tune(manager_with(), SHAPES, BUCKETS, {"decode": (1,), "prefill": (8,)},
                  torch.float32, "cpu", ops=["rotary_embedding"], **FAST)
    r = result.ops["rotary_embedding"]
    assert not r.rounding and "reference(reference)" in r.excluded


def test_the_gate_runs_each_impl_on_the_layout_it_is_timed_on(tiny_hybrid):
    """SGLang's q, k and v are views with gaps; the gate's copies keep their strides, so an
    impl that mishandles them fails the gate rather than being timed."""
    from sglang_fl.tune import build_case

    seen = []

    def record(obj, q, k, v, *args):
        seen.append((q.stride(), k.stride(), v.stride()))
        return ReferenceBackend().chunk_gated_delta_rule(obj, q, k, v, *args)

    manager = manager_with(OpImpl("chunk_gated_delta_rule", "flagos", "flagos", record))
    shapes = ModelShapes.from_model(tiny_hybrid)
    result = tune(manager, shapes, BUCKETS, {"decode": (1,), "prefill": (8,)}, torch.float32,
                  "cpu", ops=["chunk_gated_delta_rule"], **FAST)
    assert "flagos(flagos)" not in result.ops["chunk_gated_delta_rule"].excluded
    cases = {t: build_case("chunk_gated_delta_rule", shapes, t, torch.float32, "cpu") for t in (1, 8)}
    want = {tuple(a.stride() for a in c.variants[0][1][:3]) for c in cases.values()}
    assert set(seen) == want  # the case's strides, in the gate and in every timed call
    assert not cases[8].variants[0][1][0].is_contiguous()  # q's rows have gaps (k and v)
