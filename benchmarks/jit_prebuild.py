"""Compile SGLang's JIT CUDA kernels ahead of a benchmark or a served test, in parallel, into
the installed SGLang's JIT cache.

A JIT module takes 20-30 s to build the first time; built inside a timed run, or by several
servers at once, it distorts or breaks the measurement. What to build is the installed SGLang
version's business: its adapter's ``JIT_PREBUILD`` (sglang_fl/sglang_glue/adapters/), each
entry a factory of SGLang's and its arguments; the adapter's ``JIT_CACHE_DIR_ENV`` names the
cache directory's variable (``TVM_FFI_CACHE_DIR`` for 0.5.11, ``SGLANG_JIT_CACHE_DIR`` for
0.5.23). Where the version lists nothing, or apache-tvm-ffi (which builds them) is not
installed, it prints ``nothing to prebuild for SGLang <version>: <reason>`` and exits 0.

    TVM_FFI_CACHE_DIR=/tmp/jit python benchmarks/jit_prebuild.py [--jobs 8] [--e2e]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.metadata
import multiprocessing as mp
import os
import time


def _builds(adapter, e2e_only: bool) -> tuple:
    return tuple(b for b in adapter.JIT_PREBUILD if b.e2e or not e2e_only)


def _nothing_reason(adapter) -> str | None:
    """Why there is nothing to build here, or None."""
    if not adapter.JIT_PREBUILD:
        return adapter.JIT_PREBUILD_NONE_REASON
    try:
        importlib.metadata.distribution("apache-tvm-ffi")
    except importlib.metadata.PackageNotFoundError:
        return ("apache-tvm-ffi is not installed (empty mode), so SGLang's JIT kernels cannot "
                "build; sglang-fl swaps their hard-wired callers to native twins")
    return None


def _build(build):
    from sglang_fl.compat import activate

    activate()  # SGLang imports without flashinfer
    import importlib

    import torch

    args = tuple(getattr(torch, a) if isinstance(a, str) else a for a in build.args)
    t0 = time.time()
    try:
        getattr(importlib.import_module(build.module), build.function)(*args)
        return f"{build.describe()}: {time.time() - t0:.1f}s"
    except Exception as exc:  # noqa: BLE001 - report and go on with the others
        return f"{build.describe()}: FAILED {type(exc).__name__}: {str(exc)[:300]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--e2e", action="store_true", help="only what the e2e benchmark's servers use")
    args = ap.parse_args(argv)

    from sglang_fl.sglang_glue.adapters import get_adapter, installed_sglang_version

    adapter = get_adapter()
    version = installed_sglang_version() or adapter.version
    reason = _nothing_reason(adapter)
    if reason:
        print(f"nothing to prebuild for SGLang {version}: {reason}", flush=True)
        return 0
    builds = _builds(adapter, args.e2e)
    cache = os.environ.get(adapter.JIT_CACHE_DIR_ENV, "(its default)")
    print(f"SGLang {version}: {len(builds)} JIT modules into {adapter.JIT_CACHE_DIR_ENV}={cache}",
          flush=True)
    t0 = time.time()
    failed = 0
    with cf.ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        for line in pool.map(_build, builds):
            failed += ": FAILED " in line
            print(line, flush=True)
    print(f"JIT prebuild done in {time.time() - t0:.0f}s ({failed} of {len(builds)} failed)")
    return 1 if failed == len(builds) else 0


if __name__ == "__main__":
    raise SystemExit(main())
