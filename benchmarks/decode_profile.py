"""Where a decode step's time goes on a GPU: GPU busy time against wall time per step (SGLang's
own torch-profiler trace, ``/start_profile``) and the scheduler process's Python stacks
(py-spy), per configuration and batch size, one server at a time.

    python benchmarks/decode_profile.py --model DIR --configs fl-defaults,flagos-L1off \\
        --out OUT_DIR [--batches 1,32] [--seconds 6]

Per configuration and batch: decode tok/s over a long generation; from the trace, the decode
steps (CUDA graph launches), wall time per step (first kernel start to last kernel end, over the
steps) and GPU busy time per step (union of kernel intervals): wall - busy is time the GPU
waited for the host (launch, scheduling, sampling, result processing). From py-spy (``--format
raw``, the scheduler process's threads): the share of samples in each function, inclusive, and
the top leaf functions. Writes OUT_DIR/decode-profile.json and prints a table. Servers use
e2e_bench's SERVER_ARGS (SGLang's defaults otherwise; the JSON lists them).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
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
    prompts,
    resolve_configs,
)


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
    files = sorted(glob.glob(str(trace_dir / "**" / "*.json*"), recursive=True), key=os.path.getmtime)
    if not files:
        return {"error": f"no trace file under {trace_dir}"}
    path = files[-1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    kernels = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    launches = [e for e in events if e.get("ph") == "X" and e.get("name") in ("cudaGraphLaunch",
                                                                             "cuGraphLaunch")]
    if not kernels:
        return {"error": "no GPU kernels in the trace", "file": os.path.basename(path)}
    busy, start, end = 0.0, None, None
    for s, e in kernels:  # union of intervals
        if end is None or s > end:
            if end is not None:
                busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    busy += end - start
    steps = max(len(launches), 1)
    wall = kernels[-1][1] - kernels[0][0]
    return {"file": os.path.basename(path), "graph_launches": len(launches), "kernels": len(kernels),
            "wall_us_per_step": wall / steps, "gpu_busy_us_per_step": busy / steps,
            "host_wait_us_per_step": (wall - busy) / steps}


def pyspy_summary(raw: Path, top: int = 25) -> dict:
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
    ids = prompts(batch, 128, vocab, seed=batch)
    generate(server, ids, 8)  # warm: this batch size's graph and kernels
    new_tokens = 4096 if batch == 1 else 1024
    result: dict = {}

    def run():
        t0 = time.perf_counter()
        t_one = generate(server, ids, 1)[0]
        dt, _ = generate(server, ids, new_tokens, timeout=600)
        result["decode_tok_s"] = batch * (new_tokens - 1) / max(dt - t_one, 1e-9)
        result["decode_seconds"] = round(dt, 2)
        del t0

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(1.5)  # into the decode phase
    trace_dir = out_dir / f"trace-{tag}"
    trace_dir.mkdir(parents=True, exist_ok=True)
    try:
        server.post_json("/start_profile", {"output_dir": str(trace_dir), "num_steps": 40,
                                            "activities": ["CPU", "GPU"]}, timeout=60)
        time.sleep(2.0)
    except Exception as exc:  # noqa: BLE001 - reported; py-spy still runs
        result["profile_error"] = f"{type(exc).__name__}: {exc}"[:300]
    pid = scheduler_pid(server.process.pid)
    if py_spy and pid:
        raw = out_dir / f"pyspy-{tag}.txt"
        run_spy = subprocess.run([py_spy, "record", "-p", str(pid), "-d", str(seconds), "-r", "400",
                                  "--format", "raw", "-o", str(raw), "--nonblocking"],
                                 capture_output=True, text=True, timeout=seconds + 60)
        result["pyspy"] = (pyspy_summary(raw) if raw.is_file()
                           else {"error": (run_spy.stderr or run_spy.stdout)[-500:]})
    else:
        result["pyspy"] = {"error": "py-spy not installed" if not py_spy else "no scheduler process"}
    worker.join(timeout=600)
    for _ in range(20):  # the trace is written when the profiled steps end
        step = trace_steps(trace_dir)
        if "error" not in step or "profile_error" in result:
            break
        time.sleep(1)
    result["trace"] = step
    return result


def main(argv=None) -> int:
    from sglang_fl.serving import launched_server

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", default="fl-defaults,flagos-L1off")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--seconds", type=int, default=6, help="py-spy sampling time per case")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--mem-fraction", type=float, default=0.5)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy")
    vocab = model_vocab(args.model)
    import importlib.metadata as md

    doc = {"sglang": md.version("sglang"), "model": args.model,
           "server_args": [*SERVER_ARGS, *_version_args()], "results": {}}
    for name, (env, extra) in resolve_configs(args.configs.split(",")).items():
        log = Path(tempfile.mkdtemp(prefix="decode-profile-")) / "server.log"
        env = {**env, "SGLANG_TORCH_PROFILER_DIR": str(out / f"trace-{name}")}
        try:
            with launched_server(args.model, [*SERVER_ARGS, *_version_args(), *extra,
                                              "--mem-fraction-static", str(args.mem_fraction)],
                                 env=env, log_path=log, timeout=400) as server:
                for batch in map(int, args.batches.split(",")):
                    tag = f"{name}-bs{batch}"
                    doc["results"][tag] = profile_one(server, vocab, batch, args.seconds, out, tag, py_spy)
                    print(tag, json.dumps({k: v for k, v in doc["results"][tag].items()
                                           if k != "pyspy"}), flush=True)
        except Exception as exc:  # noqa: BLE001 - recorded, the next configuration runs
            doc["results"][name] = {"error": f"{type(exc).__name__}: {exc}"[-2000:]}
            shutil.copy(log, out / f"server-{name}-failed.log") if log.is_file() else None
            print(name, "failed:", doc["results"][name]["error"][-600:], flush=True)
    (out / "decode-profile.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{'case':<24} {'tok/s':>8} {'wall us':>8} {'gpu us':>8} {'host wait':>9}  top inclusive (py-spy)")
    for tag, r in doc["results"].items():
        t = r.get("trace", {})
        spy = ", ".join(f"{n} {p}%" for n, p in r.get("pyspy", {}).get("inclusive_pct", [])[3:9])
        print(f"{tag:<24} {r.get('decode_tok_s', 0):>8.0f} {t.get('wall_us_per_step', 0):>8.0f} "
              f"{t.get('gpu_busy_us_per_step', 0):>8.0f} {t.get('host_wait_us_per_step', 0):>9.0f}  {spy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
