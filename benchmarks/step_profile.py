"""Where a step's time goes on a GPU, per configuration, one server at a time, from SGLang's own
torch-profiler trace (``/start_profile``, read by trace_analysis.py) and, for decode, py-spy.

    python benchmarks/step_profile.py --phase decode --model DIR --out OUT_DIR \\
        [--configs fl-defaults,flagos-L1off] [--batches 1,32] [--seconds 6]
    python benchmarks/step_profile.py --phase prefill --model DIR --out OUT_DIR \\
        [--configs native-L1off,flagos-L1off] [--shapes 1x512,4x512,8x2048] [--repeats 2]

decode, per configuration and batch: decode tok/s over a long generation; from the trace, the
decode steps (CUDA graph launches), wall time per step (first kernel start to last kernel end)
and GPU busy time per step (union of kernel intervals): wall - busy is time the GPU waited for
the host (launch, scheduling, sampling, result processing). From py-spy (``--format raw``, the
scheduler process's threads): the share of samples in each function, inclusive, and the top leaf
functions.

prefill, per configuration and shape BATCHxTOKENS (requests of one new token, each with prompts
of its own so that the radix cache reuses nothing): two warm-up requests (JIT, autotuning), the
untraced latency (median of 3), then ``--repeats`` requests inside one trace. Per forward: wall,
GPU busy, GPU idle; per kernel name: calls, GPU time, host time in the launch calls and since
the previous launch, GPU idle time just before it; then a verdict: the share of the prefill wall
the GPU sat idle per configuration, and each configuration's extra wall against native-L1off
split into extra busy and extra idle time (launch-bound when idle dominates). The trace is taken
with ``with_stack`` and ``record_shapes`` off (both add host time per op); the profiler's own
per-op cost remains, which the traced against untraced latency shows.

Writes OUT_DIR/<phase>-profile.json (after each configuration) and prints tables. Servers use
e2e_bench's SERVER_ARGS (SGLang's defaults otherwise; the JSON lists them).
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e_bench import (  # noqa: E402
    SERVER_ARGS,
    _version_args,
    generate,
    model_vocab,
    pick_anchor,
    prompts,
    resolve_configs,
)
from trace_analysis import analyze_trace_dir, busy_union, read_events, trace_files, verdict  # noqa: E402


def scheduler_pid(server_pid: int) -> int | None:
    """The SGLang scheduler process under the server (its title names it)."""
    import psutil

    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline()) + " " + child.name()
        except psutil.Error:
            continue
        if "scheduler" in title.lower():
            return child.pid
    return None


def trace_steps(trace_dir: Path) -> dict:
    """Decode steps, wall and GPU-busy microseconds per step, from the newest trace there."""
    files = trace_files(trace_dir)
    if not files:
        return {"error": f"no trace file under {trace_dir}"}
    path = files[-1]
    try:
        events = read_events(path)
    except ValueError as exc:
        return {"error": str(exc)}
    kernels = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    launches = [e for e in events if e.get("ph") == "X" and e.get("name") in ("cudaGraphLaunch",
                                                                             "cuGraphLaunch")]
    if not kernels:
        return {"error": "no GPU kernels in the trace", "file": Path(path).name}
    busy = busy_union(kernels)
    steps = max(len(launches), 1)
    wall = kernels[-1][1] - kernels[0][0]
    return {"file": Path(path).name, "graph_launches": len(launches), "kernels": len(kernels),
            "wall_us_per_step": wall / steps, "gpu_busy_us_per_step": busy / steps,
            "host_wait_us_per_step": (wall - busy) / steps}


def pyspy_summary(raw: Path, top: int = 60) -> dict:
    """Inclusive and leaf shares of samples per function from ``py-spy record --format raw``."""
    inclusive, leaf, total = collections.Counter(), collections.Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (")[0] for f in stack.split(";")]
        total += n
        for name in set(frames):
            inclusive[name] += n
        leaf[frames[-1]] += n
    share = lambda c: [(name, round(100 * v / total, 1)) for name, v in c.most_common(top)]  # noqa: E731
    return {"samples": total, "inclusive_pct": share(inclusive), "leaf_pct": share(leaf)}


def profile_one(server, vocab, batch, seconds, out_dir: Path, tag: str, py_spy: str | None) -> dict:
    """One decode batch size, in three generations so that no tool perturbs another's number:
    the speed untouched, then py-spy of the scheduler, then the torch profiler's trace (the
    trace's own export shows in py-spy and slows steps, so neither overlaps the other)."""
    ids = prompts(batch, 128, vocab, seed=batch)
    generate(server, ids, 8)  # warm: this batch size's graph and kernels
    new_tokens = 4096 if batch == 1 else 1024
    result: dict = {}

    def decode():
        t_one = generate(server, ids, 1)[0]
        dt, _ = generate(server, ids, new_tokens, timeout=600)
        return dt, batch * (new_tokens - 1) / max(dt - t_one, 1e-9)

    dt, result["decode_tok_s"] = decode()
    result["decode_seconds"] = round(dt, 2)

    pid = scheduler_pid(server.process.pid)
    if py_spy and pid:
        raw = out_dir / f"pyspy-{tag}.txt"
        worker = _background(decode)
        time.sleep(1.0)  # into the decode phase
        run_spy = subprocess.run([py_spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "400",
                                  "--format", "raw", "-o", str(raw), "--nonblocking"],
                                 capture_output=True, text=True, timeout=seconds + 60)
        worker.join(timeout=600)
        result["pyspy"] = (pyspy_summary(raw) if raw.is_file()
                           else {"error": (run_spy.stderr or run_spy.stdout)[-500:]})
    else:
        result["pyspy"] = {"error": "py-spy not installed" if not py_spy else "no scheduler process"}

    trace_dir = out_dir / f"trace-{tag}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    worker = _background(decode)
    time.sleep(1.0)
    try:
        server.post_json("/start_profile", {"output_dir": str(trace_dir), "num_steps": 40,
                                            "activities": ["CPU", "GPU"]}, timeout=60)
    except Exception as exc:  # noqa: BLE001 - reported with the other numbers
        result["profile_error"] = f"{type(exc).__name__}: {exc}"[:300]
    worker.join(timeout=600)
    for _ in range(20):  # the trace is written when the profiled steps end
        step = trace_steps(trace_dir)
        if "error" not in step or "profile_error" in result:
            break
        time.sleep(1)
    result["trace"] = step
    return result


def _background(fn):
    worker = threading.Thread(target=fn, daemon=True)
    worker.start()
    return worker


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``1x512,8x2048`` -> [(1, 512), (8, 2048)] (requests x prompt tokens each)."""
    shapes = []
    for item in text.split(","):
        batch, sep, tokens = item.strip().lower().partition("x")
        if not (sep and batch.isdigit() and tokens.isdigit() and min(int(batch), int(tokens)) > 0):
            raise ValueError(f"--shapes: {item!r} is not BATCHxTOKENS with positive integers "
                             "(e.g. 1x512,8x2048)")
        shapes.append((int(batch), int(tokens)))
    return shapes


def prefill_one(server, vocab, batch: int, tokens: int, repeats: int, out_dir: Path, tag: str,
                gap_us: float) -> dict:
    """One shape's prefill: untraced latency, then ``repeats`` requests under the profiler."""
    def request(name):
        return generate(server, prompts(batch, tokens, vocab, f"{tag}/{name}"), 1)[0]

    for i in range(2):  # Triton JIT and autotuning at this shape, out of the measurement
        request(f"warm{i}")
    untraced = sorted(request(f"plain{i}") for i in range(3))[1]
    trace_dir = out_dir / f"trace-{tag}"
    shutil.rmtree(trace_dir, ignore_errors=True)  # a trace of an earlier run would be pooled
    server.post_json("/start_profile", {"output_dir": str(trace_dir), "activities": ["CPU", "GPU"],
                                        "with_stack": False, "record_shapes": False}, timeout=60)
    try:
        traced = sorted(request(f"traced{i}") for i in range(repeats))
    finally:
        server.post_json("/stop_profile", {}, timeout=300)
    return {"batch": batch, "tokens": tokens, "untraced_ms": untraced * 1e3,
            "traced_ms": traced[len(traced) // 2] * 1e3,
            "trace": analyze_trace_dir(trace_dir, gap_us, phase="prefill")}


def decode_cases(args, server, vocab, name, out):
    for batch in args.batches:
        tag = f"{name}-bs{batch}"
        res = profile_one(server, vocab, batch, args.seconds, out, tag, args.py_spy)
        print(tag, json.dumps({k: v for k, v in res.items() if k != "pyspy"}), flush=True)
        yield tag, res


def prefill_cases(args, server, vocab, name, out):
    for batch, tokens in args.shapes:
        shape = f"{batch}x{tokens}"
        res = prefill_one(server, vocab, batch, tokens, args.repeats, out, f"{name}-{shape}",
                          args.gap_us)
        t = res["trace"].get("totals")
        print(f"{name} {shape}: untraced {res['untraced_ms']:.1f} ms, traced "
              f"{res['traced_ms']:.1f} ms, "
              + (f"GPU idle {t['idle_share']:.0%} of {len(res['trace']['forwards'])} forwards"
                 if t else res["trace"].get("error", "?")), flush=True)
        yield shape, res


def decode_table(doc) -> list[str]:
    lines = [f"{'case':<24} {'tok/s':>8} {'wall us':>8} {'gpu us':>8} {'host wait':>9}  "
             "top inclusive (py-spy)"]
    for tag, r in doc["results"].items():
        t = r.get("trace", {})
        spy = ", ".join(f"{n} {p}%" for n, p in r.get("pyspy", {}).get("inclusive_pct", [])[3:9])
        lines.append(f"{tag:<24} {r.get('decode_tok_s', 0):>8.0f} {t.get('wall_us_per_step', 0):>8.0f} "
                     f"{t.get('gpu_busy_us_per_step', 0):>8.0f} {t.get('host_wait_us_per_step', 0):>9.0f}  {spy}")
    return lines


def prefill_table(doc, top: int) -> list[str]:
    """Per case, one forward's mean; per configuration, its top kernels by idle gap before them
    (pooled over shapes); then the verdict."""
    lines = [f"{'config':<16} {'shape':<8} {'untraced ms':>11} {'traced ms':>9} {'fwds':>4} "
             f"{'wall ms':>8} {'busy ms':>8} {'idle ms':>8} {'idle':>5} {'kernels':>7}"]
    traces = {}
    for config, shapes in doc["results"].items():
        if shapes:
            traces[config] = {shape: r["trace"] for shape, r in shapes.items()}
        for shape, r in shapes.items():
            t, n = r["trace"].get("totals"), len(r["trace"].get("forwards", ())) or 1
            cells = (f"{n:>4} {t['wall_us'] / n / 1e3:>8.2f} {t['busy_us'] / n / 1e3:>8.2f} "
                     f"{t['idle_us'] / n / 1e3:>8.2f} {t['idle_share']:>5.0%} "
                     f"{t['kernels'] / n:>7.0f}" if t else r["trace"].get("error", "?"))
            lines.append(f"{config:<16} {shape:<8} {r['untraced_ms']:>11.1f} "
                         f"{r['traced_ms']:>9.1f} {cells}")
    for config, shapes in traces.items():
        rows = collections.defaultdict(collections.Counter)
        for a in shapes.values():
            for row in a.get("kernels", ()):
                rows[row["name"]].update({k: v for k, v in row.items() if k != "name"})
        lines += ["", f"{config}: top {top} kernels by GPU idle before them (all shapes)",
                  f"  {'kernel':<60} {'calls':>6} {'gpu us/call':>11} {'launch us':>9} "
                  f"{'host us/call':>12} {'idle ms':>8}"]
        for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["idle_before_us"])[:top]:
            launched = r["launched"] or 1
            lines.append(f"  {name[:60]:<60} {r['count']:>6.0f} {r['gpu_us'] / r['count']:>11.1f} "
                         f"{r['launch_us'] / launched:>9.1f} {r['host_us'] / launched:>12.1f} "
                         f"{r['idle_before_us'] / 1e3:>8.2f}")
    return [*lines, "", *verdict(traces, pick_anchor(None, list(traces)) if traces else "")]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", help="default: fl-defaults,flagos-L1off (decode), "
                                      "native-L1off,flagos-L1off (prefill)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--mem-fraction", type=float, default=0.5)
    ap.add_argument("--batches", default="1,32", help="decode: batch sizes")
    ap.add_argument("--seconds", type=int, default=6, help="decode: py-spy sampling time per case")
    ap.add_argument("--shapes", default="1x512,4x512,8x2048", help="prefill: BATCHxTOKENS list")
    ap.add_argument("--repeats", type=int, default=2, help="prefill: traced requests per shape")
    ap.add_argument("--gap-us", type=float, default=1000.0,
                    help="prefill: a GPU idle gap that splits forwards in a trace without "
                         "SGLang's step[...] spans")
    ap.add_argument("--top", type=int, default=12, help="prefill: kernels listed per configuration")
    args = ap.parse_args(argv)
    try:
        args.shapes = parse_shapes(args.shapes)
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError as exc:
        ap.error(str(exc))
    if args.repeats < 1 or min(args.batches) < 1:
        ap.error("--repeats and --batches take positive integers")
    args.configs = args.configs or ("fl-defaults,flagos-L1off" if args.phase == "decode"
                                    else "native-L1off,flagos-L1off")
    return args


def main(argv=None) -> int:
    from sglang_fl.serving import launched_server

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.py_spy = shutil.which("py-spy") if args.phase == "decode" else None
    vocab = model_vocab(args.model)
    cases = decode_cases if args.phase == "decode" else prefill_cases
    import importlib.metadata as md

    doc = {"phase": args.phase, "sglang": md.version("sglang"), "model": args.model,
           "server_args": [*SERVER_ARGS, *_version_args()], "results": {}}
    for name, (env, extra) in resolve_configs(args.configs.split(",")).items():
        log = Path(tempfile.mkdtemp(prefix="step-profile-")) / "server.log"
        env = {**env, "SGLANG_TORCH_PROFILER_DIR": str(out / f"trace-{name}")}
        results = doc["results"] if args.phase == "decode" else doc["results"].setdefault(name, {})
        try:
            with launched_server(args.model, [*SERVER_ARGS, *_version_args(), *extra,
                                              "--mem-fraction-static", str(args.mem_fraction)],
                                 env=env, log_path=log, timeout=400) as server:
                for tag, res in cases(args, server, vocab, name, out):
                    results[tag] = res
        except Exception as exc:  # noqa: BLE001 - recorded, the next configuration runs
            doc.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[-2000:]
            shutil.copy(log, out / f"server-{name}-failed.log") if log.is_file() else None
            print(name, "failed:", doc["errors"][name][-600:], flush=True)
        # after each configuration: a run cut by a time limit keeps what it measured
        (out / f"{args.phase}-profile.json").write_text(json.dumps(doc, indent=1))
    lines = decode_table(doc) if args.phase == "decode" else prefill_table(doc, args.top)
    lines += [f"{name} failed: {error[-300:]}" for name, error in doc.get("errors", {}).items()]
    print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
