#!/usr/bin/env python3
"""Minimal reproducer: FlagGems' in-place ``apply_rotary_pos_emb`` returns wrong elements in a
fraction of calls (a race), while the out-of-place call on the same inputs is exact.

Needs only torch (CUDA) and flag_gems; no SGLang, no sglang-fl. Quote it in an upstream report:

    python tools/repro_flaggems_rope_race.py [--iters 300] [--tokens 1024] [--dtype float16]

Each iteration draws fresh q/k/positions, applies neox RoPE (head 128, rotary 128, 32 q / 8 kv
heads, a cos/sin table like SGLang's) in place and out of place, and counts the calls in which any
element is more than 0.05 from the same math in fp32. Seen on an H200 with FlagGems 5.0.2,
Triton 3.6: 20-30 % of in-place calls wrong, 0 out of place. Wrong elements are
``x[d]*cos - y[p]*sin`` with the partner ``y[p]`` already overwritten by its rotated value: the
kernel has no barrier between the warps that read a rotation partner and those that write it.
Exit status 1 when an in-place call was wrong.

``--timing`` instead measures what avoiding the race costs: in-place vs out-of-place + copy into
q/k (sglang-fl's workaround), per call, eager and under a CUDA graph, interleaved, over several
token counts; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import flag_gems
import torch


def rope_fp32(x, cos, sin, pos):
    """neox RoPE in fp32: x [tokens, heads, 2*half], cos/sin [max_pos, half]."""
    c, s = cos[pos].float()[:, None, :], sin[pos].float()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def timing(dtype, hd, q_heads, kv_heads, repeats=15, per_graph=20, eager_iters=50) -> dict:
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

        calls = {"inplace": inplace, "out_of_place_copy": workaround}
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
        out[tokens] = {n: {m: statistics.median(v) for m, v in r.items()} for n, r in res.items()}
        out[tokens]["graph_ratio_workaround_vs_inplace"] = statistics.median(
            a / b for a, b in zip(res["out_of_place_copy"]["graph_us"], res["inplace"]["graph_us"],
                                  strict=True))
        out[tokens]["eager_ratio_workaround_vs_inplace"] = statistics.median(
            a / b for a, b in zip(res["out_of_place_copy"]["eager_us"], res["inplace"]["eager_us"],
                                  strict=True))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--timing", action="store_true", help="measure the workaround's cost instead")
    args = ap.parse_args()
    dtype, dev, hd = getattr(torch, args.dtype), "cuda", args.head_size
    if args.timing:
        print(json.dumps(timing(dtype, hd, args.q_heads, args.kv_heads), indent=1))
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
          f"{torch.cuda.get_device_name()}, {args.dtype}, {args.tokens} tokens, head {hd}")
    for mode, n in wrong.items():
        print(f"{mode:>13}: {n} of {args.iters} calls wrong")
    return 1 if wrong["in-place"] else 0


if __name__ == "__main__":
    sys.exit(main())
