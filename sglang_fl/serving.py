"""Start SGLang's ``launch_server`` module as a child process and stop it cleanly.

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

A server lives as long as the process that launched it, whichever thread launched it: it gets
SIGTERM when that process dies without cleaning up (see `_spawn`). `stop` returns a
`StopResult` saying whether the stop was clean (also kept as ``Server.stop_result``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from sglang_fl.logging_setup import get_logger

logger = get_logger("serving")

DEFAULT_START_TIMEOUT_S = 300.0


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


class PortInUseError(ServerStartError):
    """A port the server needed was taken, by the time it bound it, by another process."""


#: What a server that lost a port logs: uvicorn's bind error (the server then hangs instead of
#: exiting), torch.distributed's store, SGLang's own port checks.
PORT_IN_USE_MARKERS = ("address already in use", "eaddrinuse", "port is already in use")
#: Servers started on a port chosen here are started again on a fresh one this many times.
PORT_ATTEMPTS = 3


def _port_range(ephemeral: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """Where servers started here get their ``--port``: below the OS's ephemeral range, and so
    that the gRPC port SGLang derives (port + 10000) stays <= 65535.

    A port inside the ephemeral range can be handed to the health-check client as its own
    source port while the server is not listening yet: the client then connects to itself and
    reads back its own request (CI, 2026-12-05: ``BadStatusLine: GET /health HTTP/1.1``). Where
    the range leaves too little room below it, the old 20000-50000 stays; `Server.healthy`
    treats such an answer as "not yet" either way."""
    try:
        low = int(Path(ephemeral).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    top = min(low, 55536)
    return (20000, top) if top - 20000 >= 2000 else (20000, 50000)


PORT_RANGE = _port_range()


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


@dataclass(frozen=True)
class StopResult:
    """How a server ended. ``clean``: we stopped it with SIGTERM and it (with its whole process
    group) was gone within the timeout. ``returncode`` is then 0 with the plugin; plain SGLang
    0.5.11 ends a clean shutdown by SIGKILLing its own process tree (-9; the compat ledger's
    ``fix:sigterm_exit_status`` makes it 0), so judge by ``clean``.
    Not clean: it had died on its own before `stop`, exited with an error status, or had to be
    SIGKILLed after the timeout."""

    clean: bool
    returncode: int | None
    detail: str


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
    stop_result: StopResult | None = None  # set by launched_server once it stopped the server

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
        except (OSError, urllib.error.URLError, http.client.HTTPException):
            # HTTPException: not an HTTP answer, e.g. a client connected to itself (`_port_range`)
            return False
        return status == 200

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def build_command(model_path: str | os.PathLike, host: str, port: int,
                  extra_args: Sequence[str] = ()) -> list[str]:
    from sglang_fl.sglang_glue.adapters import get_adapter

    return [sys.executable, "-m", get_adapter().LAUNCH_SERVER_MODULE, "--model-path", str(model_path),
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
    or is not healthy within ``timeout`` seconds. A server that loses a port to another process
    while starting is started again on a fresh port when ``port`` was left to this function
    (`PORT_ATTEMPTS` in all), else `PortInUseError` names the port at once.
    """
    chosen = not port
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="sglang-server-", suffix=".log")
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

    # Another process can take a free port between the check and the server's bind (servers
    # started side by side, anything using ephemeral ports): a server on a port chosen here
    # that loses one is started again on a fresh port.
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port(host) if chosen else port
        command = build_command(model_path, host, port, extra_args)
        log_start = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log_file:
            process = _spawn(command, stdout=log_file, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=full_env, start_new_session=True)
        server = Server(f"http://{host}:{port}", port, log_path, process, command, full_env)
        try:
            server.start_seconds = _wait_healthy(server, timeout, progress, log_start)
        except PortInUseError as exc:
            _stop_for_good(server, stop_timeout)
            if chosen and attempt < PORT_ATTEMPTS:
                logger.warning("server on port %d lost a port to another process; starting it "
                               "again on a fresh port (attempt %d of %d)", port, attempt + 1,
                               PORT_ATTEMPTS)
                continue
            raise PortInUseError(f"{exc} (port {port}{' given by the caller' if not chosen else ''}"
                                 f"; {attempt} attempt(s))") from None
        except BaseException:
            _stop_for_good(server, stop_timeout)
            raise
        break
    try:
        yield server
    finally:
        _stop_for_good(server, stop_timeout)


def _stop_for_good(server: Server, stop_timeout: float) -> None:
    """`stop`, recording the result; a second Ctrl-C while stopping kills the group at once."""
    try:
        server.stop_result = stop(server, stop_timeout)
    except KeyboardInterrupt:  # a second Ctrl-C while stopping: no waiting, no leftovers
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.process.pid, signal.SIGKILL)
        raise


def _spawn(command: list[str], **popen_kwargs) -> subprocess.Popen:
    """``Popen`` from this process's spawner thread, with SIGTERM as parent-death signal (Linux).

    The server runs in its own session, so nothing else stops it if this process is SIGKILLed
    or killed by a CI timeout without running its ``finally``: PR_SET_PDEATHSIG does. But the
    kernel sends that signal when the *thread* that forked the child exits, not the process.
    Forking from the caller's thread would kill a server started from a worker thread (e.g. a
    ThreadPoolExecutor) as soon as that thread ends; so every server is forked by one daemon
    thread that lives exactly as long as the process (daemon: it never delays exit), and the
    signal then means "the launching process died"."""
    done: Future = Future()
    _spawner_queue().put((done, command, popen_kwargs))
    try:
        return done.result()
    except KeyboardInterrupt:  # nobody will own what the spawner is starting: kill it
        done.add_done_callback(_kill_unowned)
        raise


def _kill_unowned(done: Future) -> None:
    if done.exception() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(done.result().pid, signal.SIGKILL)


_spawner_lock = threading.Lock()
_spawner: queue.SimpleQueue | None = None


def _spawner_queue() -> queue.SimpleQueue:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            jobs: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_spawn_forever, args=(jobs,), name="sglang-fl-spawner",
                             daemon=True).start()
            _spawner = jobs
        return _spawner


def _forget_spawner() -> None:  # a forked child has no spawner thread: it starts its own
    global _spawner, _spawner_lock
    _spawner, _spawner_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_spawner)


def _spawn_forever(jobs: queue.SimpleQueue) -> None:
    preexec = _term_when_parent_dies() if sys.platform.startswith("linux") else None
    while True:
        done, command, popen_kwargs = jobs.get()
        try:
            done.set_result(subprocess.Popen(command, preexec_fn=preexec, **popen_kwargs))
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller, who raises it
            done.set_exception(exc)


def _term_when_parent_dies() -> Callable[[], None]:
    """The child's pre-exec step: SIGTERM on the death of its parent (the spawner thread), and
    at once if the parent already died between fork and prctl. libc is loaded here, in the
    parent, so the forked child only makes two system calls."""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    PR_SET_PDEATHSIG = 1

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def lost_a_port(path: Path, start: int = 0) -> bool:
    """Whether the log written since byte ``start`` says a port was taken."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode("utf-8", errors="replace").lower()
    except OSError:
        return False
    return any(marker in text for marker in PORT_IN_USE_MARKERS)


def _wait_healthy(server: Server, timeout: float, progress, log_start: int = 0) -> float:
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        code = server.process.poll()
        if lost_a_port(server.log_path, log_start):
            raise PortInUseError(f"server lost a port to another process ({elapsed:.0f}s); log "
                                 f"{server.log_path}:\n{log_tail(server.log_path)}")
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


def stop(server: Server, timeout: float = 30.0) -> StopResult:
    """Stop the server and everything it started; say whether that went cleanly.

    SIGTERM to launch_server first (SGLang drains requests and stops its own children), then
    SIGTERM and SIGKILL to whatever is left of its process group; if the drain does not finish
    within ``timeout`` seconds, the whole group is killed at once. See `StopResult` for what
    counts as clean.
    """
    proc = server.process
    pgid = proc.pid  # started with start_new_session: it leads its own group, even once dead
    problems = []
    if proc.poll() is not None:
        problems.append(f"launch_server had already exited on its own (status {proc.returncode})")
        exited = True
    else:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
            exited = True
        except subprocess.TimeoutExpired:
            exited = False
            problems.append(f"launch_server did not exit within {timeout:.0f}s of SIGTERM; killed")
        else:
            # 0, or a signal status: our SIGTERM, or SGLang's SIGKILL of its own tree.
            if proc.returncode not in (0, -signal.SIGTERM, -signal.SIGKILL):
                problems.append(f"launch_server exited with status {proc.returncode} after SIGTERM")
    # After an exit, SGLang's children get a moment to follow it, then leftovers get SIGTERM
    # first; after a hung drain, no more waiting.
    if exited:
        _wait_group(pgid, 5.0)
    for sig in ((signal.SIGTERM, signal.SIGKILL) if exited else (signal.SIGKILL,)):
        if not _group_alive(pgid):
            break
        if exited:
            problems.append(f"processes of its group were left; sent {sig.name}")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        _wait_group(pgid, 5.0)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)
    if problems:
        return StopResult(False, proc.returncode, "; ".join(problems))
    return StopResult(True, proc.returncode, "stopped by SIGTERM")


def _group_alive(pgid: int) -> bool:
    """Whether a live (not zombie) process is in group ``pgid``. Zombies count as gone: they
    have exited, and whether their new parent reaps them soon is not ours to wait for."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not sys.platform.startswith("linux"):
        return True
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _wait_group(pgid: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and _group_alive(pgid):
        time.sleep(0.2)
