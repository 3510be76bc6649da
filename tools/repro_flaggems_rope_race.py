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
"""

from __future__ import annotations

import argparse
import sys

import flag_gems
import torch


def rope_fp32(x, cos, sin, pos):
    """neox RoPE in fp32: x [tokens, heads, 2*half], cos/sin [max_pos, half]."""
    c, s = cos[pos].float()[:, None, :], sin[pos].float()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    args = ap.parse_args()
    dtype, dev, hd = getattr(torch, args.dtype), "cuda", args.head_size
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
