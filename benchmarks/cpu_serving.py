"""Served decode throughput on CPU: sglang-fl's reference fused ops vs SGLang's own forward.

Configurations (each a real ``python -m sglang.launch_server``):

- ``plugin-reference``: sglang-fl on, Layer 2 routes RMSNorm/SiluAndMul/RotaryEmbedding to the
  pure-PyTorch reference backend (the CPU default).
- ``plugin-oot-off``: sglang-fl on with ``SGLANG_FL_OOT_ENABLED=0``: SGLang's own native forward
  for the fused ops; the empty-mode stand-ins and CPU platform defaults still apply.
- ``plugin-off``: ``SGLANG_PLUGINS=__none__``. On an empty install (no sglang-kernel, no working
  torchvision) native SGLang cannot start; the run reports why and compares the first two.

Method, chosen for a small shared machine: all runnable servers are up at the same time (with
``--sleep-on-idle`` so an idle scheduler does not spin a core), and each repeat measures the
configurations back to back, order alternating, so load from elsewhere hits both sides of a
pair alike. Reported per configuration and batch size: median tok/s with min/max, median tokens
per CPU-second of the whole server process tree (robust to load from other processes), and the
median of the per-pair ratios ``plugin-reference / baseline`` of both, with min/max.

    .venv/bin/python benchmarks/cpu_serving.py --repeats 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sglang_fl.serving import ServerStartError, launched_server

CONFIGS = {
    "plugin-reference": {},
    "plugin-oot-off": {"SGLANG_FL_OOT_ENABLED": "0"},
    "plugin-off": {"SGLANG_PLUGINS": "__none__"},
}
CLEARED = ("SGLANG_FL_OOT_ENABLED", "SGLANG_FL_PREFER", "SGLANG_FL_PER_OP", "SGLANG_FL_OOT_BLACKLIST",
           "SGLANG_FL_OOT_WHITELIST", "SGLANG_PLUGINS", "SGLANG_FL_DISPATCH_LOG")


def _tree_cpu_seconds(server) -> float:
    """User+system CPU seconds used so far by the server and all its processes."""
    import psutil

    root = psutil.Process(server.process.pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def measure(server, batch: int, new_tokens: int, prompt_len: int) -> tuple[float, float]:
    """One /generate call with ``batch`` sequences (greedy, no EOS): output tokens per wall
    second, and per CPU second of the whole server (which load from other processes on a shared
    machine barely moves)."""
    prompts = [[(7 * i + 3 * j) % 500 + 10 for j in range(prompt_len)] for i in range(batch)]
    payload = {"input_ids": prompts if batch > 1 else prompts[0],
               "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    cpu0 = _tree_cpu_seconds(server)
    start = time.perf_counter()
    out = server.post_json("/generate", payload, timeout=600)
    seconds = time.perf_counter() - start
    cpu = _tree_cpu_seconds(server) - cpu0
    items = out if isinstance(out, list) else [out]
    tokens = sum(item["meta_info"]["completion_tokens"] for item in items)
    if tokens != batch * new_tokens:
        raise RuntimeError(f"expected {batch * new_tokens} tokens, got {tokens}")
    return tokens / seconds, tokens / max(cpu, 1e-9)


def summarize(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples), "samples": samples}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model path (default: the embedded tiny Qwen2, built if needed)")
    parser.add_argument("--repeats", type=int, default=10, help="measurement pairs (>= 5)")
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--server-args", default="--dtype float32 --sleep-on-idle",
                        help="extra launch_server options (float32: SGLang's auto picks float16 for "
                             "this checkpoint; sleep-on-idle: the waiting server must not spin a core)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error(f"--repeats={args.repeats}: at least 5 are needed for a median with spread")
    batches = [int(b) for b in args.batches.split(",") if b.strip()]

    if args.model:
        model = args.model
    else:
        from sglang_fl.cli_serving import default_model_dir
        from sglang_fl.models import make_tiny_model

        model = str(make_tiny_model(default_model_dir()))
    server_args = args.server_args.split()
    workdir = tempfile.mkdtemp(prefix="sglang-fl-bench-")

    names = list(CONFIGS)
    unavailable: dict[str, str] = {}
    results: dict[str, dict[int, list[float]]] = {n: {bs: [] for bs in batches} for n in names}
    per_cpu: dict[str, dict[int, list[float]]] = {n: {bs: [] for bs in batches} for n in names}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name in names:
            env = {k: None for k in CLEARED}
            env.update(CONFIGS[name])
            log = Path(workdir) / f"{name}.log"
            try:
                servers[name] = stack.enter_context(
                    launched_server(model, server_args, env, log_path=log, timeout=300))
            except ServerStartError as exc:
                tail = [ln for ln in str(exc).splitlines() if ln.strip()][-1]
                unavailable[name] = f"server did not start: {tail.strip()}"
                print(f"{name}: cannot run here ({unavailable[name]})", file=sys.stderr)
                continue
            measure(servers[name], 1, 8, args.prompt_len)  # warm-up: first-call allocations
        for r in range(args.repeats):
            order = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for bs in batches:
                for name in order:
                    wall, cpu = measure(servers[name], bs, args.new_tokens, args.prompt_len)
                    results[name][bs].append(wall)
                    per_cpu[name][bs].append(cpu)
            print(f"[repeat {r + 1}] " + "; ".join(
                f"{n}: " + ", ".join(f"bs{bs} {results[n][bs][-1]:.1f}" for bs in batches)
                for n in servers) + " tok/s", file=sys.stderr)

    measured = [n for n in names if n not in unavailable]
    baseline = "plugin-off" if "plugin-off" in measured else "plugin-oot-off"
    report = {
        "model": model, "server_args": server_args, "repeats": args.repeats,
        "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
        "unavailable": unavailable, "baseline": baseline,
        "throughput_tok_s": {n: {str(bs): summarize(results[n][bs]) for bs in batches} for n in measured},
        "tokens_per_cpu_second": {n: {str(bs): summarize(per_cpu[n][bs]) for bs in batches} for n in measured},
        "ratio_plugin_reference_to_baseline": {},
        "cpu_ratio_plugin_reference_to_baseline": {},
    }
    if "plugin-reference" in measured and baseline in measured:
        for bs in batches:
            for key, data in (("ratio_plugin_reference_to_baseline", results),
                              ("cpu_ratio_plugin_reference_to_baseline", per_cpu)):
                pairs = zip(data["plugin-reference"][bs], data[baseline][bs], strict=True)
                report[key][str(bs)] = summarize([a / b for a, b in pairs])

    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{'config':<18} {'batch':>5} {'tok/s median':>13} {'min':>9} {'max':>9} {'tok/CPU-s median':>17}")
    for n in measured:
        for bs in batches:
            s = report["throughput_tok_s"][n][str(bs)]
            c = report["tokens_per_cpu_second"][n][str(bs)]
            print(f"{n:<18} {bs:>5} {s['median']:>13.1f} {s['min']:>9.1f} {s['max']:>9.1f} {c['median']:>17.1f}")
    for key, what in (("ratio_plugin_reference_to_baseline", "tok/s"),
                      ("cpu_ratio_plugin_reference_to_baseline", "tok/CPU-s")):
        for bs, s in report[key].items():
            print(f"ratio plugin-reference / {baseline} ({what}), batch {bs}: median {s['median']:.3f} "
                  f"(min {s['min']:.3f}, max {s['max']:.3f}, {s['n']} pairs)")
    for n, why in unavailable.items():
        print(f"{n}: not measured -- {why}")
    return 0 if "plugin-reference" in measured else 1


if __name__ == "__main__":
    sys.exit(main())
