"""Tensor parallelism end to end on CPU: ``launch_server --tp-size 2`` with sglang-fl and the tiny
model serves the same greedy ids as ``--tp-size 1`` (and as HF transformers), and its TP
collectives went through CommunicatorFL.

Needs SGLANG_CPU_OMP_THREADS_BIND on a one-NUMA-node host: SGLang's CPU worker refuses
``tp > number of NUMA nodes`` without it (see docs/distributed.md).
"""

from __future__ import annotations

import os
import random
import socket

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]

MAX_NEW = 12
PROMPTS = ("The server answered the question about the kernel.",
           "Hello world, please write a small model", "Yes")


def low_free_port() -> int:
    """A free port below 55000: SGLang derives a gRPC port at ``port + 10000``."""
    for _ in range(200):
        port = random.randrange(20000, 55000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tp") / "tiny-qwen2")


@pytest.fixture(scope="module")
def prompt_ids(model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return [tok(t)["input_ids"] for t in PROMPTS]


def serve_greedy(model, prompt_ids, tmp_path, tp: int):
    from sglang_fl.serving import launched_server

    env = {k: None for k in os.environ  # inherited sglang-fl settings are removed
           if k.startswith("SGLANG_FL_") or k in ("FLAGCX_PATH", "SGLANG_PLUGINS", "SGLANG_PLATFORM")}
    env["SGLANG_FL_LOG_LEVEL"] = "INFO"
    if tp > 1:
        cores = sorted(os.sched_getaffinity(0))
        env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(
            str(cores[i % len(cores)]) for i in range(tp))
    log = tmp_path / f"server-tp{tp}.log"
    args = ["--dtype", "float32", "--tp-size", str(tp)]
    with launched_server(model, args, env, port=low_free_port(), log_path=log,
                         timeout=400) as srv:
        body = srv.post_json("/generate", {
            "input_ids": prompt_ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True}})
    return [item["output_ids"] for item in body], log.read_text(errors="replace")


def hf_greedy(model, prompt_ids):
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


def test_tp2_serves_the_same_greedy_ids_as_tp1(model, prompt_ids, tmp_path):
    tp1, log1 = serve_greedy(model, prompt_ids, tmp_path, 1)
    tp2, log2 = serve_greedy(model, prompt_ids, tmp_path, 2)
    assert [len(ids) for ids in tp2] == [MAX_NEW] * len(PROMPTS)
    assert tp2 == tp1
    assert tp1 == hf_greedy(model, prompt_ids)
    assert len({tuple(ids) for ids in tp1}) == len(PROMPTS)  # distinct prompts, distinct output

    # TP=1 never builds a communicator; TP=2 builds one per rank and uses it for the model's
    # all-reduce (row-parallel layers) and all-gather (vocab-parallel logits).
    assert "CommunicatorFL(torch) for tp" not in log1
    for rank in (0, 1):
        for method in ("all_reduce", "all_gather"):
            line = f"rank {rank}: first {method} through CommunicatorFL(torch)"
            assert any(line in x and "tp:" in x for x in log2.splitlines()), line
