"""How a served process ends: SIGTERM after requests SGLang 0.5.11 used to leak (compat ledger
``fix:request_state_leak``), and a server launched from a worker thread (serving._spawn)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from e2e_support import SERVER_ARGS, process_env, serve

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e


def _group(pgid: int) -> list[psutil.Process]:
    """Live (not zombie) processes of group ``pgid``."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return alive


def _chat(server, **fields):
    payload = {"model": "default", "messages": [{"role": "user", "content": "hello"}],
               "max_tokens": 2, "temperature": 0, **fields}
    return server.request("POST", "/v1/chat/completions", payload)


def test_requests_sglang_used_to_leak_do_not_block_a_sigterm_stop(tiny_model, tmp_path):
    context = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    with serve(tiny_model, tmp_path) as srv:
        pgid = srv.process.pid
        assert len(_group(pgid)) >= 3  # launch_server, scheduler, detokenizer
        rejected = {
            "chat max_tokens=-1": _chat(srv, max_tokens=-1),
            "chat temperature=-1": _chat(srv, temperature=-1),
            "chat over the context length": _chat(
                srv, messages=[{"role": "user", "content": "hello " * (context + 8)}]),
        }
        for kind, (status, body) in rejected.items():
            assert status == 400, (kind, status, body)
        status, body = srv.request("POST", "/generate", {
            "text": "hello", "sampling_params": {"max_new_tokens": 2, "n": 2, "temperature": 0}})
        assert status == 200 and len(body) == 2, body
        status, body = _chat(srv, n=2)
        assert status == 200 and len(body["choices"]) == 2, body
        assert srv.healthy()
        start = time.monotonic()
    seconds = time.monotonic() - start
    assert srv.stop_result.clean, (srv.stop_result, srv.log_text()[-3000:])
    assert seconds < 15, srv.stop_result
    assert _group(pgid) == []
    assert "Remaining number of requests 0" in srv.log_text()


OWNER = textwrap.dedent("""
    import json, sys, threading, time
    from sglang_fl.serving import launched_server
    model, log, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    box = {}
    def start():  # like benchmarks/e2e_bench.py: __enter__ on a worker thread that then ends
        box["cm"] = launched_server(model, args, log_path=log, timeout=240)
        box["srv"] = box["cm"].__enter__()
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    print(json.dumps({"url": box["srv"].url, "pid": box["srv"].process.pid}), flush=True)
    time.sleep(600)
""")


def test_server_started_from_a_finished_thread_serves_and_dies_with_its_owner(tiny_model, tmp_path):
    env = process_env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tiny_model), str(tmp_path / "server.log"), *SERVER_ARGS],
        stdout=subprocess.PIPE, env=env, text=True)
    pgid = None
    try:
        line = owner.stdout.readline()
        assert line, f"owner exited {owner.wait(10)}; log:\n{(tmp_path / 'server.log').read_text()[-3000:]}"
        started = json.loads(line)
        pgid = started["pid"]
        time.sleep(3)  # the launching thread is long gone
        from sglang_fl.serving import Server

        srv = Server(started["url"], 0, tmp_path / "server.log", None, [], {})
        assert srv.healthy()
        body = srv.post_json("/generate", {"text": "hello", "sampling_params": {
            "max_new_tokens": 3, "temperature": 0, "ignore_eos": True}})
        assert body["meta_info"]["completion_tokens"] == 3

        owner.send_signal(signal.SIGKILL)  # no cleanup runs in the owner
        owner.wait(10)
        deadline = time.monotonic() + 30
        while _group(pgid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _group(pgid) == [], "the server outlived the process that launched it"
    finally:
        owner.kill()
        owner.wait(10)
        if pgid is not None:
            for proc in _group(pgid):
                proc.kill()
