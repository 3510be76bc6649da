"""One plugin-on server (reference backend, CPU): endpoints, exact greedy ids, structured
(regex / JSON-schema) output, dispatch log, no stand-in ever called, concurrency, malformed
input."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from e2e_support import EXPECTED_DISPATCH, dispatch_lines, greedy_ids, serve, standin_calls_in

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

CHAT_PROMPTS = [f"Question {i}: what does the {w} do?" for i, w in
                enumerate(["kernel", "server", "layer", "cache"] * 4)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("plugin-on")


@pytest.fixture(scope="module")
def server(tiny_model, run_dir):
    with serve(tiny_model, run_dir) as srv:
        yield srv
    # Malformed requests were sent: SGLang's SIGTERM drain must still end (fixes.py).
    assert srv.stop_result.clean, srv.stop_result


def test_the_template_vendor_is_absent_unless_enabled(server):
    """The copy-source vendor registers nothing (no ops, no template_native) by default
    (tests/e2e/test_vendor_attention.py enables it by name)."""
    log = server.log_text()
    assert "template_native" not in log and "vendor.template" not in log


def test_health(server):
    status, _ = server.request("GET", "/health")
    assert status == 200


def test_generate_greedy_ids_equal_hf_transformers(server, prompt_ids, hf_ids):
    assert greedy_ids(server, prompt_ids) == hf_ids


def _chat(server, content, max_tokens=8):
    return server.post_json("/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
    })


def test_chat_completion_is_the_templated_greedy_continuation(server, tiny_model):
    from transformers import AutoTokenizer

    reply = _chat(server, "hello world")
    assert reply["object"] == "chat.completion"
    assert reply["usage"]["completion_tokens"] == 8
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = tok.apply_chat_template([{"role": "user", "content": "hello world"}],
                                  add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids)
    assert reply["usage"]["prompt_tokens"] == len(ids)
    expected = greedy_ids(server, [ids], max_new_tokens=8)[0]
    assert reply["choices"][0]["message"]["content"] == tok.decode(expected, skip_special_tokens=True)


def test_completions_match_generate(server):
    prompt = "The server answered"
    done = server.post_json("/v1/completions", {"model": "default", "prompt": prompt, "max_tokens": 6,
                                                "temperature": 0, "ignore_eos": True})
    gen = server.post_json("/generate", {"text": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": 6, "ignore_eos": True}})
    assert done["usage"]["completion_tokens"] == 6
    assert done["choices"][0]["text"] == gen["text"]


def test_16_concurrent_chats_each_equal_to_the_same_request_alone(server):
    alone = [_chat(server, p)["choices"][0]["message"]["content"] for p in CHAT_PROMPTS]
    with ThreadPoolExecutor(max_workers=16) as pool:
        together = list(pool.map(lambda p: _chat(server, p)["choices"][0]["message"]["content"],
                                 CHAT_PROMPTS))
    assert together == alone
    assert len(set(alone)) > 1  # the prompts really differ, so a mix-up would show


@pytest.mark.parametrize("body", [b"{not json", {"messages": "not a list", "model": "default"},
                                  {"model": "default", "messages": [{"role": "user", "content": "x"}],
                                   "max_tokens": -3}])
def test_malformed_request_gets_4xx_and_server_keeps_serving(server, body):
    status, answer = server.request("POST", "/v1/chat/completions", body)
    assert 400 <= status < 500, (status, answer)
    assert server.healthy()
    assert _chat(server, "still there?", max_tokens=2)["usage"]["completion_tokens"] == 2


def test_regex_constrained_generate_matches_the_pattern(server):
    """Structured output on CPU: SGLang's xgrammar backend masks the logits there through the
    compat fix grammar_mask_device (SGLang 0.5.11 raises "Unsupported device: cpu" in the
    scheduler, killing the server); greedy, so the same text every run."""
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    answer = server.post_json("/generate", {"text": "Code:", "sampling_params": {
        "temperature": 0, "max_new_tokens": 16, "regex": pattern}})
    assert re.fullmatch(pattern, answer["text"]), answer["text"]
    assert answer["meta_info"]["finish_reason"]["type"] == "stop"


def test_json_schema_chat_returns_an_object_of_the_schema(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "size": {"enum": ["s", "m", "l"]}},
              "required": ["ok", "size"], "additionalProperties": False}
    reply = server.post_json("/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": "status?"}],
        "max_tokens": 64, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "status", "schema": schema}}})
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    value = json.loads(choice["message"]["content"])
    assert set(value) == {"ok", "size"}
    assert isinstance(value["ok"], bool) and value["size"] in ("s", "m", "l")


def test_dispatch_log_has_exactly_the_expected_lines(server, run_dir):
    """Layer 2 routed all three fused ops of Qwen2 to the reference backend, once per process."""
    assert dispatch_lines(run_dir) == sorted(EXPECTED_DISPATCH.values())


def test_served_run_never_called_a_standin(server):
    assert standin_calls_in(server.log_text()) == []


def test_an_idle_cpu_server_waits_instead_of_polling(server):
    """The plugin's CPU default: SGLang's entry scheduler sleeps on its sockets when idle (else
    it keeps a core busy, which a 2-core host's other servers and tests then lack). Not a speed
    check: a polling loop takes most of a core even on a loaded host, a waiting one ~0 %."""
    import time

    import psutil

    assert "server default: sleep_on_idle=True" in server.log_text()
    root = psutil.Process(server.process.pid)
    procs = [root, *root.children(recursive=True)]
    before = {p.pid: sum(p.cpu_times()[:2]) for p in procs}
    time.sleep(3)
    used = {p.pid: round((sum(p.cpu_times()[:2]) - before[p.pid]) / 3, 2) for p in procs}
    assert max(used.values()) < 0.5, f"CPU-seconds per second by pid: {used}"
