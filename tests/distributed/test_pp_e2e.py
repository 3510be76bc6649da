"""Pipeline parallelism end to end on CPU: ``launch_server --pp-size 2`` (and ``--tp-size 2
--pp-size 2``) with sglang-fl and the tiny model serves the same greedy ids as the
single-process server and as HF transformers; the stage-to-stage hand-offs (SGLang's
``send_tensor_dict`` / ``recv_tensor_dict`` on the PP group) went through CommunicatorFL, whose
running counts are in the log; and a stage killed from outside stops the whole server at once,
with a line naming it, instead of leaving it hanging.

The pp=2 server serves the greedy check first and is then killed (one start for both tests).
"""

from __future__ import annotations

import threading
import time

import pytest
from l3_helpers import (
    MAX_NEW,
    PROMPTS,
    generate_greedy,
    layer3_counts,
    serve_greedy,
    server_env,
)

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]

EXIT_WITHIN_S = 60  # SGLang's watchdog polls each second; a stuck gloo peer would take 30 min


@pytest.fixture(scope="module")
def pp2(tiny_model, prompt_ids, tmp_path_factory):
    """A running ``--pp-size 2`` server and the greedy ids it served."""
    from sglang_fl.serving import launched_server

    log = tmp_path_factory.mktemp("pp2") / "server-pp2.log"
    args = ["--dtype", "float32", "--pp-size", "2"]
    with launched_server(tiny_model, args, server_env(pp=2), log_path=log,
                         timeout=400) as srv:
        yield srv, generate_greedy(srv, prompt_ids)


def assert_stage_traffic_through_layer3(log: str, group: str = "pp:0") -> None:
    """Both stages sent and received tensor dicts through CommunicatorFL, at least one each way
    per generated token, and what one stage sent the other received (counts logged at powers of
    two: equal, or one power apart when read while a hand-off is in flight)."""
    sent, received = (layer3_counts(log, group, m) for m in ("send_tensor_dict", "recv_tensor_dict"))
    assert set(sent) == set(received) == {0, 1}, (sent, received)
    for src, dst in ((0, 1), (1, 0)):  # stage 0 -> 1: activations; 1 -> 0: sampled tokens
        assert sent[src] >= MAX_NEW // 2 and received[dst] >= MAX_NEW // 2, (sent, received)
        assert sent[src] // 2 <= received[dst] <= sent[src] * 2, (sent, received)


def test_pp2_serves_the_same_greedy_ids_as_one_process(pp2, single_process, hf_ids):
    srv, ids = pp2
    assert [len(x) for x in ids] == [MAX_NEW] * len(PROMPTS)
    assert ids == single_process[0]
    assert ids == hf_ids
    log = srv.log_text()
    for rank in (0, 1):
        assert "CommunicatorFL(torch) for pp:0: ranks [0, 1]" in log
        assert f"pp:0 rank {rank}: first send_tensor_dict through CommunicatorFL(torch)" in log
    assert_stage_traffic_through_layer3(log)
    assert "CommunicatorFL(torch) for pp" not in single_process[1]


def test_a_killed_stage_stops_the_server_with_a_message_naming_it(pp2):
    import psutil

    srv, _ = pp2
    answer: dict[str, object] = {}

    def long_request():
        try:
            answer["status"] = srv.request("POST", "/generate", {
                "text": "Hello", "sampling_params": {
                    "temperature": 0, "max_new_tokens": 4000, "ignore_eos": True}},
                timeout=EXIT_WITHIN_S)[0]
        except Exception as exc:  # noqa: BLE001 - the connection is expected to break
            answer["error"] = repr(exc)

    in_flight = threading.Thread(target=long_request, daemon=True)
    in_flight.start()
    time.sleep(1.0)  # the request is being decoded, hand-offs in both directions
    stages = [p for p in psutil.Process(srv.process.pid).children(recursive=True)
              if "scheduler_PP1" in " ".join(p.cmdline())]
    assert len(stages) == 1, stages
    start = time.monotonic()
    stages[0].kill()
    srv.process.wait(timeout=EXIT_WITHIN_S)  # raises TimeoutExpired on a hang
    took = time.monotonic() - start
    in_flight.join(timeout=EXIT_WITHIN_S)
    assert not in_flight.is_alive() and answer.get("status") != 200, answer
    log = srv.log_text()
    assert f"server stopping: process scheduler_1 (PP1 TP0) (pid {stages[0].pid}) was killed by SIGKILL" \
        in log, log[-3000:]
    assert took < EXIT_WITHIN_S


def test_tp2_pp2_serves_the_same_greedy_ids_as_one_process(tiny_model, prompt_ids, single_process,
                                                          hf_ids, tmp_path):
    ids, log = serve_greedy(tiny_model, prompt_ids, tmp_path / "server-tp2-pp2.log", tp=2, pp=2)
    assert ids == single_process[0] == hf_ids
    # Each of the 4 ranks has a TP group of 2 (all-reduce, all-gather) and a PP group of 2.
    for rank in (0, 1):
        assert f"tp:0 rank {rank}: first all_reduce through CommunicatorFL(torch)" in log
    assert log.count("CommunicatorFL(torch) for pp:0") == 4
    assert_stage_traffic_through_layer3(log)
