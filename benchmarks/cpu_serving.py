"""Served decode throughput on CPU: sglang-fl's reference fused ops vs SGLang's own forward.

Configurations (each a real ``python -m sglang.launch_server``):

- ``plugin-reference``: sglang-fl on, Layer 2 routes RMSNorm/SiluAndMul/RotaryEmbedding to the
  pure-PyTorch reference backend (the CPU default).
- ``plugin-oot-off``: sglang-fl on with ``SGLANG_FL_OOT_ENABLED=0``: SGLang's own native forward
  for the fused ops; the empty-mode stand-ins and CPU platform defaults still apply.
- ``plugin-off``: ``SGLANG_PLUGINS=__none__``. On an empty install (no sglang-kernel, no working
  torchvision) native SGLang cannot start; the run reports why and compares the first two.

Rounds interleave the configurations (order alternates every round), a fresh server per
configuration and round; each round measures batch 1 and a batch of concurrent sequences.
Reported: medians with min/max over rounds and the per-round ratio to the baseline.

    .venv/bin/python benchmarks/cpu_serving.py --rounds 5
"""

from __future__ import annotations

import argparse
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


def measure(server, batch: int, new_tokens: int, prompt_len: int) -> float:
    """Output tokens per second of one /generate call with ``batch`` sequences (greedy, no EOS)."""
    prompts = [[(7 * i + 3 * j) % 500 + 10 for j in range(prompt_len)] for i in range(batch)]
    payload = {"input_ids": prompts if batch > 1 else prompts[0],
               "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}}
    start = time.perf_counter()
    out = server.post_json("/generate", payload, timeout=600)
    seconds = time.perf_counter() - start
    items = out if isinstance(out, list) else [out]
    tokens = sum(item["meta_info"]["completion_tokens"] for item in items)
    if tokens != batch * new_tokens:
        raise RuntimeError(f"expected {batch * new_tokens} tokens, got {tokens}")
    return tokens / seconds


def run_config(name, model, server_args, batches, new_tokens, prompt_len, workdir):
    env = {k: None for k in CLEARED}
    env.update(CONFIGS[name])
    log = Path(workdir) / f"{name}-{time.time_ns()}.log"
    with launched_server(model, server_args, env, log_path=log, timeout=300) as srv:
        measure(srv, 1, 8, prompt_len)  # warm-up: first-call allocations, lazy init
        return {bs: measure(srv, bs, new_tokens, prompt_len) for bs in batches}


def summarize(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples), "samples": samples}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model path (default: the embedded tiny Qwen2, built if needed)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--server-args", default="--dtype float32",
                        help="extra launch_server options (float32: SGLang's auto picks float16, slow on CPU)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} must be >= 1")
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
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            if name in unavailable:
                continue
            try:
                got = run_config(name, model, server_args, batches, args.new_tokens, args.prompt_len, workdir)
            except ServerStartError as exc:
                tail = [ln for ln in str(exc).splitlines() if ln.strip()][-1]
                unavailable[name] = f"server did not start: {tail.strip()}"
                print(f"[round {r + 1}] {name}: cannot run here ({unavailable[name]})", file=sys.stderr)
                continue
            for bs, tps in got.items():
                results[name][bs].append(tps)
            print(f"[round {r + 1}] {name}: " + ", ".join(f"bs{bs} {t:.1f} tok/s" for bs, t in got.items()),
                  file=sys.stderr)

    measured = [n for n in names if n not in unavailable]
    baseline = "plugin-off" if "plugin-off" in measured else "plugin-oot-off"
    report = {
        "model": model, "server_args": server_args, "rounds": args.rounds,
        "new_tokens": args.new_tokens, "prompt_len": args.prompt_len,
        "unavailable": unavailable, "baseline": baseline,
        "throughput_tok_s": {n: {str(bs): summarize(results[n][bs]) for bs in batches} for n in measured},
        "ratio_plugin_reference_to_baseline": {},
    }
    if "plugin-reference" in measured and baseline in measured:
        for bs in batches:
            per_round = [a / b for a, b in zip(results["plugin-reference"][bs], results[baseline][bs], strict=True)]
            report["ratio_plugin_reference_to_baseline"][str(bs)] = summarize(per_round)

    print(json.dumps(report, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{'config':<18} {'batch':>5} {'median tok/s':>13} {'min':>9} {'max':>9}")
    for n in measured:
        for bs in batches:
            s = report["throughput_tok_s"][n][str(bs)]
            print(f"{n:<18} {bs:>5} {s['median']:>13.1f} {s['min']:>9.1f} {s['max']:>9.1f}")
    for bs, s in report["ratio_plugin_reference_to_baseline"].items():
        print(f"ratio plugin-reference / {baseline}, batch {bs}: median {s['median']:.3f} "
              f"(min {s['min']:.3f}, max {s['max']:.3f}, {s['n']} rounds)")
    for n, why in unavailable.items():
        print(f"{n}: not measured -- {why}")
    return 0 if "plugin-reference" in measured else 1


if __name__ == "__main__":
    sys.exit(main())
