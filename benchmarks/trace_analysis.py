"""Where a forward's GPU time goes, from torch-profiler (Kineto) Chrome traces: the reader that
benchmarks/step_profile.py runs on SGLang's ``/start_profile`` output, kept apart from the
server driving so that it runs (and is tested) on any machine.

A forward's *wall* is first kernel start to last kernel end, its *busy* time the union of its
kernel intervals; wall - busy is time the GPU waited for the host. Each kernel is matched to
the host call that enqueued it (a CUDA runtime or driver event with the same ``correlation``
id) and is charged the GPU idle gap before it and the host time since the previous launch: a
launch-bound forward shows large gaps behind cheap kernels, each after ~the same host time.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
from pathlib import Path

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATS = ("cuda_runtime", "cuda_driver")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
            "cudaLaunchCooperativeKernel", *GRAPH_LAUNCHES)
#: SGLang (0.5.11 and 0.5.23) marks each forward, while profiling, with a CPU span named
#: ``step[MODE ...]`` (model_runner.forward). The span prefixes of each phase:
STEP_SPANS = {None: ("step[",), "prefill": ("step[EXTEND", "step[MIXED", "step[SPLIT_PREFILL")}
#: Per kernel name: calls, GPU time, calls matched to a launch, host time in those launch calls,
#: host time since the previous kernel's launch, and GPU idle time just before the kernel.
ROW_KEYS = ("count", "gpu_us", "launched", "launch_us", "host_us", "idle_before_us")


def trace_files(trace_dir: Path) -> list[str]:
    """Every Chrome trace under ``trace_dir`` (``.json`` or ``.json.gz``), oldest first."""
    found = {p for pattern in ("*.json", "*.json.gz")
             for p in glob.glob(str(Path(trace_dir) / "**" / pattern), recursive=True)}
    return sorted(found, key=os.path.getmtime)


def read_events(path: str) -> list[dict]:
    """The trace's events; ValueError names the file when it is not a readable trace."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, EOFError, ValueError) as exc:
        raise ValueError(f"{os.path.basename(path)}: not a readable trace ({exc})") from exc
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ValueError(f"{os.path.basename(path)}: no traceEvents list")
    return [e for e in events if isinstance(e, dict)]


def busy_union(intervals) -> float:
    """Total length of the union of (start, end) intervals."""
    busy, start, end = 0.0, None, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                busy += end - start
            start, end = s, e
        else:
            end = max(end, e)
    return busy + (end - start if end is not None else 0.0)


def kernel_group(name: str) -> str:
    """A kernel's name without its template and argument lists (``void ns::k<...>(...)`` ->
    ``ns::k``); Triton kernels keep their function name, so a FlagGems op reads as itself."""
    name = name.removeprefix("void ")
    for stop in ("(", "<"):
        name = name.split(stop, 1)[0]
    return name.strip() or "?"


def _corr(event) -> object:
    return (event.get("args") or {}).get("correlation")


def _complete(events, cats):
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats
            and isinstance(e.get("ts"), (int, float))]


def split_forwards(kernels, launch_of, spans, gap_us):
    """Kernels per forward: those launched inside each step span, else (``spans`` None: the
    trace has none) runs of kernels separated by GPU idle gaps longer than ``gap_us``. Returns
    (name, kernels) pairs and the kernels left out of every forward."""
    if spans is not None:
        forwards, taken = [], set()
        for span in sorted(spans, key=lambda s: s["ts"]):
            lo, hi = span["ts"], span["ts"] + span.get("dur", 0)
            members = [k for k in kernels if id(k) not in taken and (launch := launch_of.get(id(k)))
                       and lo <= launch["ts"] <= hi]
            taken.update(map(id, members))
            if members:
                forwards.append((span["name"], members))
        return forwards, [k for k in kernels if id(k) not in taken]
    forwards, current, end = [], [], 0.0
    for k in kernels:
        if current and k["ts"] - end > gap_us:
            forwards.append((f"segment {len(forwards) + 1}", current))
            current = []
        end = max(end, k["ts"] + k["dur"]) if current else k["ts"] + k["dur"]
        current.append(k)
    if current:
        forwards.append((f"segment {len(forwards) + 1}", current))
    return forwards, []


def analyze_events(events, gap_us: float = 1000.0, phase: str | None = None):
    """(forwards, per-kernel rows, left-out kernels) of one trace file's events. ``phase``
    "prefill" keeps the forwards of prefill spans only, leaving out the decode step that SGLang
    runs after a prefill even for a one-token request; in a trace without spans it leaves out
    CUDA-graph replays instead (with the prefill graph off, as step_profile serves, those are
    that decode step)."""
    kernels = sorted(({**e, "dur": float(e.get("dur", 0))} for e in _complete(events, GPU_CATS)),
                     key=lambda k: k["ts"])
    host = {}
    for e in _complete(events, HOST_CATS):  # a launch wins over another call of the same id
        c = _corr(e)
        if c is not None and (c not in host or e.get("name") in LAUNCHES):
            host[c] = e
    launch_of = {id(k): host[_corr(k)] for k in kernels if _corr(k) in host}
    steps = [e for e in _complete(events, ("user_annotation",))
             if str(e.get("name", "")).startswith(STEP_SPANS[None])]
    spans, replays = [e for e in steps if e["name"].startswith(STEP_SPANS[phase])], []
    if not steps:
        spans = None
        if phase == "prefill":
            graphed = {id(k) for k in kernels
                       if launch_of.get(id(k), {}).get("name") in GRAPH_LAUNCHES}
            replays = [k for k in kernels if id(k) in graphed]
            kernels = [k for k in kernels if id(k) not in graphed]
    forwards, outside = split_forwards(kernels, launch_of, spans, gap_us)
    outside += replays
    rows, out = collections.defaultdict(lambda: dict.fromkeys(ROW_KEYS, 0.0)), []
    for name, members in forwards:
        members = sorted(members, key=lambda k: k["ts"])
        wall = max(k["ts"] + k["dur"] for k in members) - members[0]["ts"]
        busy = busy_union((k["ts"], k["ts"] + k["dur"]) for k in members)
        out.append({"name": name, "kernels": len(members), "wall_us": wall, "busy_us": busy,
                    "idle_us": wall - busy})
        end, prev_launch = None, None
        for k in members:
            row, launch = rows[kernel_group(str(k.get("name", "?")))], launch_of.get(id(k))
            row["count"] += 1
            row["gpu_us"] += k["dur"]
            row["idle_before_us"] += max(0.0, k["ts"] - end) if end is not None else 0.0
            if launch is not None:
                row["launched"] += 1
                row["launch_us"] += float(launch.get("dur", 0))
                if prev_launch is not None:
                    row["host_us"] += max(0.0, launch["ts"] - prev_launch)
                prev_launch = launch["ts"]
            end = max(end, k["ts"] + k["dur"]) if end is not None else k["ts"] + k["dur"]
    return out, rows, outside


def analyze_trace_dir(trace_dir: Path, gap_us: float = 1000.0, phase: str | None = None) -> dict:
    """Forwards (of ``phase``, see `analyze_events`) and kernels of every trace file under
    ``trace_dir``, pooled (one file per rank or per profiled stage); unreadable files are
    reported, not fatal."""
    files = trace_files(trace_dir)
    if not files:
        return {"error": f"no trace file under {trace_dir}"}
    forwards, rows, errors, outside, cpu_ops = [], {}, [], [], 0
    for path in files:
        try:
            events = read_events(path)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        cpu_ops += sum(1 for e in events if e.get("cat") == "cpu_op")
        got, got_rows, left = analyze_events(events, gap_us, phase)
        forwards += [{**f, "file": os.path.basename(path)} for f in got]
        outside += left
        for name, row in got_rows.items():
            pooled = rows.setdefault(name, dict.fromkeys(ROW_KEYS, 0.0))
            for key, value in row.items():
                pooled[key] += value
    doc = {"files": [os.path.basename(p) for p in files], **({"errors": errors} if errors else {})}
    if not forwards and outside:
        return {**doc, "error": f"{len(outside)} GPU kernels, none in a {phase or 'step'} forward"}
    if not forwards:
        why = ("no GPU kernels in the trace" + (f" ({cpu_ops} CPU ops only: a CPU server's trace "
                                                 "has no GPU timeline)" if cpu_ops else ""))
        return {**doc, "error": why}
    totals = {key: sum(f[key] for f in forwards) for key in ("wall_us", "busy_us", "idle_us")}
    totals["idle_share"] = totals["idle_us"] / totals["wall_us"] if totals["wall_us"] else 0.0
    totals["kernels"] = sum(r["count"] for r in rows.values())
    totals["launched"] = sum(r["launched"] for r in rows.values())
    table = sorted(({"name": n, **{k: round(v, 1) for k, v in r.items()}} for n, r in rows.items()),
                   key=lambda r: -r["idle_before_us"])
    return {**doc, "forwards": forwards, "totals": totals, "kernels": table,
            "outside_forwards": {"kernels": len(outside), "gpu_us": sum(k["dur"] for k in outside)}}


def _per_forward(analysis: dict) -> dict | None:
    if "totals" not in analysis:
        return None
    n = len(analysis["forwards"])
    return {key: analysis["totals"][key] / n
            for key in ("wall_us", "busy_us", "idle_us", "kernels")}


def verdict(per_config: dict[str, dict[str, dict]], anchor: str, top: int = 3) -> list[str]:
    """One line per configuration (share of the prefill wall the GPU sat idle, and the kernels
    whose idle gaps dominate), then each one against ``anchor``: its extra wall per forward split
    into extra GPU busy and extra GPU idle, over the shapes both have. ``per_config`` maps
    configuration -> shape -> `analyze_trace_dir` result."""
    lines = []
    for config, shapes in per_config.items():
        done = [a for a in shapes.values() if "totals" in a]
        if not done:
            errors = "; ".join(sorted({a.get("error", "?") for a in shapes.values()}))
            lines.append(f"{config}: no GPU forward analysed ({errors})")
            continue
        wall, idle = (sum(a["totals"][k] for a in done) for k in ("wall_us", "idle_us"))
        gaps = collections.Counter()
        for a in done:
            for row in a["kernels"]:
                gaps[row["name"]] += row["idle_before_us"]
        leaders = ", ".join(f"{name} {v / idle:.0%}" for name, v in gaps.most_common(top) if idle)
        lines.append(f"{config}: GPU idle {idle / wall:.0%} of the prefill wall "
                     f"({idle / 1e3:.2f} of {wall / 1e3:.2f} ms, "
                     f"{sum(len(a['forwards']) for a in done)} forwards); idle gaps before: "
                     f"{leaders or '-'}")
    base = per_config.get(anchor, {})
    for config, shapes in per_config.items():
        pairs = [(_per_forward(shapes[s]), _per_forward(base[s])) for s in shapes
                 if config != anchor and s in base]
        pairs = [(a, b) for a, b in pairs if a and b]
        if not pairs:
            continue
        d = {k: sum(a[k] - b[k] for a, b in pairs) for k in ("wall_us", "busy_us", "idle_us")}
        ref_wall = sum(b["wall_us"] for _, b in pairs)
        kernels = (sum(a["kernels"] for a, _ in pairs), sum(b["kernels"] for _, b in pairs))
        if d["wall_us"] <= 0:
            why = "not slower"
        elif d["idle_us"] > d["busy_us"]:
            why = "launch-bound: most of the extra time is the GPU waiting for the host"
        else:
            why = "kernel-bound: most of the extra time is in the kernels themselves"
        lines.append(f"{config} vs {anchor} (one forward of each of {len(pairs)} shapes): wall "
                     f"{d['wall_us'] / 1e3:+.2f} ms ({d['wall_us'] / ref_wall:+.0%}) = GPU busy "
                     f"{d['busy_us'] / 1e3:+.2f} ms + GPU idle {d['idle_us'] / 1e3:+.2f} ms; "
                     f"kernels {kernels[0]:.0f} vs {kernels[1]:.0f} -> {why}")
    return lines
