"""Start ``python -m sglang.launch_server`` as a child process and stop it cleanly.

One launcher for everything that needs a live server: ``sglang-fl demo``, the end-to-end tests,
multi-process (tp) tests, smoke suites and the CPU serving benchmark. The server runs in its own
process group (SGLang spawns a scheduler and a detokenizer, plus one scheduler per TP rank), its
output goes to a log file, and leaving the ``with`` block -- normally, on an exception or on
Ctrl-C -- terminates the whole group, escalating to SIGKILL if it does not exit in time.

    with launched_server(model_path, extra_args=["--tp-size", "2"], env={...}) as srv:
        srv.post_json("/generate", {...})

The command is exactly what a user types; nothing is injected except ``--model-path``,
``--host`` and ``--port``. Whether sglang-fl is loaded is decided the usual way (installed
entry points, ``SGLANG_PLUGINS``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_START_TIMEOUT_S = 300.0


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


# SGLang derives more ports from --port (the gRPC one is port + 10000 and must stay <= 65535),
# so the OS's ephemeral range (up to 60999) is not safe: pick below it ourselves.
PORT_RANGE = (20000, 50000)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port in `PORT_RANGE` that is free right now."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(*PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise ServerStartError(f"no free TCP port found in {PORT_RANGE} on {host}")


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Server:
    """A running server: its address, log file and process."""

    url: str
    port: int
    log_path: Path
    process: subprocess.Popen
    command: list[str]
    env: dict[str, str] = field(repr=False)
    start_seconds: float = 0.0

    def request(self, method: str, path: str, payload: object | None = None,
                timeout: float = 120.0) -> tuple[int, object]:
        """(HTTP status, decoded JSON or text). Does not raise on 4xx/5xx, so tests can check them."""
        data = None if payload is None else (
            payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, body = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, body = err.code, err.read()
        text = body.decode("utf-8", errors="replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def post_json(self, path: str, payload: object, timeout: float = 120.0) -> object:
        """POST and return the JSON body; raises with the body on a non-200 answer."""
        status, body = self.request("POST", path, payload, timeout)
        if status != 200:
            raise RuntimeError(f"POST {path} -> HTTP {status}: {body}")
        return body

    def healthy(self, timeout: float = 5.0) -> bool:
        try:
            status, _ = self.request("GET", "/health", timeout=timeout)
        except (OSError, urllib.error.URLError):
            return False
        return status == 200

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def build_command(model_path: str | os.PathLike, host: str, port: int,
                  extra_args: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
            "--host", host, "--port", str(port), *map(str, extra_args)]


@contextlib.contextmanager
def launched_server(
    model_path: str | os.PathLike,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: str | os.PathLike | None = None,
    timeout: float = DEFAULT_START_TIMEOUT_S,
    progress: Callable[[float, str], None] | None = None,
    stop_timeout: float = 30.0,
) -> Iterator[Server]:
    """Launch a server, wait for ``/health``, yield a `Server`, always stop it.

    ``env`` entries are added to (not substituted for) the current environment; a value of
    ``None`` removes the variable. ``progress(elapsed_s, last_log_line)`` is called about twice
    a second while waiting. Raises `ServerStartError` (with the log tail) if the process exits
    or is not healthy within ``timeout`` seconds.
    """
    port = port or free_port(host)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"sglang-server-{port}-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = str(value)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    command = build_command(model_path, host, port, extra_args)

    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=full_env, start_new_session=True,
                                   preexec_fn=_term_when_parent_dies)
    server = Server(f"http://{host}:{port}", port, log_path, process, command, full_env)
    try:
        server.start_seconds = _wait_healthy(server, timeout, progress)
        yield server
    finally:
        try:
            stop(server, stop_timeout)
        except KeyboardInterrupt:  # a second Ctrl-C while stopping: no waiting, no leftovers
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            raise


def _term_when_parent_dies() -> None:
    """In the child before exec (Linux): SIGTERM it if the launching thread dies, so a launcher
    killed without running its ``finally`` (SIGKILL, a CI timeout) still stops the server.
    Consequence: launch from a thread that outlives the server (normally the main thread)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_healthy(server: Server, timeout: float, progress) -> float:
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        code = server.process.poll()
        if code is not None:
            raise ServerStartError(
                f"server exited with code {code} before it was healthy ({elapsed:.0f}s); "
                f"log {server.log_path}:\n{log_tail(server.log_path)}"
            )
        if server.healthy(timeout=2.0):
            return elapsed
        if elapsed > timeout:
            raise ServerStartError(
                f"server not healthy after {timeout:.0f}s; log {server.log_path}:\n"
                f"{log_tail(server.log_path)}"
            )
        if progress is not None:
            progress(elapsed, log_tail(server.log_path, 1))
        time.sleep(0.5)


def stop(server: Server, timeout: float = 30.0) -> int | None:
    """Stop the server and everything it started.

    SIGTERM to launch_server first (SGLang drains requests and stops its own children), then
    SIGTERM and SIGKILL to whatever is left of its process group; if the drain does not finish
    within ``timeout`` seconds, the whole group is killed at once.
    """
    proc = server.process
    pgid = proc.pid  # started with start_new_session: it leads its own group, even once dead
    graceful = True
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            graceful = False
    # After a clean exit, leftovers get SIGTERM first; after a hung drain, no more waiting.
    for sig in ((signal.SIGTERM, signal.SIGKILL) if graceful else (signal.SIGKILL,)):
        if not _group_alive(pgid):
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        _wait_group(pgid, 5.0)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    return proc.returncode


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_group(pgid: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and _group_alive(pgid):
        time.sleep(0.2)
