"""The launcher's process handling, on small real processes that stand in for launch_server:
what `stop` reports, and who owns a server started from a worker thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sglang_fl import serving

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX process groups")

# What launch_server does on SIGTERM once its drain is done: SIGKILL its own tree.
SELF_KILL_ON_TERM = ("import os, signal, time\n"
                     "signal.signal(signal.SIGTERM, lambda *a: os.kill(os.getpid(), signal.SIGKILL))\n")
IGNORE_TERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
EXIT_1_ON_TERM = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(1))\n"


def _server(tmp_path: Path, code: str) -> serving.Server:
    """A process that prints READY once its signal handling is set up, then waits."""
    command = [sys.executable, "-c", code + "print('READY', flush=True)\ntime.sleep(120)\n"]
    proc = serving._spawn(command, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          start_new_session=True)
    assert proc.stdout.readline().strip() == b"READY"
    return serving.Server("http://127.0.0.1:1", 1, tmp_path / "log", proc, command, {})


def test_sigterm_stop_that_completes_is_clean_although_the_status_is_minus_9(tmp_path):
    result = serving.stop(_server(tmp_path, SELF_KILL_ON_TERM), timeout=10)
    assert result.clean, result
    assert result.returncode == -signal.SIGKILL
    assert result.detail == "stopped by SIGTERM"


def test_server_that_died_on_its_own_is_a_failure(tmp_path):
    srv = _server(tmp_path, "import sys, time\nprint('READY', flush=True)\nsys.exit(3)\n")
    srv.process.wait(10)
    result = serving.stop(srv, timeout=10)
    assert not result.clean and result.returncode == 3
    assert "exited on its own" in result.detail


def test_server_killed_after_the_timeout_is_a_failure(tmp_path):
    srv = _server(tmp_path, IGNORE_TERM)
    start = time.monotonic()
    result = serving.stop(srv, timeout=1)
    assert time.monotonic() - start < 10
    assert not result.clean and result.returncode == -signal.SIGKILL
    assert "did not exit within 1s" in result.detail
    assert not serving._group_alive(srv.process.pid)


def test_error_status_after_sigterm_is_a_failure(tmp_path):
    result = serving.stop(_server(tmp_path, EXIT_1_ON_TERM), timeout=10)
    assert not result.clean and result.returncode == 1
    assert "status 1 after SIGTERM" in result.detail


def test_server_started_from_a_thread_outlives_that_thread(tmp_path):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("srv", _server(tmp_path, SELF_KILL_ON_TERM)))
    thread.start()
    thread.join()
    time.sleep(2)  # the parent-death signal came ~at once when the forking thread was the parent
    assert box["srv"].process.poll() is None
    assert serving.stop(box["srv"], timeout=10).clean


def test_server_gets_sigterm_when_its_owner_process_is_killed(tmp_path):
    owner_code = textwrap.dedent("""
        import subprocess, sys, threading, time
        from sglang_fl import serving
        box = {}
        def start():
            box["p"] = serving._spawn([sys.executable, "-c", "import time; time.sleep(120)"],
                                      start_new_session=True)
        t = threading.Thread(target=start)
        t.start(); t.join()
        print(box["p"].pid, flush=True)
        time.sleep(120)
    """)
    owner = subprocess.Popen([sys.executable, "-c", owner_code], stdout=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        child = int(owner.stdout.readline())
        time.sleep(1)
        assert serving._group_alive(child)  # the thread that started it is gone; it lives on
        owner.kill()
        owner.wait(10)
        deadline = time.monotonic() + 10
        while serving._group_alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not serving._group_alive(child)
    finally:
        owner.kill()
        owner.wait(10)


# Stands in for launch_server: the first start loses its HTTP port the way uvicorn reports it
# (and then hangs, as SGLang's server does); a later start serves /health on its port.
LOSES_ITS_PORT_ONCE = textwrap.dedent("""
    import http.server, os, sys, time
    marker, port = sys.argv[1], int(sys.argv[2])
    if not os.path.exists(marker):
        open(marker, "w").close()
        print("ERROR:    [Errno 98] error while attempting to bind on address "
              f"('127.0.0.1', {port}): address already in use", flush=True)
        time.sleep(120)
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
    http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
""")


@pytest.fixture
def loses_its_port_once(tmp_path, monkeypatch):
    marker = tmp_path / "lost-once"
    ports = []

    def command(model_path, host, port, extra_args=()):
        ports.append(port)
        return [sys.executable, "-c", LOSES_ITS_PORT_ONCE, str(marker), str(port)]

    monkeypatch.setattr(serving, "build_command", command)
    return ports


def test_a_server_that_lost_its_chosen_port_starts_again_on_a_fresh_one(tmp_path,
                                                                        loses_its_port_once):
    start = time.monotonic()
    with serving.launched_server("model", log_path=tmp_path / "s.log", timeout=60) as srv:
        assert srv.healthy()
        assert len(loses_its_port_once) == 2 and srv.port == loses_its_port_once[1]
        assert loses_its_port_once[0] != loses_its_port_once[1]
    assert time.monotonic() - start < 30  # not the 60 s start timeout: the bind error is read
    assert srv.stop_result is not None


def test_a_server_that_lost_the_callers_port_is_an_error_naming_it(tmp_path, loses_its_port_once):
    port = serving.free_port()
    start = time.monotonic()
    with pytest.raises(serving.PortInUseError, match=f"port {port} given by the caller"):
        with serving.launched_server("model", port=port, log_path=tmp_path / "s.log", timeout=60):
            pass
    assert time.monotonic() - start < 30 and loses_its_port_once == [port]


@pytest.mark.parametrize("content, expected", [
    ("32768\t60999\n", (20000, 32768)),   # Linux's default: below the ephemeral range
    ("40000 60999", (20000, 40000)),
    ("60000 65000", (20000, 55536)),      # the gRPC port (port + 10000) must stay <= 65535
    ("1024 65000", (20000, 50000)),       # no room below: the old range
    ("", (20000, 32768)),                 # unreadable: Linux's default
])
def test_server_ports_come_from_below_the_ephemeral_range(tmp_path, content, expected):
    path = tmp_path / "ip_local_port_range"
    path.write_text(content)
    assert serving._port_range(str(path)) == expected
    assert serving._port_range(str(tmp_path / "missing")) == (20000, 32768)


def test_a_health_check_that_reads_back_its_own_request_is_not_healthy(tmp_path):
    """What a client connected to itself sees (its own request line as the status line): not
    healthy yet, so the wait goes on, instead of an exception that fails the start."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def echo():
        conn, _ = listener.accept()
        with conn:
            conn.sendall(conn.recv(65536))

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    server = serving.Server(url=f"http://127.0.0.1:{port}", port=port, log_path=tmp_path / "log",
                            process=None, command=[], env={})
    try:
        assert server.healthy(timeout=5) is False
    finally:
        thread.join(5)
        listener.close()
