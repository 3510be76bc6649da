#!/usr/bin/env python3
"""Minimal reproducer: FlagGems' in-place ``apply_rotary_pos_emb`` returns wrong elements in a
fraction of calls (a race), while the out-of-place call on the same inputs is exact.

The race check needs only torch (CUDA) and flag_gems; no SGLang, no sglang-fl. Quote it in an
upstream report (the fix: tools/flaggems-rope-inplace-fix.patch):

    python tools/repro_flaggems_rope_race.py [--iters 300] [--tokens 1024] [--dtype float16]

Each iteration draws fresh q/k/positions, applies neox RoPE (head 128, rotary 128, 32 q / 8 kv
heads, a cos/sin table like SGLang's) in place and out of place, and counts the calls in which any
element is more than 0.05 from the same math in fp32. Seen on an H200 with FlagGems 5.0.2,
Triton 3.6: 43 and 55 of 300 in-place calls wrong (two runs), 0 out of place. Wrong elements are
``x[d]*cos - y[p]*sin`` with the partner ``y[p]`` already overwritten by its rotated value: the
kernel has no barrier between the warps that read a rotation partner and those that write it.
Exit status 1 when an in-place call was wrong.

``--timing`` instead measures what avoiding the race costs: in-place vs out-of-place + copy into
q/k (sglang-fl's former workaround), per call, eager and under a CUDA graph, interleaved, over
several token counts; prints JSON.

``--compare`` times what sglang-fl now runs against the alternatives, per call under a CUDA graph
(and eager), bf16, head 128, 32 q / 8 kv heads as views of one qkv buffer, 1/32/512/4096 tokens:
sglang-fl's own in-place kernel (sglang_fl/kernels/rope.py, imported from this checkout), FlagGems
out of place + copy, and SGLang's own ``apply_rope_with_cos_sin_cache_inplace`` (its JIT kernel,
through the version adapter) where it builds here (otherwise listed under "unavailable"). Each is first checked against fp32 math. From the
repository root, with torch, triton and flag_gems installed:

    python tools/repro_flaggems_rope_race.py --compare --out rope-compare.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import flag_gems
import torch


def rope_fp32(x, cos, sin, pos):
    """neox RoPE in fp32: x [tokens, heads, 2*half], cos/sin [max_pos, half]."""
    c, s = cos[pos].float()[:, None, :], sin[pos].float()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def time_calls(calls, repeats=15, per_graph=20, eager_iters=50) -> dict:
    """Per-call us of each of ``calls`` (name -> fn), eager and replayed from a CUDA graph of
    ``per_graph`` calls, interleaved (each repeat runs every call, in alternating order);
    medians, plus the per-repeat lists under ``*_all``."""
    graphs = {}
    for name, fn in calls.items():
        for _ in range(3):
            fn()  # compile / warm up outside the capture
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(per_graph):
                fn()
        graphs[name] = g
    res = {n: {"eager_us": [], "graph_us": []} for n in calls}
    for rep in range(repeats):
        for name in (list(calls) if rep % 2 == 0 else list(calls)[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(eager_iters):
                calls[name]()
            end.record()
            torch.cuda.synchronize()
            res[name]["eager_us"].append(start.elapsed_time(end) * 1e3 / eager_iters)
            start.record()
            graphs[name].replay()
            end.record()
            torch.cuda.synchronize()
            res[name]["graph_us"].append(start.elapsed_time(end) * 1e3 / per_graph)
    return {n: {**{m: statistics.median(v) for m, v in r.items()},
                **{f"{m}_all": v for m, v in r.items()}} for n, r in res.items()}


def _median_ratio(res, a, b, metric):
    return statistics.median(x / y for x, y in zip(res[a][f"{metric}_all"], res[b][f"{metric}_all"],
                                                   strict=True))


def timing(dtype, hd, q_heads, kv_heads) -> dict:
    """Per-call us of the in-place kernel vs the workaround (out of place + copy_)."""
    dev, max_pos = "cuda", 4096
    cos = torch.randn(max_pos, hd // 2, device=dev, dtype=dtype)
    sin = torch.randn(max_pos, hd // 2, device=dev, dtype=dtype)
    out = {}
    for tokens in (1, 32, 256, 1024, 8192):
        q = torch.randn(tokens, q_heads, hd, device=dev, dtype=dtype)
        k = torch.randn(tokens, kv_heads, hd, device=dev, dtype=dtype)
        pos = torch.randint(0, max_pos, (tokens,), device=dev)

        def inplace(q=q, k=k, pos=pos):
            flag_gems.apply_rotary_pos_emb(q, k, cos, sin, pos, rotary_interleaved=False,
                                           inplace=True)

        def workaround(q=q, k=k, pos=pos):
            qo, ko = flag_gems.apply_rotary_pos_emb(q, k, cos, sin, pos, rotary_interleaved=False,
                                                    inplace=False)
            q.copy_(qo)
            k.copy_(ko)

        res = time_calls({"inplace": inplace, "out_of_place_copy": workaround})
        out[tokens] = {n: {m: v for m, v in r.items() if not m.endswith("_all")}
                       for n, r in res.items()}
        for metric in ("graph", "eager"):
            out[tokens][f"{metric}_ratio_workaround_vs_inplace"] = _median_ratio(
                res, "out_of_place_copy", "inplace", f"{metric}_us")
    return out


def _sglang_rope():
    """SGLang's own in-place RoPE kernel, the one its RotaryEmbedding serves with on CUDA
    (``apply_rope_with_cos_sin_cache_inplace(positions, q, k, cos_sin_cache, is_neox)``: 0.5.11's
    ``sglang.jit_kernel.rope``, 0.5.23's ``sglang.kernels.ops.attention.rope``, found through the
    version adapter), or why it is not here. sgl_kernel 0.4.2 has no such function."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    try:
        from sglang_fl.sglang_glue.adapters import get_adapter

        return get_adapter().kernel("apply_rope_with_cos_sin_cache_inplace"), None
    except Exception as exc:  # noqa: BLE001 - absent, or its JIT cannot build here
        return None, f"SGLang's RoPE kernel: {type(exc).__name__}: {exc}"


def compare(dtype, hd, q_heads, kv_heads, token_counts) -> dict:
    """In-place RoPE under a CUDA graph: sglang-fl's kernel vs FlagGems out of place + copy
    (what sglang-fl did before it) vs SGLang's own kernel, q/k as views of one qkv buffer (as SGLang
    passes them), fp32 caches. Each candidate is first checked against fp32 math (max abs
    error); one that fails to run is reported, not timed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from sglang_fl.kernels.rope import rotary_embedding_inplace

    dev, max_pos = "cuda", 32768
    inv_freq = 1.0 / (1_000_000 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    freqs = torch.outer(torch.arange(max_pos, device=dev).float(), inv_freq)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    cos_sin_cache = torch.cat((cos, sin), dim=-1)
    sgl_rope, sgl_missing = _sglang_rope()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "flag_gems": getattr(flag_gems, "__version__", "?"), "dtype": str(dtype),
           "head_size": hd, "q_heads": q_heads, "kv_heads": kv_heads, "neox": True,
           "unavailable": {"sglang": sgl_missing} if sgl_missing else {}, "tokens": {}}
    for tokens in token_counts:
        qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * hd, device=dev, dtype=dtype)
        q, k, _ = qkv.split([q_heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
        pos = torch.randint(0, max_pos, (tokens,), device=dev)

        def plugin(q=q, k=k, pos=pos):
            rotary_embedding_inplace(q, k, cos, sin, pos, hd, False)

        def flaggems_copy(q=q, k=k, pos=pos, t=tokens):
            q3, k3 = q.view(t, -1, hd), k.view(t, -1, hd)
            qo, ko = flag_gems.apply_rotary_pos_emb(q3, k3, cos, sin, pos,
                                                    rotary_interleaved=False, inplace=False)
            q3.copy_(qo)
            k3.copy_(ko)

        calls = {"sglang_fl_inplace": plugin, "flaggems_out_of_place_copy": flaggems_copy}
        if sgl_rope is not None:
            def sgl(q=q, k=k, pos=pos, t=tokens):
                sgl_rope(positions=pos, q=q.view(t, -1, hd), k=k.view(t, -1, hd),
                         cos_sin_cache=cos_sin_cache, is_neox=True)
            calls["sglang_inplace"] = sgl
        row, timed = {}, {}
        x = qkv.clone()
        want_q = rope_fp32(q.view(tokens, -1, hd), cos, sin, pos)
        want_k = rope_fp32(k.view(tokens, -1, hd), cos, sin, pos)
        for name, fn in calls.items():
            qkv.copy_(x)
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - report it, time the others
                row[name] = {"error": f"{type(exc).__name__}: {exc}"}
                continue
            err = max((q.view(tokens, -1, hd).float() - want_q).abs().max().item(),
                      (k.view(tokens, -1, hd).float() - want_k).abs().max().item())
            row[name] = {"max_abs_err_vs_fp32": err}
            timed[name] = fn
        res = time_calls(timed)
        for name, r in res.items():
            row[name].update({m: v for m, v in r.items() if not m.endswith("_all")})
        for name in res:
            if name != "sglang_fl_inplace" and "sglang_fl_inplace" in res:
                row[f"graph_ratio_{name}_vs_sglang_fl"] = _median_ratio(
                    res, name, "sglang_fl_inplace", "graph_us")
        out["tokens"][tokens] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dtype", choices=("float16", "bfloat16"),
                    help="default float16 (bfloat16 for --compare)")
    ap.add_argument("--timing", action="store_true", help="measure the workaround's cost instead")
    ap.add_argument("--compare", action="store_true",
                    help="time sglang-fl's in-place kernel vs FlagGems out of place + copy vs "
                         "SGLang's own kernel under a CUDA graph (bf16 unless --dtype)")
    ap.add_argument("--compare-tokens", default="1,32,512,4096")
    ap.add_argument("--out", help="also write the JSON of --timing/--compare here")
    args = ap.parse_args()
    dtype, dev, hd = getattr(torch, args.dtype or "float16"), "cuda", args.head_size
    if args.timing or args.compare:
        if args.compare:
            tokens = [int(t) for t in args.compare_tokens.split(",")]
            result = compare(getattr(torch, args.dtype or "bfloat16"), hd, args.q_heads,
                             args.kv_heads, tokens)
        else:
            result = timing(dtype, hd, args.q_heads, args.kv_heads)
        text = json.dumps(result, indent=1)
        print(text)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n")
        return 0
    max_pos, half = 4096, hd // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    freqs = torch.outer(torch.arange(max_pos, device=dev).float(), inv_freq)
    cos, sin = freqs.cos().to(dtype), freqs.sin().to(dtype)
    assert cos.shape[-1] == half
    wrong = {"in-place": 0, "out-of-place": 0}
    for _ in range(args.iters):
        q = torch.randn(args.tokens, args.q_heads, hd, device=dev, dtype=dtype)
        k = torch.randn(args.tokens, args.kv_heads, hd, device=dev, dtype=dtype)
        pos = torch.randint(0, max_pos, (args.tokens,), device=dev)
        want_q, want_k = rope_fp32(q, cos, sin, pos), rope_fp32(k, cos, sin, pos)
        for mode, inplace in (("in-place", True), ("out-of-place", False)):
            qq, kk = q.clone(), k.clone()
            got_q, got_k = flag_gems.apply_rotary_pos_emb(qq, kk, cos, sin, pos,
                                                         rotary_interleaved=False, inplace=inplace)
            if inplace:
                got_q, got_k = qq, kk
            err = max((got_q.float() - want_q).abs().max().item(),
                      (got_k.float() - want_k).abs().max().item())
            wrong[mode] += err > 0.05
    print(f"flag_gems {getattr(flag_gems, '__version__', '?')}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, {dtype}, {args.tokens} tokens, head {hd}")
    for mode, n in wrong.items():
        print(f"{mode:>13}: {n} of {args.iters} calls wrong")
    return 1 if wrong["in-place"] else 0


if __name__ == "__main__":
    sys.exit(main())
