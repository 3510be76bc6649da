"""What one eager launch of a Triton kernel costs on this GPU host, by launch path (issue 30
item 2b: is a cheaper launch worth building?). The kernel is sglang-fl's in-place RoPE
(sglang_fl/kernels/rope.py), the flagos backend's ``rotary_embedding``; per token count:

- ``wrapper``: ``rotary_embedding_inplace(...)`` as the backend calls it (its Python, then
  sglang-fl's bound launch, ``sglang_fl/kernels/launch.py``);
- ``wrapper-jit``: the same Python, then ``JITFunction.run`` (the wrapper until 2026-12-05);
- ``jit``: ``kernel[grid](*args, **meta)`` with the arguments computed once
  (``JITFunction.run`` alone: Triton's binder and specialisation key, the cache lookup, the
  launch);
- ``launch``: sglang-fl's bound launch with the arguments computed once (Triton's
  specialisation of each argument as the key, then the compiled runner);
- ``bound``: the ``CompiledKernel`` that run returned, its runner made once per shape and called
  with every argument in signature order (what FlagGems' LibEntry does on Triton 3.3-3.6): no
  binder, no key: the floor of a host-side launch;
- ``graph``: the same call captured ``--per-graph`` times in a CUDA graph and replayed: the kernel
  alone.

Each is timed with CUDA events around ``--calls`` back-to-back calls (host-bound wherever the
launch costs more than the kernel), ``--repeats`` times, the paths in rotating order; medians
with min and max. Before timing, every path must write exactly what ``wrapper`` writes.
``launch - jit`` is what sglang-fl's bound launch saves per call, ``jit - graph`` what the
launch costs over the kernel. JSON (``--out``) and a markdown table.

    python benchmarks/launch_cost.py --out launch-cost.json    # on a CUDA host with Triton
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PATHS = ("wrapper", "wrapper-jit", "jit", "launch", "bound", "graph")


def ordered_args(arg_names, args, meta):
    """Every kernel parameter in signature order: the positional ``args`` first, then the
    constexprs from ``meta`` (launch options such as num_warps are not parameters)."""
    given = dict(zip(arg_names, args, strict=False))  # the constexprs come after
    missing = [n for n in arg_names if n not in given and n not in meta]
    if missing:
        raise ValueError(f"no value for kernel parameter(s) {', '.join(missing)}")
    return [given[n] if n in given else meta[n] for n in arg_names]


def bound_call(kernel, grid, args, meta):
    """A no-argument callable launching ``kernel`` through its compiled runner: compiled (or
    found) once by ``JITFunction.run(warmup=True)``, runner made once for ``grid``."""
    compiled = kernel.run(*args, grid=grid, warmup=True, **meta)
    if hasattr(compiled, "result"):  # an asynchronous compile
        compiled = compiled.result()
    runner = compiled[tuple(grid) + (1,) * (3 - len(grid))]
    all_args = ordered_args(kernel.arg_names, args, meta)
    return lambda: runner(*all_args)


def table(doc):
    head = ["tokens", *[f"{p} us" for p in PATHS], "launch - jit", "jit - graph"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for tokens, row in doc["results"].items():
        med = {p: row[p]["median"] for p in PATHS if p in row}
        cells = [str(tokens)]
        cells += [f"{row[p]['median']:.2f} ({row[p]['min']:.2f}-{row[p]['max']:.2f})" if p in row
                  else row.get("errors", {}).get(p, "-")[:60] for p in PATHS]
        cells.append(f"{med['launch'] - med['jit']:+.2f}" if {"launch", "jit"} <= med.keys() else "-")
        cells.append(f"{med['jit'] - med['graph']:+.2f}" if {"jit", "graph"} <= med.keys() else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", default="1,512,4096")
    ap.add_argument("--q-heads", type=int, default=14, help="default: Qwen2.5-0.5B's 14 q heads")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-size", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200, help="calls per timing")
    ap.add_argument("--per-graph", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from op_bench import make_graph, summarize, time_eager, time_graph, versions
    from report import publish

    from sglang_fl.kernels import launch, rope

    dev, hd, dtype = "cuda", args.head_size, torch.bfloat16
    inv_freq = 1.0 / (1_000_000 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    freqs = torch.outer(torch.arange(32768, device=dev).float(), inv_freq)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    kernel = rope._kernel()
    doc = {"benchmark": "launch_cost", "kernel": "sglang_fl.kernels.rope (in-place RoPE)",
           "q_heads": args.q_heads, "kv_heads": args.kv_heads, "head_size": hd, "dtype": "bfloat16",
           "calls": args.calls, "per_graph": args.per_graph, "repeats": args.repeats,
           "versions": versions(), "results": {}}
    for tokens in (int(t) for t in args.tokens.split(",")):
        qkv = torch.randn(tokens, (args.q_heads + 2 * args.kv_heads) * hd, device=dev, dtype=dtype)
        q, k, _ = qkv.split([args.q_heads * hd, args.kv_heads * hd, args.kv_heads * hd], dim=-1)
        pos = torch.randint(0, 32768, (tokens,), device=dev)
        grid, kargs, meta = rope.launch_plan(q, k, cos, sin, pos, hd)
        def wrapper_jit(q=q, k=k, pos=pos):
            g, a, m = rope.launch_plan(q, k, cos, sin, pos, hd)
            kernel[g](*a, **m)

        calls = {"wrapper": lambda q=q, k=k, pos=pos: rope.rotary_embedding_inplace(q, k, cos, sin, pos, hd),
                 "wrapper-jit": wrapper_jit,
                 "jit": lambda grid=grid, kargs=kargs, meta=meta: kernel[grid](*kargs, **meta),
                 "launch": lambda grid=grid, kargs=kargs, meta=meta: launch.launch(kernel, grid, kargs, meta)}
        row, errors = {}, {}
        try:
            calls["bound"] = bound_call(kernel, grid, kargs, meta)
        except Exception as exc:  # noqa: BLE001 - reported, the other paths still timed
            errors["bound"] = f"{type(exc).__name__}: {exc}"
        # Each path must write what the wrapper writes (same input, exact).
        x = qkv.clone()
        rope.rotary_embedding_inplace(q, k, cos, sin, pos, hd)
        want = qkv.clone()
        for name in [n for n in PATHS if n in calls and n != "wrapper"]:
            qkv.copy_(x)
            calls[name]()
            torch.cuda.synchronize()
            if not torch.equal(qkv, want):
                errors[name] = "output differs from the wrapper's"
                del calls[name]
        graph = None
        try:
            graph = make_graph(calls["wrapper"], args.per_graph)
        except Exception as exc:  # noqa: BLE001
            errors["graph"] = f"{type(exc).__name__}: {exc}"
        samples = {p: [] for p in PATHS}
        order = [p for p in PATHS if p in calls or (p == "graph" and graph is not None)]
        for r in range(args.repeats):
            for p in order[r % len(order):] + order[:r % len(order)]:
                if p == "graph":
                    samples[p].append(time_graph(graph, args.per_graph, 3))
                else:
                    samples[p].append(time_eager(calls[p], args.calls))
        row = {p: summarize(v) for p, v in samples.items() if v}
        if errors:
            row["errors"] = errors
        doc["results"][tokens] = row
        del graph
    return publish(doc, args.out, table)


if __name__ == "__main__":
    main()
