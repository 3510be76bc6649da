"""benchmarks/e2e_bench.py's GPU memory plan (benchmarks/e2e_plan.py) and its group runner, on
CPU with made-up sizes: what a server needs, which sets are refused with their numbers, how
configurations that do not fit together are grouped around the anchor, the memory fraction
each server gets, that every configuration still gets a ratio paired within its group, that
served requests never reuse a cached prefix, and that a failed server's whole log is kept.

The GPU servers themselves cannot run here: `run_groups` gets small stand-ins that record what
was started, measured and stopped, in order."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import e2e_bench  # noqa: E402
import e2e_plan  # noqa: E402

GiB = e2e_plan.GiB
#: What torch.cuda.mem_get_info() gives on one H200 ("141 GB"): total, and free before any
#: server (the benchmark's own CUDA context holds about half a GiB).
H200_TOTAL = 150_754_820_096
H200_FREE = H200_TOTAL - GiB // 2
#: The benchmark's flags (e2e_bench.SERVER_ARGS) and SGLang's chunk on an H200.
FLAGS = dict(max_total_tokens=131072, max_running_requests=64, chunked_prefill=8192,
             graph_max_bs=32)

# Text configs as the checkpoints' config.json hold them (Qwen3.6 under text_config).
QWEN25_05B = {"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
              "num_key_value_heads": 2, "dtype": "bfloat16"}
QWEN3_30B_A3B_8L = {"num_hidden_layers": 8, "hidden_size": 2048, "num_attention_heads": 32,
                    "num_key_value_heads": 4, "head_dim": 128, "dtype": "bfloat16"}
QWEN36_35B_A3B_8L = {
    "num_hidden_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "dtype": "bfloat16",
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3
    + ["full_attention"], "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128}
THREE = ["native-L1off", "fl-defaults", "flagos-L1off"]


def needs(cfg, weights, names, **flags):
    return {n: e2e_plan.server_need(cfg, weights, **{**FLAGS, **flags}) for n in names}


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # a sparse file: the size without the disk
    return path


# -- what one server needs ---------------------------------------------------------------------

def test_weights_are_the_safetensors_sglang_loads(tmp_path):
    sparse(tmp_path / "model-00001-of-00002.safetensors", 30_000_000_000)
    sparse(tmp_path / "model-00002-of-00002.safetensors", 14_700_000_000)
    sparse(tmp_path / "pytorch_model.bin", 5)  # not loaded when safetensors are there
    assert e2e_plan.weights_bytes(tmp_path) == (44_700_000_000, "2 *.safetensors file(s)")


def test_weights_from_the_index_or_a_clear_refusal(tmp_path):
    with pytest.raises(e2e_plan.MemoryPlanError, match="cannot tell how much GPU memory"):
        e2e_plan.weights_bytes(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 44_700_000_000}, "weight_map": {}}))
    assert e2e_plan.weights_bytes(tmp_path)[0] == 44_700_000_000


def test_kv_pool_matches_what_sglang_allocated_on_the_h200():
    # SGLang's own log lines for these checkpoints at --max-total-tokens 131072:
    # 2026-12-02/sglang-0.5.23/server-0.log "K size: 0.75 GB, V size: 0.75 GB" (Qwen2.5-0.5B),
    # 2026-12-02/moe-e2e-logs/server-0.log "K size: 1.00 GB, V size: 1.00 GB" (Qwen3-30B-A3B, 8 l.)
    assert e2e_plan.kv_bytes_per_token(QWEN25_05B) * 131072 == int(1.5 * GiB)
    assert e2e_plan.kv_bytes_per_token(QWEN3_30B_A3B_8L) * 131072 == 2 * GiB
    assert e2e_plan.recurrent_state_bytes(QWEN25_05B) == 0


def test_hybrid_pool_holds_the_recurrent_states_of_every_running_request():
    cfg = QWEN36_35B_A3B_8L
    assert e2e_plan.attention_layers(cfg) == (2, 6)
    per_request = e2e_plan.recurrent_state_bytes(cfg)
    # 6 Gated DeltaNet layers: fp32 SSM state 32 x 128 x 128 + conv window 3 x 8192 (bf16).
    assert per_request == 6 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)
    need = e2e_plan.server_need(cfg, 0, **FLAGS)
    states = per_request * 64 * e2e_plan.MAMBA_STATES_PER_REQUEST
    # SGLang gives the states 0.9/1.9 of the pool: that share must still hold them all.
    assert need.kv_pool * 0.9 / 1.9 >= states
    mtp = e2e_plan.server_need(cfg, 0, **FLAGS, draft_tokens=4)
    assert mtp.kv_pool > need.kv_pool  # the draft's KV and per-draft-token states


def test_tiny_hybrid_checkpoint_written_by_sglang_fl_is_read(tmp_path):
    pytest.importorskip("transformers")
    from sglang_fl.models import make_tiny_model
    from sglang_fl.models.config import read_config, text_settings

    path = make_tiny_model(tmp_path / "m", preset="qwen3.5")
    cfg = text_settings(read_config(path))
    weights, _ = e2e_plan.weights_bytes(path)
    assert e2e_plan.attention_layers(cfg) == (2, 2)  # every 2nd of 4 layers is full attention
    assert weights == sum(f.stat().st_size for f in path.glob("*.safetensors")) > 0
    assert e2e_plan.server_need(cfg, weights, **FLAGS).kv_pool > 0


# -- which configurations share the GPU ----------------------------------------------------------

def test_a_small_model_serves_every_configuration_in_one_group():
    names = ["fl-defaults", "native-L1off", "vendor-L1off", "flagos-L1off", "tuned-L1off",
             "reference-L1off"]
    groups = e2e_plan.plan_groups(names, "native-L1off", needs(QWEN25_05B, 988_000_000, names),
                                  H200_FREE, H200_TOTAL)
    assert groups == [["native-L1off", "fl-defaults", "vendor-L1off", "flagos-L1off",
                       "tuned-L1off", "reference-L1off"]]


def test_qwen36_35b_a3b_shape_three_configs_on_one_h200_run_in_groups_with_the_anchor():
    need = needs(QWEN36_35B_A3B_8L, 44_700_000_000, THREE)
    assert 2 * need["fl-defaults"].total < H200_FREE < 3 * need["fl-defaults"].total
    groups = e2e_plan.plan_groups(THREE, "native-L1off", need, H200_FREE, H200_TOTAL)
    assert groups == [["native-L1off", "fl-defaults"], ["native-L1off", "flagos-L1off"]]

    # Started one after another, each with the fraction of the memory then free that holds
    # its weights and KV pool: SGLang's rest = f * free - weights keeps the whole KV pool.
    free = H200_FREE
    for name in groups[0]:
        fraction, taken = e2e_plan.footprint(need[name], free)
        assert fraction * free - need[name].weights >= need[name].kv_pool
        assert taken <= free
        free -= taken
    assert free >= 0


def test_the_old_fixed_quarter_fraction_is_refused_up_front_with_the_numbers():
    need = needs(QWEN36_35B_A3B_8L, 44_700_000_000, THREE)
    with pytest.raises(e2e_plan.MemoryPlanError) as err:
        e2e_plan.plan_groups(THREE, "native-L1off", need, H200_FREE, H200_TOTAL, fraction=0.25)
    text = str(err.value)
    assert "the anchor 'native-L1off' alone" in text and "--mem-fraction 0.25" in text
    assert "139.9 GiB free of 140.4 GiB total" in text
    assert "weights 41.6" in text  # 44.7 GB in GiB, for each configuration
    assert all(f"{n}: 62." in text for n in THREE)


def test_a_pair_that_cannot_fit_is_refused_a_single_server_is_not():
    need = needs(QWEN3_30B_A3B_8L, 80 * GiB, THREE)
    with pytest.raises(e2e_plan.MemoryPlanError, match="native-L1off \\+ fl-defaults together"):
        e2e_plan.plan_groups(THREE, "native-L1off", need, H200_FREE, H200_TOTAL)
    assert e2e_plan.plan_groups(["fl-defaults"], "fl-defaults", need, H200_FREE,
                                H200_TOTAL) == [["fl-defaults"]]
    with pytest.raises(e2e_plan.MemoryPlanError, match="alone"):
        e2e_plan.plan_groups(["fl-defaults"], "fl-defaults", need, 50 * GiB, H200_TOTAL)


def test_a_fixed_fraction_that_fits_is_kept():
    names = ["fl-defaults", "native-L1off"]
    need = needs(QWEN25_05B, 988_000_000, names)
    assert e2e_plan.plan_groups(names, "native-L1off", need, H200_FREE, H200_TOTAL,
                                fraction=0.2) == [["native-L1off", "fl-defaults"]]
    assert e2e_plan.footprint(need["fl-defaults"], H200_FREE, 0.2)[0] == 0.2


def test_speculative_twins_stay_in_one_group():
    names = ["fl-defaults", "fl-defaults+mtp", "flagos-L1off", "flagos-L1off+mtp"]
    units = e2e_plan.twin_units(names, "fl-defaults", "+mtp")
    assert units == [["fl-defaults+mtp"], ["flagos-L1off", "flagos-L1off+mtp"]]
    need = needs(QWEN3_30B_A3B_8L, 25 * GiB, names)  # three servers fit, four do not
    groups = e2e_plan.plan_groups(names, "fl-defaults", need, H200_FREE, H200_TOTAL,
                                  units=lambda n, a: e2e_plan.twin_units(n, a, "+mtp"))
    assert groups == [["fl-defaults", "fl-defaults+mtp"],
                      ["fl-defaults", "flagos-L1off", "flagos-L1off+mtp"]]


def test_anchor_is_the_one_asked_else_native_else_the_first():
    assert e2e_bench.pick_anchor(None, ["fl-defaults", "native-L1off"]) == "native-L1off"
    assert e2e_bench.pick_anchor(None, ["fl-defaults", "flagos-L1off"]) == "fl-defaults"
    assert e2e_bench.pick_anchor("flagos-L1off", ["fl-defaults", "flagos-L1off"]) == "flagos-L1off"
    with pytest.raises(SystemExit, match="not among"):
        e2e_bench.pick_anchor("tuned-L1off", ["fl-defaults"])


# -- running the groups --------------------------------------------------------------------------

class Events:
    """Stand-ins for the GPU servers: a server is a name; starting, measuring and stopping
    are recorded in order. ``fail`` names servers that do not start."""

    def __init__(self, fail=()):
        self.log, self.fail = [], set(fail)

    def open_server(self, name, group):
        @contextlib.contextmanager
        def server():
            self.log.append(("start", name, group))
            if name in self.fail:
                raise RuntimeError(f"{name} exited with code 1")
            try:
                yield name
            finally:  # as launched_server: stopped whatever ends its use
                self.log.append(("stop", name))
        return server()

    def measure(self, server, seed, new_tokens):
        self.log.append(("measure", server, seed))
        speed = {"native-L1off": 100.0, "fl-defaults": 110.0, "flagos-L1off": 90.0}[server]
        rep = 0 if seed == "warm-up" else int(seed.removeprefix("rep"))
        drift = 1 + 0.1 * (rep % 3)  # shared by every server in a repeat: cancels in pairs
        return {k: speed * drift for k in e2e_bench.METRICS}

    def failure(self, name, stage, exc):
        self.log.append(("failed", name, stage))
        return f"{stage}: {exc}"


def test_every_configuration_is_paired_with_the_anchor_of_its_own_group():
    ev = Events()
    groups = [["native-L1off", "fl-defaults"], ["native-L1off", "flagos-L1off"]]
    run = e2e_bench.run_groups(groups, "native-L1off", ev.open_server, ev.measure,
                               lambda s: [[1, 2]], ev.failure, repeats=3, new_tokens=16)
    assert run["errors"] == {}
    assert run["rep_group"] == {0: 0, 1: 0, 2: 0, 3: 1, 4: 1, 5: 1}
    # The anchor's server starts once and serves both groups; the others stop with theirs.
    starts = [e for e in ev.log if e[0] == "start"]
    assert starts == [("start", "native-L1off", 0), ("start", "fl-defaults", 0),
                      ("start", "flagos-L1off", 1)]
    assert ev.log.index(("stop", "fl-defaults")) < ev.log.index(("start", "flagos-L1off", 1))
    assert ev.log[-1] == ("stop", "native-L1off")

    results = e2e_bench.collect_results(run["runs"], run["rep_group"])
    assert results["native-L1off"]["prefill_tok_s"]["groups"] == [0, 0, 0, 1, 1, 1]
    assert results["flagos-L1off"]["prefill_tok_s"]["reps"] == [3, 4, 5]
    paired = e2e_bench.paired_to_anchor(results, "native-L1off")
    assert paired["fl-defaults"]["prefill_tok_s"]["median"] == pytest.approx(1.1)
    assert paired["flagos-L1off"]["prefill_tok_s"]["median"] == pytest.approx(0.9)
    assert paired["fl-defaults"]["prefill_tok_s"]["groups"] == [0]
    assert paired["flagos-L1off"]["decode_bs1_tok_s"]["groups"] == [1]
    doc = {"results": results, "paired": paired, "groups": run["groups"], "anchor": "native-L1off"}
    table = e2e_bench.table(doc)
    assert "| flagos-L1off (group 2) |" in table and "0.900 [0.900-0.900]" in table
    assert "| native-L1off (group 1, 2) |" in table
    assert set(run["greedy"]) == {"native-L1off", "fl-defaults", "flagos-L1off"}


def test_a_failed_start_is_reported_before_the_next_server_starts():
    ev = Events(fail={"fl-defaults"})
    run = e2e_bench.run_groups([["native-L1off", "fl-defaults", "flagos-L1off"]], "native-L1off",
                               ev.open_server, ev.measure, lambda s: [], ev.failure,
                               repeats=2, new_tokens=16)
    assert ev.log.index(("failed", "fl-defaults", "start")) \
        < ev.log.index(("start", "flagos-L1off", 0))
    assert run["errors"] == {"fl-defaults": "start: fl-defaults exited with code 1"}
    assert sorted(run["runs"]) == ["flagos-L1off", "native-L1off"]


def test_the_time_budget_is_shared_by_the_groups():
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    ev = Events()
    groups = [["native-L1off", "fl-defaults"], ["native-L1off", "flagos-L1off"]]
    run = e2e_bench.run_groups(groups, "native-L1off", ev.open_server, ev.measure,
                               lambda s: [], ev.failure, repeats=100, new_tokens=16,
                               end_time=40.0, clock=clock)
    reps = [len(g["reps"]) for g in run["groups"]]
    assert all(r > 3 for r in reps) and sum(reps) < 40  # both groups measured, within budget


def test_the_repeats_end_at_the_sooner_of_max_seconds_and_the_calls_deadline():
    assert e2e_bench.repeats_end(1000.0, None, None) is None
    assert e2e_bench.repeats_end(1000.0, 380.0, None) == 1380.0
    assert e2e_bench.repeats_end(1000.0, None, 1200.0) == 1200.0
    assert e2e_bench.repeats_end(1000.0, 380.0, 1200.0) == 1200.0  # the deadline is sooner
    assert e2e_bench.repeats_end(1000.0, 100.0, 1200.0) == 1100.0


def test_a_stop_keeps_the_whole_repeats_and_the_greedy_ids_taken_and_stops_every_server():
    """SIGTERM (a stage's timeout) in the second group's second repeat: group 1's repeats and
    greedy ids are kept, the repeat under way is dropped, both servers still up are stopped."""
    ev = Events()

    def measure(server, seed, n):
        if seed == "rep4" and server == "flagos-L1off":
            raise e2e_bench.Stopped("SIGTERM received")
        return ev.measure(server, seed, n)

    groups = [["native-L1off", "fl-defaults"], ["native-L1off", "flagos-L1off"]]
    run = e2e_bench.run_groups(groups, "native-L1off", ev.open_server, measure,
                               lambda s: [[1, s]], ev.failure, repeats=3, new_tokens=16)
    assert run["stopped"] == "SIGTERM received in group 2 after 1 of its repeats"
    assert run["greedy"] == {"native-L1off": [[1, "native-L1off"]],
                             "fl-defaults": [[1, "fl-defaults"]]}
    assert sorted(run["runs"]["native-L1off"]) == [0, 1, 2, 3]  # rep 4 was not whole
    assert sorted(run["runs"]["flagos-L1off"]) == [3]
    assert [g["reps"] for g in run["groups"]] == [[0, 1, 2], [3]]
    assert all(isinstance(g["seconds"], float) and "t0" not in g for g in run["groups"])
    stops = [e for e in ev.log if e[0] == "stop"]
    assert stops == [("stop", "fl-defaults"), ("stop", "flagos-L1off"), ("stop", "native-L1off")]
    results = e2e_bench.collect_results(run["runs"], run["rep_group"])
    paired = e2e_bench.paired_to_anchor(results, "native-L1off")
    assert paired["fl-defaults"]["prefill_tok_s"]["n"] == 3
    assert "prefill_tok_s" not in paired["flagos-L1off"]  # one pair is not a ratio
    assert e2e_bench.exit_status({"stopped": run["stopped"], "greedy": {"verdicts": {}}}) == 1
    assert e2e_bench.table({"stopped": run["stopped"], "results": results, "paired": paired,
                            "groups": run["groups"]}).startswith("stopped before the end: SIGTERM")


def test_sigterm_raises_stopped_once_then_ends_the_process(monkeypatch):
    """Once signalled, a print into a pipe whose reader is gone (``timeout`` signals a whole
    ``| tee`` pipeline) does not raise: the JSON is still written."""
    import signal

    read, write = os.pipe()
    os.close(read)
    monkeypatch.setattr(sys, "stdout", os.fdopen(write, "w", buffering=1))
    before = signal.getsignal(signal.SIGTERM)
    try:
        e2e_bench.stop_on_sigterm()
        with pytest.raises(e2e_bench.Stopped, match="SIGTERM received"):
            signal.raise_signal(signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        print("# stopped: into a closed pipe", flush=True)
        sys.stdout.flush()
    finally:
        signal.signal(signal.SIGTERM, before)
        with contextlib.suppress(OSError):
            getattr(sys.stdout, "_stream", sys.stdout).close()


# -- serving as users serve; failures said at once -----------------------------------------------

def test_servers_keep_sglang_defaults_for_radix_cache_and_chunked_prefill():
    assert "--disable-radix-cache" not in e2e_bench.SERVER_ARGS
    assert "--chunked-prefill-size" not in e2e_bench.SERVER_ARGS


class RecordingServer:
    """Answers /generate like SGLang (``output_ids`` of the length asked) and keeps prompts."""

    def __init__(self):
        self.prompts = []

    def post_json(self, path, payload, timeout=0):
        ids = payload["input_ids"]
        ids = ids if isinstance(ids[0], list) else [ids]
        self.prompts += [tuple(p) for p in ids]
        n = payload["sampling_params"]["max_new_tokens"]
        outs = [{"output_ids": [0] * n, "meta_info": {}} for _ in ids]
        return outs if len(outs) > 1 else outs[0]


def test_no_throughput_request_reuses_a_prompt_the_radix_cache_could_hold():
    a, b = RecordingServer(), RecordingServer()
    for seed in ("warm-up", "rep0", "rep1"):
        e2e_bench.measure(a, 1000, seed, 4)
    e2e_bench.measure(b, 1000, "rep0", 4)
    assert len(set(a.prompts)) == len(a.prompts)  # every prompt once: no cached prefix
    assert len({p[:8] for p in a.prompts}) == len(a.prompts)
    rep0 = a.prompts[len(a.prompts) // 3: 2 * len(a.prompts) // 3]
    assert rep0 == b.prompts  # one repeat gives every configuration the same work


def test_a_failed_server_leaves_its_whole_log_and_says_why_at_once(tmp_path, capsys):
    log = tmp_path / "logs" / "server-1.log"
    log.parent.mkdir()
    lines = [f"line {i}" for i in range(500)] + ["RuntimeError: Not enough memory."]
    log.write_text("\n".join(lines) + "\n")
    exc = RuntimeError(f"server exited with code 1 before it was healthy (31s); log {log}:\n...")
    message, kept = e2e_bench.report_failure("fl-defaults+mtp", "start", exc, log, tmp_path)
    assert kept == tmp_path / "server-fl-defaults+mtp-failed.log"
    assert kept.read_text() == log.read_text()  # the whole log, not its tail
    out = capsys.readouterr().out
    assert "# fl-defaults+mtp: start failed: RuntimeError: server exited with code 1" in out
    assert "RuntimeError: Not enough memory." in out and "line 499" in out
    assert "line 100\n" not in out  # the console gets the last lines only
    assert message.startswith("RuntimeError: server exited")
    assert e2e_bench.report_failure("x", "repeat 3", exc, tmp_path / "none.log", tmp_path) \
        == (f"repeat 3: {message}", None)
    assert not os.path.exists(tmp_path / "server-x-failed.log")


def test_main_plans_groups_and_records_each_servers_flags(tmp_path, monkeypatch, capsys):
    """main() through its GPU path, with a made-up GPU (room for two servers, not three) and
    stand-in servers; the HF check runs for real on a tiny checkpoint."""
    pytest.importorskip("transformers")
    import sglang_fl.serving
    from sglang_fl.models import make_tiny_model
    from sglang_fl.models.config import read_config, text_settings

    model = make_tiny_model(tmp_path / "m")
    need = e2e_plan.server_need(text_settings(read_config(model)),
                                e2e_plan.weights_bytes(model)[0],
                                **{**FLAGS, "chunked_prefill": 4096})  # SGLang's on 40 GiB
    monkeypatch.setattr(e2e_bench, "gpu_memory", lambda: (int(2.5 * need.total), 40 * GiB))
    monkeypatch.setattr(e2e_bench, "SERVER_ARGS", list(e2e_bench.SERVER_ARGS))

    @contextlib.contextmanager
    def launched_server(model_path, flags, env, log_path, timeout):
        log_path.write_text("".join(f"loading {i}\n" for i in range(100)))
        if "=flagos" in env.get("SGLANG_FL_PER_OP", ""):  # flagos-L1off
            with open(log_path, "a") as f:
                f.write("RuntimeError: Not enough memory.\n")
            raise sglang_fl.serving.ServerStartError("server exited with code 1 (3s)")
        yield RecordingServer()

    monkeypatch.setattr(sglang_fl.serving, "launched_server", launched_server)
    out = tmp_path / "out" / "e2e.json"
    doc = e2e_bench.main(["--model", str(model), "--out", str(out), "--log-dir",
                          str(tmp_path / "logs"), "--configs", ",".join(THREE),
                          "--repeats", "2", "--new-tokens", "4"])

    assert doc["anchor"] == "native-L1off"
    assert doc["memory"]["groups"] == [["native-L1off", "fl-defaults"],
                                       ["native-L1off", "flagos-L1off"]]
    assert [g["reps"] for g in doc["groups"]] == [[0, 1], []]
    for name in ("native-L1off", "fl-defaults"):
        flags = doc["servers"][name]["args"]
        assert "--disable-radix-cache" not in flags
        fraction = float(flags[flags.index("--mem-fraction-static") + 1])
        assert fraction == doc["servers"][name]["mem_fraction_static"]
        assert fraction * doc["servers"][name]["free_bytes_at_start"] >= need.static
    assert doc["paired"]["fl-defaults"]["prefill_tok_s"]["groups"] == [0]
    assert doc["start_errors"]["flagos-L1off"].startswith("ServerStartError: server exited")
    kept = out.parent / "server-flagos-L1off-failed.log"
    assert doc["failed_logs"] == {"flagos-L1off": str(kept)}
    assert kept.read_text().startswith("loading 0\n")
    console = capsys.readouterr().out
    assert "# flagos-L1off: start failed: ServerStartError" in console
    assert "RuntimeError: Not enough memory." in console
    assert set(doc["greedy"]["servers"]) == {"native-L1off", "fl-defaults"}
    assert "hf_transformers" in doc["greedy"]
    assert json.loads(out.read_text())["servers"] == doc["servers"]


# -- greedy ids against HF: verdicts, table, exit status, one reference for every run ------------

class HFAnsweringServer:
    """Answers the greedy request with HF's own ids (``honest``) or with token 0 throughout."""

    def __init__(self, model, honest):
        self.model, self.honest = model, honest

    def post_json(self, path, payload, timeout=0):
        from sglang_fl.models.hf_reference import hf_greedy_ids

        n = payload["sampling_params"]["max_new_tokens"]
        ids = payload["input_ids"]
        outs = hf_greedy_ids(self.model, ids, n) if self.honest else [[0] * n for _ in ids]
        return [{"output_ids": o, "meta_info": {}} for o in outs]


def test_greedy_check_judges_each_prompt_and_fails_the_run_on_a_defect(tmp_path, monkeypatch,
                                                                         capsys):
    """main() with --repeats 0 (greedy only): a configuration that gives HF's ids is equal on
    every prompt, one that gives token 0 is a DEFECT at step 0 (exit status 1); a second run
    judges against the cached HF reference without loading HF again."""
    pytest.importorskip("transformers")
    import sglang_fl.serving
    from sglang_fl.models import hf_reference, make_tiny_model

    model = make_tiny_model(tmp_path / "m")

    @contextlib.contextmanager
    def launched_server(model_path, flags, env, log_path, timeout):
        yield HFAnsweringServer(model_path, honest="SGLANG_FL_OOT_BLACKLIST" in env)

    monkeypatch.setattr(sglang_fl.serving, "launched_server", launched_server)
    monkeypatch.setattr(e2e_bench, "SERVER_ARGS", list(e2e_bench.SERVER_ARGS))
    out = tmp_path / "out" / "e2e.json"
    argv = ["--model", str(model), "--out", str(out), "--log-dir", str(tmp_path / "logs"),
            "--repeats", "0", "--greedy-prompts", "3", "--greedy-tokens", "5"]
    doc = e2e_bench.main([*argv, "--configs", "native-L1off,fl-defaults"])

    assert doc["results"] == {} and [g["reps"] for g in doc["groups"]] == [[]]  # greedy only
    greedy = json.loads(out.read_text())["greedy"]
    assert greedy["verdicts"] == doc["greedy"]["verdicts"]
    # fp32 checkpoint, SGLang's dtype auto: served in fp16, so an fp16 HF is the witness.
    assert greedy["hf_reference"]["served_dtype"] == "float16"
    assert greedy["hf_reference"]["witness"] == "float16"
    assert greedy["hf_reference"]["reused_prompts"] == 0
    honest, zeros = greedy["verdicts"]["native-L1off"], greedy["verdicts"]["fl-defaults"]
    assert [r["prompt"] for r in honest] == [0, 1, 2]
    assert all(r["equal"] and r["verdict"] == "equal" and r["step"] is None for r in honest)
    for r in zeros:
        assert (r["equal"], r["step"], r["served_token"], r["verdict"]) == (False, 0, 0, "DEFECT")
        assert r["gap"] > 0 and r["noise"] > 0 and r["bound"] == pytest.approx(
            hf_reference.near_tie_bound(r["noise"]))
        assert r["margin"] is None and r["margin_at_least"] > 0  # token 0: not among HF's kept
    assert greedy["match"] == {"native-L1off": 1.0, "fl-defaults": 0.0}
    assert e2e_bench.exit_status(doc) == 1
    console = capsys.readouterr().out
    assert "| native-L1off | 1 | yes | - | - | - | - | - | equal |" in console
    assert f"| fl-defaults | 2 | no | 0 | {greedy['hf_transformers'][2][0]} / 0 |" in console
    assert console.count("| DEFECT |") == 3

    def no_hf(*args, **kwargs):
        raise AssertionError("HF loaded again: the cached reference was not reused")

    monkeypatch.setattr(hf_reference, "hf_reference", no_hf)
    doc = e2e_bench.main([*argv, "--configs", "native-L1off"])
    assert doc["greedy"]["hf_reference"]["reused_prompts"] == 3
    assert e2e_bench.exit_status(doc) == 0


def test_past_the_first_parting_the_later_steps_are_judged_on_each_servers_context():
    """Two configurations leave HF's ids alike at step 1, then part from each other at step 3:
    HF along each one's own ids judges step 3 (a near-tie for one, HF's pick for the other);
    a configuration equal to HF, or parting at its last step, asks HF for nothing."""
    def step(top, logits, noise=0.1):
        return {"top_ids": top, "top_logits": logits, "noise": noise}

    ref = [{"ids": [1, 2, 3, 4], "steps": [step([1, 9], [5.0, 1.0]), step([2, 7], [5.0, 4.95]),
                                           step([3, 9], [5.0, 1.0]), step([4, 9], [5.0, 4.9])]}]
    served = {"native": [[1, 7, 5, 6]], "fl": [[1, 7, 5, 8]], "same": [[1, 2, 3, 4]],
              "last": [[1, 2, 3, 9]]}
    verdicts = e2e_bench.greedy_verdicts(served, ref)
    assert [verdicts[n][0]["step"] for n in served] == [1, 1, None, 3]
    along_of = {(1, 7, 5, 6): [step([1], [1.0])] * 2 + [step([5, 6], [3.0, 1.0]), step([6, 8], [3.0, 2.98])],
                (1, 7, 5, 8): [step([1], [1.0])] * 2 + [step([5, 6], [3.0, 1.0]), step([6, 8], [3.0, 2.0])]}
    asked = []

    def along(paths):
        asked.append(paths)
        return [{"steps": along_of[tuple(ids)]} for _, ids in paths]

    rows = e2e_bench.past_parting(served, verdicts, [[100, 101]], along)
    assert asked == [[([100, 101], [1, 7, 5, 6]), ([100, 101], [1, 7, 5, 8])]]
    assert rows["native"] == [{"prompt": 0, "from_step": 2, "steps": 2, "departures": []}]
    (d,) = rows["fl"][0]["departures"]
    assert (d["step"], d["hf_token"], d["served_token"], d["verdict"]) == (3, 6, 8, "DEFECT")
    assert d["margin"] == pytest.approx(1.0)
    doc = {"greedy": {"verdicts": verdicts, "past_parting": rows, "hf_reference": {}}}
    assert e2e_bench.exit_status(doc) == 1
    table = e2e_bench.greedy_table(doc)
    assert "| native | 0 | 2-3 | none: HF picks the served token at each |" in table
    assert "| fl | 0 | 2-3 | 3 6 / 8, 1 (0.5657): DEFECT |" in table
    along_of[(1, 7, 5, 8)][3] = step([6, 8], [3.0, 2.9])  # within 0.566: a near-tie
    rows = e2e_bench.past_parting(served, verdicts, [[100, 101]], along)
    assert rows["fl"][0]["departures"][0]["verdict"] == "near-tie"
    assert e2e_bench.exit_status({"greedy": {"verdicts": verdicts, "past_parting": rows}}) == 0
    assert e2e_bench.exit_status({"greedy": {"verdicts": verdicts,
                                             "past_parting_error": "not judged: SIGTERM"}}) == 1
    assert e2e_bench.past_parting({"same": served["same"]}, {"same": verdicts["same"]},
                                  [[100, 101]], along) == {}
    assert len(asked) == 2  # nothing to ask HF the last time
    # A server's own top logprobs, where it gave them, add each departure's evidence.
    served["fl"] = e2e_bench.GreedyIds(served["fl"], [[None, None, None, [[8, -1.0], [6, -1.5]]]])
    rows = e2e_bench.past_parting({"fl": served["fl"]}, {"fl": verdicts["fl"]}, [[100, 101]], along)
    (d,) = rows["fl"][0]["departures"]
    assert d["step_noise"] == pytest.approx(abs((-1.5 + 1.0) - (3.0 - 2.9)))
    assert (d["step_shared"], d["step_top"]) == (2, 2)
    assert "[served noise 0.6 / 0.1414, 2/2 of its top in HF's]" in e2e_bench.greedy_table(
        {"greedy": {"verdicts": {"fl": verdicts["fl"]}, "past_parting": rows}})


def test_a_defect_sglangs_own_kernels_make_on_the_same_ids_is_theirs_and_not_a_failure():
    """A DEFECT is marked as SGLang's where a configuration of its own kernels served the same
    ids up to and including that step; only sglang-own (sglang-fl routes nothing) witnesses
    native-L1off, whose GDN calls pass through sglang-fl; a configuration whose ids differ
    there, or a native variant, is not excused; a DEFECT nobody shares still fails the run."""
    def defect(step, token):
        return {"step": step, "hf_token": 6, "served_token": token, "gap": 0.1, "margin": 3.4,
                "margin_at_least": None, "noise": 0.5, "bound": 2.9, "kept": 1025,
                "verdict": "DEFECT"}

    def run(served):
        first = {n: [{"prompt": 0, "equal": False, **defect(0, ids[0][0])}
                     if ids[0][0] != 1 else {"prompt": 0, "equal": False, **defect(1, ids[0][1]),
                                            "verdict": "near-tie"}] for n, ids in served.items()}
        past = {n: [{"prompt": 0, "from_step": 2, "steps": 2,
                     "departures": [defect(3, ids[0][3])]}]
                for n, ids in served.items() if ids[0][0] == 1}
        greedy = {"servers": served, "verdicts": first, "past_parting": past, "hf_reference": {}}
        return greedy, e2e_bench.attribute_to_sglang(greedy)

    same, other = [[1, 7, 5, 8]], [[1, 7, 5, 9]]
    greedy, marked = run({"native-L1off": same, "fl-defaults": same, "flagos-L1off": other,
                          "native-L1off+noradix": same})
    assert marked == [("fl-defaults", 0, 3, "native-L1off")]
    departures = {n: r[0]["departures"][0] for n, r in greedy["past_parting"].items()}
    assert "as" not in departures["flagos-L1off"]  # its token at step 3 is not native's
    assert "as" not in departures["native-L1off"] and "as" not in departures["native-L1off+noradix"]
    assert e2e_bench.exit_status({"greedy": greedy}) == 1
    table = e2e_bench.greedy_table({"greedy": greedy})
    assert "| fl-defaults | 0 | 2-3 | 3 6 / 8, 3.4 (2.9): DEFECT (as native-L1off) |" in table
    assert "| flagos-L1off | 0 | 2-3 | 3 6 / 9, 3.4 (2.9): DEFECT |" in table

    greedy, marked = run({"native-L1off": same, "fl-defaults": same, "sglang-own": same})
    assert sorted(marked) == [("fl-defaults", 0, 3, "sglang-own"), ("native-L1off", 0, 3, "sglang-own"),
                              ("sglang-own", 0, 3, "sglang-own")]
    assert e2e_bench.exit_status({"greedy": greedy}) == 0
    # A first parting is attributed the same way.
    greedy, marked = run({"native-L1off": [[2, 7]], "fl-defaults": [[2, 7]], "sglang-own": [[2, 8]],
                          "flagos-L1off": [[3, 7]]})
    assert sorted(marked) == [("fl-defaults", 0, 0, "sglang-own"), ("native-L1off", 0, 0, "sglang-own"),
                              ("sglang-own", 0, 0, "sglang-own")]
    assert greedy["verdicts"]["fl-defaults"][0]["as"] == "sglang-own"
    assert "as" not in greedy["verdicts"]["flagos-L1off"][0]
    assert e2e_bench.exit_status({"greedy": greedy}) == 1


def test_a_defect_one_rounding_sized_router_flip_explains_is_a_router_near_tie():
    """Each DEFECT of an MoE model is probed once per distinct served prefix and token (two
    configurations with the same ids share a probe); an explained one does not fail the run and
    its table row names the flip; an unexplained one still fails; past the limit a row says it
    was not probed."""
    def defect(step, token):
        return {"step": step, "hf_token": 6, "served_token": token, "gap": 0.1, "margin": 3.4,
                "margin_at_least": None, "noise": 0.5, "bound": 2.9, "kept": 1025,
                "verdict": "DEFECT"}

    top = [[None, None, None, [[8, -1.0], [6, -1.5]]]]
    served = {"native-L1off": e2e_bench.GreedyIds([[1, 7, 5, 8]], top),
              "fl-defaults": [[1, 7, 5, 8]], "flagos-L1off": [[1, 7, 5, 9]]}
    greedy = {"servers": served, "hf_reference": {},
              "verdicts": {n: [{"prompt": 0, "equal": False, **defect(1, 7), "verdict": "near-tie"}]
                           for n in served},
              "past_parting": {n: [{"prompt": 0, "from_step": 2, "steps": 2,
                                    "departures": [defect(3, ids[0][3])]}]
                               for n, ids in served.items()}}
    asked = []

    def run_probe(cases):
        asked.extend(cases)
        flip = {"router": 2, "position": 33, "out": 17, "in": 140, "gap": 0.01,
                "gap_sigmas": 0.4, "hf_token": 8, "margin": 0.0}
        return [{"explained_by": flip if token == 8 else None, "near_ties": 40,
                 "flips_tried": 40, "least_margin": 1.5} for _, token, _, _, _ in cases]

    prompts = [[100, 101]]
    assert e2e_bench.probe_routers(greedy, prompts, run_probe) == 2
    # The step's witness noise and the first configuration's own top logprobs go with it.
    assert asked == [([100, 101, 1, 7, 5], 8, 2.9, 0.5, [[8, -1.0], [6, -1.5]]),
                     ([100, 101, 1, 7, 5], 9, 2.9, 0.5, None)]
    rows = {n: r[0]["departures"][0] for n, r in greedy["past_parting"].items()}
    assert rows["native-L1off"]["router_probe"] is rows["fl-defaults"]["router_probe"]
    assert "router_probe" not in greedy["verdicts"]["native-L1off"][0]  # a near-tie is not probed
    assert e2e_bench.exit_status({"greedy": greedy}) == 1  # flagos' step is not explained
    table = e2e_bench.greedy_table({"greedy": greedy})
    assert ("3 6 / 8, 3.4 (2.9): DEFECT = router near-tie (router 2, token 33: expert 17 -> 140, "
            "0.4 sigma; HF's margin then 0)") in table
    assert "3 6 / 9, 3.4 (2.9): DEFECT (no router flip explains it: 40 of 40 near-ties tried)" in table

    del greedy["past_parting"]["flagos-L1off"]
    assert e2e_bench.exit_status({"greedy": greedy}) == 0

    asked.clear()
    assert e2e_bench.probe_routers(greedy, prompts, run_probe, limit=0) == 0
    assert asked == [] and all(r[0]["departures"][0]["router_probe"].startswith("not probed")
                               for r in greedy["past_parting"].values())
    assert e2e_bench.exit_status({"greedy": greedy}) == 1
    assert e2e_bench.probe_routers({"servers": served, "verdicts": {}}, prompts, run_probe) == 0


def test_a_defect_a_set_of_flips_drawn_at_rounding_s_odds_explains_is_a_router_near_tie():
    """Where no single swap explains a DEFECT, a drawn set that does (`router_probe.ENSEMBLE`)
    does not fail the run, and the row names the set; an ensemble that explains nothing leaves
    the DEFECT failing, and the row says so with the ensemble's least margin."""
    def row(ensemble):
        probe = {"explained_by": None, "near_ties": 299, "flips_tried": 64, "least_margin": 3.04,
                 "ensemble": ensemble}
        return {"prompt": 0, "equal": False, "step": 7, "hf_token": 17350,
                "served_token": 71572, "gap": 0.15, "margin": 3.37, "margin_at_least": None,
                "noise": 0.51, "bound": 2.9, "kept": 1025, "verdict": "DEFECT",
                "router_probe": probe}

    drawn = {"sample": 5, "hf_token": 71572, "margin": 0.0, "served_noise": 1.2,
             "flips": [{"router": 2, "position": 27, "out": 200, "in": 173, "gap_sigmas": 0.03},
                       {"router": 6, "position": 30, "out": 1, "in": 9, "gap_sigmas": 0.4}]}
    explained = row({"samples": 64, "explaining": 3, "least_margin": 0.0, "explained_by": drawn})
    unexplained = row({"samples": 64, "explaining": 0, "least_margin": 2.95,
                       "shift": {"median": 0.9, "max": 2.1}, "explained_by": None})
    unexplained["router_probe"]["served_noise"] = 1.66
    for good, want in ((explained, 0), (unexplained, 1)):
        greedy = {"servers": {"native-L1off": [[1]]}, "hf_reference": {},
                  "verdicts": {"native-L1off": [good]}}
        assert e2e_bench.exit_status({"greedy": greedy}) == want
    assert e2e_bench._label(explained) == (
        "DEFECT = router near-ties (2 flips drawn at rounding's odds, set 5 of 64, 3 explaining; "
        "HF's margin then 0)")
    assert e2e_bench._label(unexplained) == (
        "DEFECT (no router flip explains it: 64 of 299 near-ties tried, nor 64 sets drawn at "
        "rounding's odds (least margin 2.95; they move HF's distribution by 0.9 (median) to 2.1, "
        "the server sits 1.66 from it))")


def test_sglang_own_routes_nothing_through_sglang_fl():
    """The witness of `attribute_to_sglang`: Layer 2 off (and with it the GDN routes, which
    plugin.py installs only under it) and Layer 1 off, whatever the platform YAML says."""
    from sglang_fl.config import build_settings

    env = e2e_bench.resolve_configs(["sglang-own"])["sglang-own"][0]
    settings = build_settings(env=env, detect_platform=lambda: "cuda")
    assert (settings.oot_enabled, settings.use_flaggems) == (False, False)
    assert e2e_bench.SGLANG_OWN[0] == "sglang-own"


def test_a_first_parting_left_undecided_is_settled_on_hfs_logits_along_the_served_ids():
    """HF's reference kept 3 logits of a step with more within the bound (incomplete), and the
    served token is not among them: `judge` cannot decide. HF along the served ids keeps the
    served token's logit: its margin decides the parting, in the verdicts themselves."""
    def step(top, logits, noise=0.5, complete=True):
        return {"top_ids": top, "top_logits": logits, "noise": noise, "complete": complete}

    ref = [{"ids": [1, 2], "steps": [step([1, 9], [5.0, 1.0]),
                                     step([2, 7, 6], [5.0, 4.9, 4.8], complete=False)]}]
    served = {"a": [[1, 8]], "b": [[1, 8]]}
    verdicts = e2e_bench.greedy_verdicts(served, ref)
    assert [verdicts[n][0]["verdict"] for n in served] == ["undecided"] * 2
    along_of = {"a": [step([1], [1.0]), step([2, 7, 6, 8], [5.0, 4.9, 4.8, 4.0])],  # 1.0 < 2.83
                "b": [step([1], [1.0]), step([2, 7, 6, 8], [5.0, 4.9, 4.8, 1.0])]}  # 4.0 > 2.83
    calls = iter(["a", "b"])

    def along(paths):
        assert [ids for _, ids in paths] == [[1, 8], [1, 8]]  # the parting is the last step
        return [{"steps": along_of[next(calls)]} for _ in paths]

    assert e2e_bench.past_parting(served, verdicts, [[100, 101]], along) == {}
    a, b = verdicts["a"][0], verdicts["b"][0]
    assert (a["verdict"], a["margin"], a["settled_along"]) == ("near-tie", pytest.approx(1.0), True)
    assert (b["verdict"], b["margin"]) == ("DEFECT", pytest.approx(4.0))
    assert a["margin_at_least"] is None and a["prompt"] == 0 and a["step"] == 1
    table = e2e_bench.greedy_table({"greedy": {"verdicts": verdicts, "hf_reference": {}}})
    assert "| near-tie (along) |" in table and "| DEFECT (along) |" in table
    assert e2e_bench.exit_status({"greedy": {"verdicts": {"a": verdicts["a"]}}}) == 0


def test_a_configuration_without_greedy_ids_or_without_hf_fails_the_run():
    equal = {"prompt": 0, "equal": True, "verdict": "equal"}
    near = {"prompt": 0, "equal": False, "verdict": "near-tie"}
    assert e2e_bench.exit_status({"greedy": {"verdicts": {"a": [equal], "b": [near]}}}) == 0
    assert e2e_bench.exit_status({"greedy": {"verdicts": {"a": [equal], "b": {"error": "x"}}}}) == 1
    assert e2e_bench.exit_status({"greedy": {"hf_error": "OutOfMemoryError: ..."}}) == 1
    assert e2e_bench.exit_status({"greedy": {}}) == 1
    undecided = {"equal": False, "verdict": "undecided"}
    assert e2e_bench.exit_status({"greedy": {"verdicts": {"a": [equal, undecided]}}}) == 1
    ref = [{"ids": [1, 2], "steps": [{"top_ids": [1], "top_logits": [1.0], "noise": 0.0}] * 2}]
    verdicts = e2e_bench.greedy_verdicts({"a": [[1, 2]], "b": "ServerStartError: exited"}, ref)
    assert verdicts["a"][0]["verdict"] == "equal"
    assert verdicts["b"] == {"error": "ServerStartError: exited"}
    table = e2e_bench.greedy_table({"greedy": {"verdicts": verdicts, "hf_reference": {}}})
    assert "| b | - | no ids: ServerStartError: exited |" in table


def test_greedy_ids_come_from_a_plain_request_and_the_logprobs_from_a_second_one():
    """The ids are taken as always; SGLang's top logprobs (``[logprob, token, text]`` per
    entry) from the same request again are kept where it gave the same ids, become evidence
    beside each verdict, and an exact tie won by the lower id says so in the table. A server
    that refuses logprobs still gives its ids."""
    class LogprobServer:
        def __init__(self, refuse=False, other_ids=False):
            self.refuse, self.other_ids, self.payloads = refuse, other_ids, []

        def post_json(self, path, payload, timeout=0):
            self.payloads.append(payload)
            with_lp = payload.get("return_logprob")
            if with_lp and self.refuse:
                raise RuntimeError("HTTP 400: logprobs unsupported")
            ids = [5, 3] if not (with_lp and self.other_ids) else [5, 6]
            top = [[[-1.0, 5, None], [-1.9, 9, None]], [[-0.5, 3, None], [-0.5, 6, None]]]
            return {"output_ids": ids, "meta_info": {"output_top_logprobs": top} if with_lp else {}}

    server = LogprobServer()
    got = e2e_bench.served_greedy(server, [[1, 2, 3]], 2)
    assert got == [[5, 3]] and got.top_logprobs == [[[[5, -1.0], [9, -1.9]], [[3, -0.5], [6, -0.5]]]]
    assert "return_logprob" not in server.payloads[0]  # the ids: the request every run made
    assert server.payloads[1]["top_logprobs_num"] == e2e_bench.GREEDY_TOP_LOGPROBS
    assert e2e_bench.served_greedy(LogprobServer(other_ids=True), [[1]], 2).top_logprobs == [None]
    refused = e2e_bench.served_greedy(LogprobServer(refuse=True), [[1]], 2)
    assert refused == [[5, 3]] and refused.top_logprobs is None

    ref = [{"ids": [5, 6], "steps": [{"top_ids": [5, 9], "top_logits": [3.0, 2.0], "noise": 0.1},
                                     {"top_ids": [6, 3], "top_logits": [4.0, 3.95], "noise": 0.1}]}]
    verdicts = e2e_bench.greedy_verdicts({"a": got, "b": [[5, 3]]}, ref)
    row = verdicts["a"][0]
    assert row["verdict"] == "near-tie" and row["served_margin"] == 0.0
    assert row["served_noise"] == pytest.approx(0.1) and row["noise_pairs"] == 1
    assert "served_margin" not in verdicts["b"][0]  # no logprobs: no evidence, same verdict
    table = e2e_bench.greedy_table({"greedy": {"verdicts": verdicts, "hf_reference": {}}})
    assert "| near-tie | 0 (tie: lower id) | 0.1 / 0.1414 |" in table
    assert "| near-tie | - | - / - |" in table


def test_the_accept_length_sglang_reports_is_recorded_for_batch_one():
    """SGLang puts ``spec_accept_length`` in a speculative request's meta_info; a plain server
    has none, and then the result has no such key (not a made-up 1.0)."""
    class SpeculatingServer(RecordingServer):
        def post_json(self, path, payload, timeout=None):
            out = super().post_json(path, payload, timeout)
            for o in out if isinstance(out, list) else [out]:
                o["meta_info"] = {"spec_accept_length": 2.5}
            return out

    assert e2e_bench.measure(SpeculatingServer(), 1000, "s", 4)["spec_accept_length"] == 2.5
    assert "spec_accept_length" not in e2e_bench.measure(RecordingServer(), 1000, "s", 4)


def test_native_runs_sglangs_own_gdn_kernels_and_flagos_pins_flaggems_gdn():
    """SGLang calls the GDN ops as functions, which sglang-fl routes on a GPU whatever the class
    blacklist says: native-L1off must pin them to the vendor kind (SGLang's own Triton kernels),
    or it serves whatever cuda.yaml orders first (FlagGems' delta rule until 2026-12-05).
    FlagGems for every op pins the GDN ops FlagGems implements."""
    from sglang_fl.config import build_settings
    from sglang_fl.dispatch.ops import GDN_OPS

    gdn = {spec.name for spec in GDN_OPS} - {"rms_norm_gated"}  # a layer class: blacklisted
    native = build_settings(env=e2e_bench.CONFIGS["native-L1off"], detect_platform=lambda: "cuda")
    assert {op for op, order in native.op_backends.items() if tuple(order) == ("vendor",)} == gdn
    assert "RMSNormGated" in native.oot_blacklist
    flagos = dict(kv.split("=") for kv in e2e_bench.CONFIGS["flagos-L1off"]["SGLANG_FL_PER_OP"].split(";"))
    assert {"chunk_gated_delta_rule", "recurrent_gated_delta_rule",
            "packed_recurrent_gated_delta_rule"} <= {op for op, kind in flagos.items() if kind == "flagos"}


H200_35B = (Path(__file__).resolve().parents[2] / "benchmarks/results/h200/2026-12-06b/"
            "shapes-qwen3.6-35b-a3b-tuned/shapes-qwen3.6-35b-a3b.json")


def test_an_earlier_runs_defect_is_probed_again_without_serving(tmp_path, capsys):
    """The H200's step beyond the bound (2026-12-06, prompt 1 step 7, native-L1off and
    fl-defaults on the same ids) is probed once from its JSON, with the served prefix, token,
    bound, witness noise and native-L1off's own top logprobs there; explained, it no longer
    fails the run. A dense checkpoint, or a JSON without judged ids, is refused by name."""
    moe = tmp_path / "moe"
    moe.mkdir()
    (moe / "config.json").write_text(json.dumps({"text_config": {"num_experts": 256}}))
    before = json.loads(H200_35B.read_text())
    assert e2e_bench.exit_status(before) == 1
    asked = []

    def run_probe(cases):
        asked.extend(cases)
        return [{"explained_by": {"router": 5, "position": 38, "out": 1, "in": 2, "gap": 0.01,
                                  "gap_sigmas": 0.5, "hf_token": 71572, "margin": 0.2},
                 "near_ties": 300, "flips_tried": 64, "least_margin": 0.2}]

    out = tmp_path / "reprobed.json"
    doc = e2e_bench.reprobe(H200_35B, moe, out, run_probe=run_probe)
    [(prefix, served, bound, noise, top)] = asked
    greedy = before["greedy"]
    assert prefix == greedy["prompts"][1] + greedy["servers"]["native-L1off"][1][:7]
    assert (served, round(bound, 2), round(noise, 3)) == (71572, 2.9, 0.513)
    assert top == greedy["served_top_logprobs"]["native-L1off"][1][7]
    assert e2e_bench.exit_status(doc) == 0
    assert json.loads(out.read_text())["reprobed_from"] == str(H200_35B)
    assert "= router near-tie (router 5, token 38" in capsys.readouterr().out

    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(SystemExit, match="not an MoE checkpoint"):
        e2e_bench.reprobe(H200_35B, dense, None, run_probe=run_probe)
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(SystemExit, match="no judged greedy ids"):
        e2e_bench.reprobe(empty, moe, None, run_probe=run_probe)
