"""How a served process ends: SIGTERM after requests SGLang 0.5.11 used to leak (compat ledger
``fix:request_state_leak``) with status 0 (``fix:sigterm_exit_status``: 0.5.11 SIGKILLed
itself), also through the image entrypoint; a crashed child keeps a non-zero status; and a
server launched from a worker thread (serving._spawn). Runs on both SGLang versions
(noxfile's SGLANG_0_5_23_TESTS)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from e2e_support import SERVER_ARGS, process_env, serve

from sglang_fl.serving import free_port

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
    assert srv.stop_result.returncode == 0, srv.stop_result  # a clean stop is no crash
    assert seconds < 15, srv.stop_result
    assert _group(pgid) == []
    assert "Remaining number of requests 0" in srv.log_text()


ENTRYPOINT = Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh"


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


def test_the_image_entrypoint_stopped_by_sigterm_exits_0(tiny_model, tmp_path):
    """What ``docker stop`` does to the container's process (the entrypoint execs SGLang)."""
    port, log = free_port("127.0.0.1"), tmp_path / "server.log"
    env = process_env(tmp_path, SGLANG_FL_PYTHON=sys.executable,
                      SGLANG_FL_PORT_FILE=str(tmp_path / "port"))
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(ENTRYPOINT), "launch_server", "--model-path", str(tiny_model),
                                 "--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS],
                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        _wait_healthy(proc, port, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        assert "sglang-fl preflight: ok" in log.read_text()
    finally:
        for child in _group(proc.pid):
            child.kill()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_crashed_scheduler_keeps_a_non_zero_status(tiny_model, tmp_path):
    with serve(tiny_model, tmp_path) as srv:
        launcher = psutil.Process(srv.process.pid)
        schedulers = [c for c in launcher.children() if "scheduler" in " ".join(c.cmdline()).lower()
                      or "scheduler" in c.name().lower()]
        victim = (schedulers or launcher.children())[0]
        victim.send_signal(signal.SIGKILL)
        try:
            status = srv.process.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launch_server outlived its scheduler by 60 s:\n{srv.log_text()[-3000:]}")
    assert status != 0, srv.log_text()[-3000:]
    assert not srv.stop_result.clean


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
