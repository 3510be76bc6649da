"""Where the ``flagos`` backend's ``chunk_gated_delta_rule`` (GDN prefill) spends its time, at one
checkpoint's GDN shapes, against SGLang's kernel (``vendor.cuda``).

The whole op four ways, interleaved within each repeat: ``flagos`` as it ships (q/k through
sglang-fl's one-pass kernel, `sglang_fl.kernels.gdn_qk`; one ``cu_seqlens`` tensor for every
call, as SGLang passes every GDN layer of a forward the same one), ``flagos`` with the PyTorch
q/k prologue it replaced (``flagos-torch-qk``), ``flagos`` given a new ``cu_seqlens`` tensor per
call (``flagos-new-cu``: FlagGems' chunk-index cache, keyed on that tensor's identity, then
misses, as it did in every layer before the backend kept its int64 copy), and ``vendor.cuda``.
Then the pieces of the flagos wrapper
around FlagGems' kernel, each timed alone: the q/k prologue both ways, the copy of the strided v,
the initial state's and the final state's transposes (FlagGems keeps states as [K, V], SGLang's
pool as [V, K]), and FlagGems' kernel by itself. Eager launches (SGLang runs GDN prefill
eagerly; its copies of host lengths keep it out of CUDA graphs), CUDA events, median and range
over ``--repeats``. The outputs of the two flagos variants are compared too.

    python benchmarks/gdn_prefill_split.py --model /tmp/shapes-qwen3.6-27b --tokens 2048,8192 \\
        --out gdn-split.json

The inputs are `sglang-fl tune`'s (`build_case`): q, k and v as strided views of the conv's
output, sequences of at most 512 tokens, each from a cached state. Needs a CUDA device with
FlagGems and SGLang's kernels (``gpu_session.sh install``).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
from op_bench import parse_model, parse_tokens, summarize, versions  # noqa: E402
from op_bench import time_eager as time_us  # noqa: E402
from report import publish  # noqa: E402

WHOLE = ("flagos", "flagos-torch-qk", "flagos-new-cu", "vendor.cuda")
#: Where the inputs are built (the CPU tests run `row` with stand-ins on "cpu").
DEVICE = "cuda"


@contextlib.contextmanager
def torch_qk_prologue():
    """The flagos backend with its PyTorch q/k prologue (the path before `gdn_qk`)."""
    from sglang_fl.kernels import gdn_qk

    saved = gdn_qk.supports
    gdn_qk.supports = lambda *_: False
    try:
        yield
    finally:
        gdn_qk.supports = saved


def summary(values):
    """op_bench's median, min and max to 0.1 µs."""
    return {k: round(v, 1) for k, v in summarize(values).items() if k != "runs"}


def row(flagos, vendor, shapes, tokens, args):
    """One token count's timings: the whole op each `WHOLE` way (interleaved), then the pieces."""
    from sglang_fl.tune import build_case

    (layer, ins), = build_case("chunk_gated_delta_rule", shapes, tokens, torch.bfloat16, DEVICE,
                               seed=1).variants
    q, k, v, g, beta, state, bounds = ins
    hv = v.shape[2]

    def as_torch_qk():
        with torch_qk_prologue():
            return flagos.chunk_gated_delta_rule(layer, *ins)

    whole = {"flagos": lambda: flagos.chunk_gated_delta_rule(layer, *ins),
             "flagos-torch-qk": as_torch_qk,
             "flagos-new-cu": lambda: flagos.chunk_gated_delta_rule(layer, *ins[:-1],
                                                                    bounds.clone()),
             "vendor.cuda": lambda: vendor.chunk_gated_delta_rule(layer, *ins)}
    out = {name: fn() for name, fn in whole.items()}  # warm-up, and the outputs compared below
    times = {name: [] for name in WHOLE}
    for rep in range(args.repeats):
        shift = rep % len(WHOLE)
        for name in WHOLE[shift:] + WHOLE[:shift]:
            times[name].append(time_us(whole[name], args.iters))

    def torch_qk():
        with torch_qk_prologue():
            return flagos._gdn_qk(q, k, hv, True)

    qn, kn = flagos._gdn_qk(q, k, hv, True)
    h0 = state.float().transpose(-1, -2).contiguous()
    vc, cu64 = v.contiguous(), bounds.to(torch.int64)

    def kernel():
        return flagos._gems.chunk_gated_delta_rule_fwd(qn, kn, vc, g.float(), beta.contiguous(),
                                                       k.shape[-1] ** -0.5, h0.clone(), True,
                                                       cu_seqlens=cu64)

    result = kernel()
    pieces = {
        "q/k prologue, gdn_qk kernel": lambda: flagos._gdn_qk(q, k, hv, True),
        "q/k prologue, PyTorch": torch_qk,
        "v copy (strided view)": lambda: v.contiguous(),
        "initial state [V,K] -> [K,V]": lambda: state.float().transpose(-1, -2).contiguous(),
        "FlagGems kernel alone (+ a state copy)": kernel,
        "the state copy alone": lambda: h0.clone(),
        "output cast, final state [K,V] -> [V,K]": lambda: (
            result[1].to(q.dtype), result[3].transpose(-1, -2).contiguous()),
    }
    piece_times = {}
    for name, fn in pieces.items():
        fn()
        piece_times[name] = summary([time_us(fn, args.iters) for _ in range(args.repeats)])
    pairs = tuple(zip(flagos._gdn_qk(q, k, hv, True), torch_qk(), strict=True))
    return {
        "tokens": tokens,
        "whole_us": {name: summary(t) for name, t in times.items()},
        "pieces_us": piece_times,
        "qk_kernel_vs_torch": {"max_abs_diff": max(_max_diff(a, b) for a, b in pairs),
                               "equal_share": statistics.mean((a == b).float().mean().item()
                                                              for a, b in pairs)},
        "flagos_vs_torch_qk_out_max_abs_diff": _max_diff(out["flagos"][0],
                                                         out["flagos-torch-qk"][0]),
        "flagos_vs_torch_qk_state_max_abs_diff": _max_diff(out["flagos"][1],
                                                           out["flagos-torch-qk"][1]),
    }


def _max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def table(doc):
    """Markdown: the whole op per token count, then the wrapper's pieces."""
    tokens = [r["tokens"] for r in doc["rows"]]
    head = "| | " + " | ".join(f"{t} tokens, us" for t in tokens) + " |"
    rule = "|---|" + "---:|" * len(tokens)
    lines = [head, rule]
    for name in WHOLE:
        lines.append(f"| whole op, {name} | " + " | ".join(_cell(r["whole_us"][name])
                                                         for r in doc["rows"]) + " |")
    for name in doc["rows"][0]["pieces_us"] if doc["rows"] else ():
        lines.append(f"| {name} | " + " | ".join(_cell(r["pieces_us"][name])
                                                 for r in doc["rows"]) + " |")
    return "\n".join(lines)


def _cell(s):
    return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", metavar="DIR", required=True,
                    help="a checkpoint with GDN layers (its directory or config.json)")
    ap.add_argument("--tokens", help="comma-separated token counts (default 2048,8192)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--iters", type=int, default=20, help="eager calls per timing")
    ap.add_argument("--out", type=Path, help="JSON output file")
    args = ap.parse_args(argv)
    tokens = parse_tokens(ap, argparse.Namespace(tokens=args.tokens or "2048,8192", quick=False))
    shapes = parse_model(ap, args)
    if not shapes.linear_value_heads:
        ap.error(f"--model {args.model}: the model has no Gated DeltaNet layers")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (FlagGems' and SGLang's GDN kernels)")
    from gpu_support import sglang_ready

    sglang_ready()
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend

    flagos, vendor = FlagGemsBackend(), CudaBackend()
    for backend in (flagos, vendor):
        if not backend.available():
            ap.error(f"backend {backend.name} is unavailable: {backend.unavailable_reason}")
    t0 = time.time()
    doc = {"benchmark": "gdn_prefill_split", "versions": versions(),
           "settings": {"model": args.model, "shapes": shapes.describe(), "tokens": tokens,
                        "repeats": args.repeats, "iters": args.iters},
           "rows": [row(flagos, vendor, shapes, t, args) for t in tokens]}
    doc["seconds"] = round(time.time() - t0, 1)
    return publish(doc, args.out, table)


if __name__ == "__main__":
    main()
