"""Helpers for the Layer-3 tests that start several real processes (imported by the tests)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "collectives_worker.py"


# --- servers (tests/distributed/test_tp_e2e.py, test_pp_e2e.py) -----------------------------

MAX_NEW = 12
PROMPTS = ("The server answered the question about the kernel.",
           "Hello world, please write a small model", "Yes")


def server_env(tp: int = 1, pp: int = 1) -> dict[str, str | None]:
    """``launched_server`` env: inherited sglang-fl settings removed, INFO logs, and the cores
    of each worker in SGLANG_CPU_OMP_THREADS_BIND (SGLang's CPU worker demands it on a host with
    fewer NUMA nodes than workers; how many groups it wants is the SGLang version's business:
    one per TP rank in 0.5.11, one per TP x PP worker in 0.5.23)."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    env: dict[str, str | None] = {
        k: None for k in os.environ
        if k.startswith("SGLANG_FL_") or k in ("FLAGCX_PATH", "SGLANG_PLUGINS", "SGLANG_PLATFORM")}
    env["SGLANG_FL_LOG_LEVEL"] = "INFO"
    groups = get_adapter().cpu_omp_bind_groups(tp, pp)
    if groups > 1:
        cores = sorted(os.sched_getaffinity(0))
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(cores[i % len(cores)]) for i in range(groups))
    return env


def generate_greedy(server, prompt_ids) -> list[list[int]]:
    body = server.post_json("/generate", {
        "input_ids": prompt_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}})
    return [item["output_ids"] for item in body]


def serve_greedy(model, prompt_ids, log_path: Path, *, tp: int = 1, pp: int = 1,
                 extra_args=(), then=None):
    """Greedy ids of ``launch_server --tp-size tp --pp-size pp`` for ``prompt_ids``, and its log.
    ``then(server)``, where given, runs after the request and before the server stops: a second
    look at the same server (its /metrics, say) without starting another (~60 s on CI)."""
    from sglang_fl.serving import launched_server

    args = ["--dtype", "float32", "--tp-size", str(tp), "--pp-size", str(pp), *extra_args]
    with launched_server(model, args, server_env(tp, pp), log_path=log_path,
                         timeout=400) as srv:
        ids = generate_greedy(srv, prompt_ids)
        if then is not None:
            then(srv)
    return ids, Path(log_path).read_text(errors="replace")


def hf_greedy(model, prompt_ids) -> list[list[int]]:
    """Ground truth independent of SGLang: HF greedy decoding of the same checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    want = []
    with torch.no_grad():
        for ids in prompt_ids:
            out = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)).long(),
                              max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False,
                              eos_token_id=None, pad_token_id=0)
            want.append(out[0, len(ids):].tolist())
    return want


def layer3_counts(log: str, group: str, method: str) -> dict[int, int]:
    """rank in ``group`` -> the highest count of ``method`` CommunicatorFL logged for it (it logs
    each count that is a power of two; ``first`` is 1)."""
    import re

    counts: dict[int, int] = {}
    pattern = re.compile(rf"\b{re.escape(group)} rank (\d+): (?:first {method}|{method} call (\d+)) "
                         r"through CommunicatorFL")
    for m in pattern.finditer(log):
        rank, n = int(m.group(1)), int(m.group(2) or 1)
        counts[rank] = max(counts.get(rank, 0), n)
    return counts


# --- processes --------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**overrides: str) -> dict[str, str]:
    """The test process's environment without sglang-fl settings, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SGLANG_FL_") and k not in ("FLAGCX_PATH", "SGLANG_PLUGINS")}
    env.update(overrides)
    return env


def run_ranks(tmp_path: Path, world_size: int, *, tp: int, pp: int = 1,
              env: dict[str, str] | None = None, timeout: float = 240) -> list[dict]:
    """Run ``collectives_worker.py`` as ``world_size`` processes; return each rank's report."""
    port = free_port()
    procs, outs = [], []
    for rank in range(world_size):
        out = tmp_path / f"rank{rank}.json"
        log = open(tmp_path / f"rank{rank}.log", "w")
        cmd = [sys.executable, str(WORKER), "--rank", str(rank), "--world-size", str(world_size),
               "--port", str(port), "--tp", str(tp), "--pp", str(pp), "--out", str(out)]
        procs.append((subprocess.Popen(cmd, env=env or clean_env(), stdout=log,
                                       stderr=subprocess.STDOUT), log))
        outs.append(out)
    deadline = time.monotonic() + timeout
    failed = []
    try:
        for rank, (proc, _) in enumerate(procs):
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                rc = "timeout"
            if rc != 0:
                failed.append(rank)
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    if failed:
        logs = "\n".join(f"--- rank {r} ---\n" + (tmp_path / f"rank{r}.log").read_text()[-4000:]
                         for r in failed)
        pytest.fail(f"ranks {failed} failed:\n{logs}")
    return [json.loads(o.read_text()) for o in outs]


# --- C prototypes -> ctypes (FlagCX binding checks) -------------------------------------------

def parse_prototypes(header_text: str) -> dict[str, tuple[str, list[str]]]:
    """``name -> (return type, [argument types])`` for every ``flagcx*`` function declared in
    ``header_text``; parameter names dropped, types normalised like ``const void *``."""
    import re

    text = re.sub(r"/\*.*?\*/", " ", header_text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)
    protos = {}
    for ret, name, args in re.findall(
            r"([A-Za-z_][\w \t\*]*?)\b(flagcx[A-Za-z0-9_]*)\s*\(([^;{}()]*)\)\s*;", text):
        ret = _norm_type(ret)
        arglist = [] if args.strip() in ("", "void") else [
            _norm_type(a, drop_name=True) for a in args.split(",")]
        protos[name] = (ret, arglist)
    return protos


def _norm_type(decl: str, drop_name: bool = False) -> str:
    import re

    decl = decl.split("=")[0]  # C++ default arguments
    tokens = re.findall(r"\w+|\*", decl)
    words = [t for t in tokens if t != "*"]
    stars = tokens.count("*")
    if drop_name and len(words) > 1:
        words = words[:-1]
    words = [w for w in words if w not in ("extern", "struct")]
    return " ".join(words) + (" " + "*" * stars if stars else "")


def c_to_ctypes():
    """C type spelling -> the ctypes type the binding must use for it."""
    import ctypes

    from sglang_fl.distributed import flagcx as fx

    return {
        "flagcxResult_t": ctypes.c_int, "int": ctypes.c_int, "flagcxDataType_t": ctypes.c_int,
        "flagcxRedOp_t": ctypes.c_int, "size_t": ctypes.c_size_t,
        "const void *": ctypes.c_void_p, "void *": ctypes.c_void_p,
        "flagcxComm_t": ctypes.c_void_p, "const flagcxComm_t": ctypes.c_void_p,
        "flagcxStream_t": ctypes.c_void_p, "flagcxComm_t *": ctypes.POINTER(ctypes.c_void_p),
        "int *": ctypes.POINTER(ctypes.c_int),
        "flagcxUniqueId_t": ctypes.POINTER(fx.flagcxUniqueId),
        "const char *": ctypes.c_char_p,
        "flagcxDeviceHandle_t": fx.flagcxDeviceHandle_t,
        "flagcxDeviceHandle_t *": ctypes.POINTER(fx.flagcxDeviceHandle_t),
    }


def binding_mismatches(header_text: str) -> list[str]:
    """Every way ``sglang_fl.distributed.flagcx.PROTOTYPES`` disagrees with the header."""
    from sglang_fl.distributed.flagcx import PROTOTYPES

    declared, types, problems = parse_prototypes(header_text), c_to_ctypes(), []
    for name, (restype, argtypes) in PROTOTYPES.items():
        if name not in declared:
            problems.append(f"{name}: not declared")
            continue
        ret, args = declared[name]
        if types.get(ret) is not restype:
            problems.append(f"{name}: returns {ret}, binding says {restype}")
        if len(args) != len(argtypes):
            problems.append(f"{name}: {len(args)} parameters declared, binding has {len(argtypes)}")
            continue
        for i, (c_arg, bound) in enumerate(zip(args, argtypes, strict=True)):
            if types.get(c_arg) is not bound:
                problems.append(f"{name} parameter {i}: declared {c_arg!r}, binding has {bound}")
    return problems
