"""Per-op GPU benchmark of the Layer-2 backends: FlagGems (``flagos``) vs the pure-PyTorch
``reference`` vs SGLang's own CUDA kernels (``vendor.cuda``: sgl_kernel and sglang.jit_kernel),
each called exactly as sglang-fl calls it (``backend.op(layer, ...)`` on a real SGLang layer).

Two timings per case, both with CUDA events:
- ``graph``: ``--per-graph`` calls captured in one CUDA graph, replayed; the time a served model
  pays per call under CUDA-graph decode (launch overhead gone).
- ``eager``: the same calls launched one by one from Python; what prefill and
  ``--disable-cuda-graph`` runs pay, launch overhead and Python wrappers included.

Backends are interleaved (each repeat runs every backend once, in rotating order) and the
median over ``--repeats`` is reported with min and max. Writes JSON (``--out``) and prints a
markdown table.

    python benchmarks/op_bench.py --out benchmarks/results/h200/ops.json
    python benchmarks/op_bench.py --backends flagos,vendor.cuda --tokens 512,2048,4096,16384 \\
        --ops rms_norm,fused_add_rms_norm,rotary_embedding,silu_and_mul --out prefill-ops.json
    python benchmarks/op_bench.py --model /tmp/shapes-qwen3.6-27b --backends flagos,vendor.cuda \\
        --tokens 2048,8192 --out qwen3.6-27b-prefill-ops.json

The second is the prefill view (gpu_session.sh prefillprofile): prefill runs eager, so its
"eager - graph" column is the launch overhead each call pays there.

The third times the ops at one checkpoint's own shapes (``--model``: a Hugging Face model
directory or its config.json, read by ``sglang-fl tune``'s `ModelShapes.from_model`) instead of
the built-in shape list: each op the model uses, with the inputs ``sglang-fl tune`` builds
(`build_case`), one row per variant (``rms_norm`` / ``gemma_rms_norm`` plain, and with the
residual as ``fused_add_rms_norm`` / ``fused_add_gemma_rms_norm``). Ops the model does not use
(``topk`` on a dense model) are listed once on stderr; the shapes head the table and sit in
the JSON's settings (``model``). Token caps are the built-in list's:
GDN decode ops stop at tune's MAX_DECODE_SEQUENCES, and the GDN prefill ops at 2,048 tokens only
when the slow ``reference`` backend is among ``--backends``. ``--ops`` filters by row name.
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from gpu_support import make_rms_norm, make_rope, make_silu_and_mul, rope_caches  # noqa: E402
from report import publish  # noqa: E402

from sglang_fl.tune import (  # noqa: E402
    GDN,
    GDN_DECODE_OPS,
    MAX_DECODE_SEQUENCES,
    TUNABLE,
    UNUSED,
    ModelShapes,
    TuneError,
    build_case,
    uses,
)

DTYPE = torch.bfloat16


def gdn_shapes(value_heads: int) -> ModelShapes:
    """Qwen3.6's GDN layer: 16 key heads of 128, ``value_heads`` value heads of 128, conv 4."""
    return ModelShapes(hidden=2048, heads=16, kv_heads=2, head_dim=256, linear_key_heads=16,
                       linear_value_heads=value_heads, linear_key_dim=128, linear_value_dim=128,
                       conv_kernel=4, source="Qwen3.6 GDN layer")


DEFAULT_TOKENS = (1, 32, 256, 2048, 8192)
QUICK_TOKENS = (1, 256)


def _cases(tokens):
    for hidden in (896, 4096):
        for t in tokens:
            yield ("rms_norm", dict(tokens=t, hidden=hidden))
            yield ("fused_add_rms_norm", dict(tokens=t, hidden=hidden))
    for inter in (4864, 14336):
        for t in tokens:
            yield ("silu_and_mul", dict(tokens=t, intermediate=inter))
    for hd, qh, kh in ((64, 14, 2), (128, 32, 8)):
        for t in tokens:
            yield ("rotary_embedding", dict(tokens=t, head_size=hd, q_heads=qh, kv_heads=kh))
    # Routing: Qwen3-30B-A3B (softmax, renormalised) and DeepSeek-V3 (sigmoid + bias, grouped).
    for experts, k, scoring, groups in ((128, 8, "softmax", 0), (256, 8, "sigmoid", 8)):
        for t in tokens:
            yield ("topk", dict(tokens=t, experts=experts, top_k=k, scoring=scoring, groups=groups))
    # Expert compute: Qwen3-30B-A3B's experts (128 x [768, 2048], 8 per token).
    for experts, k, hidden, inter in ((128, 8, 2048, 768),):
        for t in tokens:
            yield ("fused_moe", dict(tokens=t, experts=experts, top_k=k, hidden=hidden,
                                     intermediate=inter))
    # Gated DeltaNet (Qwen3.6-35B-A3B: 16 key / 32 value heads; Qwen3.6-27B: 48 value heads),
    # inputs as `sglang-fl tune` builds them: prefill ops on sequences of at most
    # PREFILL_SEQUENCE tokens, decode ops on `tokens` one-token sequences through a state pool.
    # Prefill ops stop at 2048 tokens (the reference's chunk loop is slow), decode ops at tune's
    # MAX_DECODE_SEQUENCES (above it their case is capped, so the row would not be what it says).
    for value_heads in (32, 48):
        for op in GDN:
            top = token_cap(op)
            for t in (t for t in tokens if t <= top):
                yield (op, dict(tokens=t, value_heads=value_heads))


def token_cap(op, reference=True):
    """The most tokens ``op`` is timed at, None for no cap: GDN decode ops at tune's
    MAX_DECODE_SEQUENCES (above it tune's case is capped, so the row would not be what it says),
    GDN prefill ops at 2,048 where the ``reference`` backend runs (its chunk loop is slow)."""
    if op in GDN_DECODE_OPS:
        return MAX_DECODE_SEQUENCES
    return 2048 if op in GDN and reference else None


def variant_names(op):
    """Row names of ``op``'s `build_case` variants, in order: the op, then its fused-add case
    (``rms_norm``'s and ``gemma_rms_norm``'s variant 1 takes the residual)."""
    return (op, *(case for case, of in _OP_OF.items() if of == op))


def model_ops(shapes):
    """`TUNABLE` split into (used, unused) by ``shapes`` (tune's `uses`, as `build_case` decides)."""
    used = tuple(op for op in TUNABLE if uses(op, shapes))
    return used, tuple(op for op in TUNABLE if op not in used)


def model_cases(shapes, tokens, backends):
    """(row name, op, variant, params) of every case ``--model`` times: each op the model uses,
    each of its variants, at each of ``tokens`` up to the op's `token_cap`."""
    reference = "reference" in backends
    for op in model_ops(shapes)[0]:
        top = token_cap(op, reference)
        for variant, name in enumerate(variant_names(op)):
            for t in tokens:
                if top is None or t <= top:
                    yield (name, op, variant, dict(tokens=t))


_GEN = None


def _randn(*shape):
    """Inputs from a private generator: a capture that fails (an impl with a host sync) leaves
    the default CUDA generator unusable ("Offset increment outside graph capture")."""
    global _GEN
    if _GEN is None:
        _GEN = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn(*shape, device="cuda", dtype=DTYPE, generator=_GEN)


def build_call(op, p, backend):
    """A zero-argument closure running one call of ``op`` on ``backend``."""
    if op in ("rms_norm", "fused_add_rms_norm"):
        layer = make_rms_norm(p["hidden"], DTYPE)
        x, r = _randn(p["tokens"], p["hidden"]), _randn(p["tokens"], p["hidden"])
        if op == "rms_norm":
            return lambda: backend.rms_norm(layer, x)
        return lambda: backend.rms_norm(layer, x, r)
    if op == "silu_and_mul":
        layer = make_silu_and_mul()
        x = _randn(p["tokens"], 2 * p["intermediate"])
        return lambda: backend.silu_and_mul(layer, x)
    if op == "rotary_embedding":
        hd = p["head_size"]
        layer = make_rope(hd, hd, True, DTYPE)
        cos, sin = rope_caches(layer)
        q, k = _randn(p["tokens"], p["q_heads"] * hd), _randn(p["tokens"], p["kv_heads"] * hd)
        pos = torch.arange(p["tokens"], device="cuda") * 37 % 4096
        return lambda: backend.rotary_embedding(layer, q, k, cos, sin, pos, False, True)
    if op == "topk":
        gen = torch.Generator(device="cuda").manual_seed(p["tokens"])
        logits = torch.randn(p["tokens"], p["experts"], device="cuda", generator=gen).to(DTYPE)
        hidden = torch.zeros(p["tokens"], 64, device="cuda", dtype=DTYPE)
        grouped = p["groups"] or None
        bias = (0.05 * torch.randn(p["experts"], device="cuda", generator=gen)
                if p["scoring"] == "sigmoid" else None)
        args = (p["top_k"], True, p["scoring"], bias, grouped, grouped and grouped // 2)
        return lambda: backend.topk(None, hidden, logits, *args)
    if op == "fused_moe":
        e, h, i = p["experts"], p["hidden"], p["intermediate"]
        layer = _ExpertWeights(_randn(e, 2 * i, h) / h ** 0.5, _randn(e, h, i) / i ** 0.5)
        x = _randn(p["tokens"], h)
        logits = _randn(p["tokens"], e).float()
        weights, ids = torch.topk(logits.softmax(-1), p["top_k"], dim=-1)
        weights, ids = (weights / weights.sum(-1, keepdim=True)).float(), ids.to(torch.int32)
        return lambda: backend.fused_moe(layer, x, weights, ids)
    if op in GDN:
        (layer, args), = build_case(op, gdn_shapes(p["value_heads"]), p["tokens"], DTYPE, "cuda",
                                    seed=p["tokens"]).variants
        fn = getattr(backend, op)
        return lambda: fn(layer, *args)
    raise ValueError(op)


# benchmark case -> op table name
_OP_OF = {"fused_add_rms_norm": "rms_norm", "fused_add_gemma_rms_norm": "gemma_rms_norm"}


def model_call(op, variant, shapes, tokens, backend):
    """A zero-argument closure running ``op``'s `build_case` variant on ``backend``, called as
    ``sglang-fl tune`` calls it."""
    layer, args = build_case(op, shapes, tokens, DTYPE, "cuda", seed=tokens).variants[variant]
    fn = getattr(backend, op)
    return lambda: fn(layer, *args)


def bench_cases(tokens, shapes, backends, only):
    """(row head, op, make) per case to time, ``make(backend)`` giving its call: the built-in
    shape list, or with ``shapes`` (``--model``) the model's `model_cases`."""
    if shapes is None:
        cases = ((name, _OP_OF.get(name, name), params, functools.partial(build_call, name, params))
                 for name, params in _cases(tokens))
    else:
        cases = ((name, op, {**params, "variant": variant},
                  functools.partial(model_call, op, variant, shapes, params["tokens"]))
                 for name, op, variant, params in model_cases(shapes, tokens, backends))
    return [({"op": name, **params}, op, make) for name, op, params, make in cases
            if only is None or name in only]


class _ExpertWeights:
    """What the ``fused_moe`` op reads of its layer (a real FusedMoE needs SGLang's groups): the
    weights, and that this device holds every expert, so vendor.cuda runs SGLang's unfiltered
    kernels as a single-device server does."""

    def __init__(self, w13, w2):
        self.w13_weight, self.w2_weight = w13, w2
        experts = w13.shape[0]
        self.moe_runner_config = types.SimpleNamespace(num_experts=experts,
                                                       num_local_experts=experts)


def time_eager(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters  # us per call


def make_graph(fn, per_graph):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    return graph


def time_graph(graph, per_graph, replays):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * per_graph)


def load_backends(names):
    from gpu_support import sglang_ready

    sglang_ready()
    out, skipped = {}, {}
    for name in names:
        if name == "flagos":
            from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend as cls
        elif name == "reference":
            from sglang_fl.dispatch.backends.reference import ReferenceBackend as cls
        elif name == "vendor.cuda":
            from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend as cls
        else:
            raise SystemExit(f"unknown backend {name!r}; accepted: flagos, reference, vendor.cuda")
        backend = cls()
        if backend.available():
            out[name] = backend
        else:
            skipped[name] = backend.unavailable_reason
    return out, skipped


def summarize(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def versions():
    import importlib.metadata as md

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name()}
    for pkg in ("triton", "flag_gems", "sglang", "sglang-kernel", "apache-tvm-ffi", "sglang_fl"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = None
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="JSON output file")
    ap.add_argument("--backends", default="flagos,reference,vendor.cuda")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--per-graph", type=int, default=50, help="calls captured per CUDA graph")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--eager-iters", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="two token counts only")
    ap.add_argument("--tokens", help="comma-separated token counts (default: "
                    f"{','.join(map(str, DEFAULT_TOKENS))}); e.g. 512,2048,4096,16384 for prefill")
    ap.add_argument("--ops", help="comma-separated subset of ops (default: all)")
    ap.add_argument("--model", metavar="DIR", help="time the ops at this checkpoint's shapes "
                    "(a Hugging Face model directory or its config.json) instead of the "
                    "built-in list")
    args = ap.parse_args(argv)
    only = set(args.ops.split(",")) if args.ops else None
    tokens = parse_tokens(ap, args)
    shapes = parse_model(ap, args)
    names = args.backends.split(",")
    check_ops(ap, only, shapes)
    if shapes is not None:
        report_unused(shapes, only)
    cases = bench_cases(tokens, shapes, names, only)

    backends, skipped = load_backends(names)
    for name, why in skipped.items():
        print(f"# {name} skipped: {why}", file=sys.stderr)
    results = []
    t0 = time.time()
    for head, op, make in cases:
        row = time_row(head, op, make, backends, args)
        results.append(row)
        print(_row_text(row, backends), flush=True)
    settings = vars(args) | {"out": str(args.out)}
    if shapes is not None:
        settings["model"] = {"path": args.model, "shapes": shapes.describe()}
    doc = {"benchmark": "op_bench", "versions": versions(), "skipped_backends": skipped,
           "settings": settings, "seconds": round(time.time() - t0, 1), "results": results}
    return publish(doc, args.out, table)


def time_row(head, op, make, backends, args):
    """One case's row: ``head`` with each backend's eager and graph timings (or its error)."""
    row = {**head, "dtype": str(DTYPE).replace("torch.", "")}
    calls, graphs = {}, {}
    graph_errors = {}
    for name, backend in backends.items():  # every input first: a failed capture below
        if op not in backend.implemented_ops():  # must not poison them
            continue
        try:
            calls[name] = make(backend)
            calls[name]()
        except Exception as exc:  # noqa: BLE001 - recorded, the table shows it
            row[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            calls.pop(name, None)
    for name in calls:
        try:  # an impl that cannot be captured (e.g. host syncs) is still timed eagerly
            graphs[name] = make_graph(calls[name], args.per_graph)
        except Exception as exc:  # noqa: BLE001
            graph_errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            torch.cuda.synchronize()
    eager = {n: [] for n in calls}
    graph = {n: [] for n in graphs}
    names = list(calls)
    for rep in range(args.repeats):
        order = names[rep % len(names):] + names[:rep % len(names)] if names else []
        for name in order:
            eager[name].append(time_eager(calls[name], args.eager_iters))
            if name in graphs:
                graph[name].append(time_graph(graphs[name], args.per_graph, args.replays))
    for name in names:
        row[name] = {"eager_us": summarize(eager[name])}
        if name in graphs:
            row[name]["graph_us"] = summarize(graph[name])
            # What eager pays over the graph per call: launch and Python wrapper time not
            # hidden behind the GPU (0 when the kernel outlasts its launch).
            row[name]["eager_minus_graph_us"] = (row[name]["eager_us"]["median"]
                                                 - row[name]["graph_us"]["median"])
        else:
            row[name]["graph_error"] = graph_errors[name]
    del graphs
    return row


def parse_model(ap, args):
    """``--model``'s shapes, None without it; a bad path or config stops here."""
    if args.model is None:
        return None
    try:
        return ModelShapes.from_model(args.model)
    except TuneError as exc:
        ap.error(str(exc))


def check_ops(ap, only, shapes):
    """``--ops`` names only cases this run can have (an op the model does not use is one: it is
    reported, not refused); a typo stops here, naming the accepted names."""
    if only is None:
        return
    known = ({name for op in TUNABLE for name in variant_names(op)} if shapes is not None
             else {name for name, _ in _cases((1,))})
    if only - known:
        ap.error(f"--ops: {', '.join(sorted(only - known))} not known; accepted: "
                 f"{', '.join(sorted(known))}")


def report_unused(shapes, only):
    """Names on stderr, once, the (selected) ops the model does not use, with tune's reason."""
    unused = [f"{op} ({UNUSED[op]})" for op in model_ops(shapes)[1]
              if only is None or only & set(variant_names(op))]
    if unused:
        print(f"# not used by this model: {'; '.join(unused)}", file=sys.stderr)


def parse_tokens(ap, args):
    """The token counts to run: ``--tokens``, else the quick or the default list."""
    if args.tokens is None:
        return QUICK_TOKENS if args.quick else DEFAULT_TOKENS
    if args.quick:
        ap.error("--tokens and --quick are exclusive")
    try:
        tokens = tuple(int(t) for t in args.tokens.split(","))
    except ValueError:
        tokens = ()
    if not tokens or min(tokens) < 1:
        ap.error(f"--tokens: {args.tokens!r} is not a list of positive integers")
    return tokens


def _shape(row):
    """The row's shape parameters; a ``--model`` row has tokens only (the model's shapes head
    the table)."""
    return ", ".join(f"{k}={v}" for k, v in row.items() if k not in ("op", "dtype", "variant")
                     and not isinstance(v, dict))


def _row_text(row, backends):
    parts = []
    for name in backends:
        cell = row.get(name)
        if cell and "eager_us" in cell:
            graph = f"{cell['graph_us']['median']:.2f}" if "graph_us" in cell else "no-graph"
            parts.append(f"{name} {graph}/{cell['eager_us']['median']:.1f}us")
        elif cell:
            parts.append(f"{name} ERROR")
    return f"{row['op']:<20} {_shape(row):<45} graph/eager: " + "  ".join(parts)


def table(doc):
    """Markdown: median us per call under CUDA graph and eager, eager minus graph (the launch
    overhead an eager prefill pays), and flagos' speed-up."""
    names = [n for n in ("flagos", "vendor.cuda", "reference")
             if any(n in r for r in doc["results"])]
    head = (["op", "shape"] + [f"{n} graph" for n in names] + [f"{n} eager" for n in names]
            + [f"{n} eager-graph" for n in names])
    if "flagos" in names and "vendor.cuda" in names:
        head.append("vendor/flagos (graph)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    model = doc.get("settings", {}).get("model")
    if model:
        lines[:0] = [f"Shapes of {model['path']}: {model['shapes']}", ""]
    for r in doc["results"]:
        cells = [r["op"], _shape(r)]
        for mode in ("graph_us", "eager_us"):
            for n in names:
                c = r.get(n)
                if c is None:
                    cells.append("-")
                elif "error" in c:
                    cells.append("error")
                elif mode not in c:
                    cells.append("not capturable")
                else:
                    m = c[mode]
                    cells.append(f"{m['median']:.2f} ({m['min']:.2f}-{m['max']:.2f})"
                                 if mode == "graph_us" else f"{m['median']:.1f}")
        for n in names:
            c = r.get(n) or {}
            cells.append(f"{c['eager_minus_graph_us']:.1f}" if "eager_minus_graph_us" in c else "-")
        if "vendor/flagos (graph)" in head:
            f, v = r.get("flagos", {}), r.get("vendor.cuda", {})
            if "graph_us" in f and "graph_us" in v:
                cells.append(f"{v['graph_us']['median'] / f['graph_us']['median']:.2f}x")
            else:
                cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
