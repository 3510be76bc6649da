"""Tensor parallelism end to end on CPU: ``launch_server --tp-size 2`` with sglang-fl and the tiny
model serves the same greedy ids as ``--tp-size 1`` (and as HF transformers), and its TP
collectives went through CommunicatorFL and are counted on its ``/metrics`` (the same server:
one TP=2 start less than a separate metrics test, about a minute of CI).

Needs SGLANG_CPU_OMP_THREADS_BIND on a one-NUMA-node host: SGLang's CPU worker refuses
``tp > number of NUMA nodes`` without it (see docs/distributed.md). The references are the
session fixtures of conftest.py.
"""

from __future__ import annotations

import pytest
from l3_helpers import MAX_NEW, PROMPTS, hf_greedy, serve_greedy

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]


def _collectives_by_gloo(server) -> dict[str, float]:
    """sglang_fl_collectives_total by op for the gloo backend, from the server's /metrics once
    the exporter has flushed what the schedulers recorded."""
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from sglang_fl.metrics import FLUSH_S

    time.sleep(FLUSH_S + 1)
    status, text = server.request("GET", "/metrics")
    assert status == 200, text[:300]
    return {s.labels["op"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "sglang_fl_collectives_total"
            and s.labels["backend"] == "gloo"}


def test_tp2_serves_the_same_greedy_ids_as_tp1(tiny_model, prompt_ids, single_process, hf_ids,
                                               tmp_path):
    tp1, log1 = single_process
    counted = {}
    tp2, log2 = serve_greedy(tiny_model, prompt_ids, tmp_path / "server-tp2.log", tp=2,
                             extra_args=("--enable-metrics",),
                             then=lambda srv: counted.update(_collectives_by_gloo(srv)))
    assert [len(ids) for ids in tp2] == [MAX_NEW] * len(PROMPTS)
    assert tp2 == tp1
    assert tp1 == hf_ids
    assert len({tuple(ids) for ids in tp1}) == len(PROMPTS)  # distinct prompts, distinct output

    # TP=1 never builds a communicator; TP=2 builds one per rank and uses it for the model's
    # all-reduce (row-parallel layers) and all-gather (vocab-parallel logits).
    assert "CommunicatorFL(torch) for tp" not in log1
    for rank in (0, 1):
        for method in ("all_reduce", "all_gather"):
            line = f"rank {rank}: first {method} through CommunicatorFL(torch)"
            assert any(line in x and "tp:" in x for x in log2.splitlines()), line
    # and /metrics counts them by backend (prometheus multiprocess mode: the HTTP process
    # exports what the schedulers recorded, within the exporter's flush interval)
    assert counted.get("all_reduce", 0) > 0 and counted.get("all_gather", 0) > 0, counted


def test_tp2_moe_serves_hf_greedy_ids_with_the_experts_sharded(tmp_path):
    """The Qwen3-MoE preset (128 experts, top-8) at TP=2: each rank's routed ``fused_moe`` call
    computes its half of every expert's intermediate size, the row-parallel sum goes through
    CommunicatorFL, and the greedy ids still equal HF transformers'."""
    from transformers import AutoTokenizer

    from sglang_fl.models import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny-qwen3-moe", preset="qwen3-moe")
    tok = AutoTokenizer.from_pretrained(model)
    prompt_ids = [tok(t)["input_ids"] for t in PROMPTS]
    tp2, log = serve_greedy(model, prompt_ids, tmp_path / "server-moe-tp2.log", tp=2)
    assert tp2 == hf_greedy(model, prompt_ids)
    routed = [x for x in log.splitlines() if "[OOT-DISPATCH] UnquantizedFusedMoEMethod → reference" in x]
    assert len(routed) == 2, "each rank routes its experts through the plugin"
    for rank in (0, 1):
        line = f"rank {rank}: first all_reduce through CommunicatorFL(torch)"
        assert any(line in x and "tp:" in x for x in log.splitlines()), line
