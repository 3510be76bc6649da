"""Compile SGLang's JIT CUDA kernels (``sglang.jit_kernel``, built through apache-tvm-ffi) ahead
of a benchmark, in parallel, into ``TVM_FFI_CACHE_DIR``.

A JIT module takes 20-30 s to build the first time; built inside a timed run, or by several
servers at once into one cache directory, it distorts or breaks the measurement. This builds
what SGLang's own CUDA path and sglang-fl's ``vendor.cuda`` backend use on a dense Qwen2/Llama:
fused RoPE (both styles, rotary dims 64/128, bf16/fp16), SiLU-and-mul, the KV-cache store,
``clamp_position`` and ``resolve_future_token_ids``.

    TVM_FFI_CACHE_DIR=/tmp/jit python benchmarks/jit_prebuild.py [--jobs 8]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import time


def _modules(e2e_only=False):
    import torch

    if e2e_only:  # what a bf16 Qwen2.5-0.5B server builds (head 64, 2 KV heads)
        return [("rope", "_jit_fused_rope_module", (True, 64, torch.bfloat16)),
                ("activation", "_jit_activation_module", (torch.bfloat16,)),
                ("kvcache", "_jit_kvcache_module", (256,))] + [
            (m, f, (dt,)) for dt in (torch.int32, torch.int64)
            for m, f in (("clamp_position", "_jit_clamp_position_module"),
                         ("resolve_future_token_ids", "_jit_resolve_future_token_ids_module"))]

    mods = []
    for neox in (True, False):
        for dim in (64, 128):
            for dtype in (torch.bfloat16, torch.float16):
                mods.append(("rope", "_jit_fused_rope_module", (neox, dim, dtype)))
    for dtype in (torch.bfloat16, torch.float16):
        mods.append(("activation", "_jit_activation_module", (dtype,)))
    # KV rows of kv_heads * head_dim * 2 bytes: Qwen2.5-0.5B (2x64), Qwen3-30B-A3B (4x128),
    # Llama-3-8B (8x128).
    for row_bytes in (256, 1024, 2048):
        mods.append(("kvcache", "_jit_kvcache_module", (row_bytes,)))
    for dtype in (torch.int32, torch.int64):
        mods.append(("clamp_position", "_jit_clamp_position_module", (dtype,)))
        mods.append(("resolve_future_token_ids", "_jit_resolve_future_token_ids_module", (dtype,)))
    return mods


def _build(spec):
    from sglang_fl.compat import activate

    activate()  # SGLang imports without flashinfer
    import importlib

    module, fn, args = spec
    t0 = time.time()
    try:
        getattr(importlib.import_module(f"sglang.jit_kernel.{module}"), fn)(*args)
        return f"{module}{args}: {time.time() - t0:.1f}s"
    except Exception as exc:  # noqa: BLE001 - report and go on with the others
        return f"{module}{args}: FAILED {type(exc).__name__}: {str(exc)[:300]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--e2e", action="store_true", help="only what the e2e benchmark's servers use")
    args = ap.parse_args()
    t0 = time.time()
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        for line in pool.map(_build, _modules(args.e2e)):
            print(line, flush=True)
    print(f"JIT prebuild done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
