"""Start-up checks: what must hold before SGLang loads anything, each failing in seconds with
one message saying what to fix.

Two callers share these functions, so the image entrypoint and a plain
``launch_server`` started by hand refuse the same input with the same words:

- the image entrypoint runs this module before ``launch_server`` (below);
- the plugin runs `check_model_path` when SGLang builds its ``ServerArgs``
  (``sglang_glue/startup_checks.py``), `load_settings` when SGLang loads it and
  `check_http_port` when ``launch_server`` is called (compat ``fix:http_port_in_use``).

A container that is given a bad model path, a bad ``SGLANG_FL_*`` value or a leader it cannot
reach should stop within seconds, never sit in a retry loop (SGLang would try to download a
missing local path from the Hub, and on 0.5.23 it fails deep in its config code with "Repo id
must be in the form ..."; a worker node waits up to its distributed timeout, 30 minutes by
default, for a leader that is not there).

    python -m sglang_fl.preflight [--leader-timeout S] -- LAUNCH_SERVER_ARGS...

Exit status: 0 fine, 2 bad configuration, model path or a taken HTTP port, 3 the leader cannot
be reached.
Standard library, sglang_fl's settings and (for the Hub cache) huggingface_hub where it is
installed: no torch, no SGLang import (it runs in ~0.2 s).
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import socket
import sys
import time

#: A Hugging Face Hub id (``name`` or ``org/name``, as huggingface_hub's ``validate_repo_id``
#: accepts it), which SGLang downloads when no local path of that name exists.
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")
#: Model sources SGLang reads itself (object stores, Run:ai streamer): never a local path.
REMOTE_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
#: Configurations SGLang can load a local model folder from (HF layout, Mistral's own).
MODEL_CONFIG_FILES = ("config.json", "params.json")
#: ``--model-path`` values SGLang takes for "no model" (its own argument tests use them).
DUMMY_MODELS = ("none", "dummy")
#: launch_server's ``--host`` / ``--port`` when not given.
SGLANG_DEFAULT_HOST, SGLANG_DEFAULT_PORT = "127.0.0.1", 30000


class PreflightError(ValueError):
    """A start-up input that cannot work; ``status`` is the preflight's exit status. A
    ValueError, so that where the plugin raises it inside SGLang's argument handling it reads
    as the bad argument it is."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def _server_options(argv: list[str]) -> argparse.Namespace:
    """The few launch_server options the checks need (spellings as in SGLang 0.5.11)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--model-path", "--model", dest="model_path")
    parser.add_argument("--revision")
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr")
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    ns, _ = parser.parse_known_args(argv)
    return ns


def load_settings():
    """The Settings, every SGLANG_FL_* value and YAML key validated by the plugin's own loader;
    a bad one raises PreflightError naming it (the plugin stops SGLang with the same words)."""
    from sglang_fl.config import SettingsError, get_settings

    try:
        return get_settings()
    except SettingsError as exc:
        raise PreflightError(f"invalid sglang-fl configuration: {exc}") from None


def check_settings() -> str:
    return f"platform {load_settings().platform}"


def hub_offline() -> tuple[bool, str]:
    """Whether huggingface_hub (which SGLang and transformers download through) may download,
    as it decides it (``HF_HUB_OFFLINE``, or transformers' ``TRANSFORMERS_OFFLINE``), and how
    to name that setting in a message."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return False, "HF_HUB_OFFLINE unknown (huggingface_hub not installed)"
    if constants.HF_HUB_OFFLINE:
        return True, "HF_HUB_OFFLINE=1, downloads off"
    return False, "HF_HUB_OFFLINE unset, downloads on"


def _hub_cached(repo_id: str, revision: str | None) -> bool:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot_download(repo_id, revision=revision, local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return False
    return True


def looks_local(model_path: str) -> bool:
    """A path, not a Hub id: absolute, ``./``/``../``/``~``-relative, with more than one
    ``/``, or anything huggingface_hub would refuse as a repo id."""
    return (model_path.startswith(("/", ".", "~")) or model_path.count("/") > 1
            or not HUB_ID.match(model_path) or "--" in model_path or ".." in model_path)


def check_model_path(model_path: str | None, revision: str | None = None) -> str:
    """``model_path`` as SGLang will read it: an existing local model folder or file, a
    remote source SGLang fetches itself, or a Hub id it may download (or finds in the cache
    when downloads are off). Anything else raises PreflightError naming the path, what is
    there instead and the hub-offline setting."""
    if not model_path:
        raise PreflightError("launch_server needs --model-path (a directory mounted into the "
                             "container, e.g. -v /data/models:/models:ro --model-path /models/NAME)")
    if model_path.lower() in DUMMY_MODELS:
        return f"model {model_path} (SGLang loads no model)"
    if os.path.exists(model_path):
        if os.path.isdir(model_path) and not any(
                os.path.isfile(os.path.join(model_path, name)) for name in MODEL_CONFIG_FILES):
            raise PreflightError(f"model path {model_path} is a directory without config.json: "
                                 "point --model-path at the model's own folder")
        unreadable = _unreadable(model_path)
        if unreadable:
            # SGLang would report such a file as "No such file or directory".
            raise PreflightError(
                f"{len(unreadable)} file(s) of {model_path} cannot be read by uid {os.getuid()}, "
                f"e.g. {unreadable[0]}: make the model readable to all (chmod -R a+rX on the "
                "host) or run the container with a --user that owns it")
        return f"model {model_path}"
    if REMOTE_SCHEME.match(model_path):
        return f"model {model_path} (a remote source SGLang reads itself)"
    offline, offline_note = hub_offline()
    if not looks_local(model_path):
        if not offline:
            return f"model {model_path} (not a local path: SGLang fetches it from the Hugging Face Hub)"
        if _hub_cached(model_path, revision):
            return f"model {model_path} (from the Hugging Face cache; {offline_note})"
        from huggingface_hub import constants

        raise PreflightError(
            f"model {model_path} is neither a local path nor in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and {offline_note} (HF_HUB_OFFLINE or "
            "TRANSFORMERS_OFFLINE): download it first "
            f"(hf download {model_path}{' --revision ' + revision if revision else ''}), unset "
            "HF_HUB_OFFLINE, or pass the model's local folder as --model-path")
    parent = os.path.dirname(model_path.rstrip("/")) or "."
    seen = ""
    if os.path.isdir(parent):
        names = sorted(os.listdir(parent))[:10]
        seen = f"; {parent} holds: {', '.join(names) or 'nothing'}"
    raise PreflightError(
        f"model path {model_path} does not exist{seen}. A local path is never downloaded, "
        f"whatever the hub-offline setting ({offline_note}); only a Hub id (org/name, e.g. "
        "Qwen/Qwen2.5-0.5B-Instruct) is. Pass the "
        "model's folder as --model-path; in a container, mount it first (docker run "
        "-v HOST_DIR:/models:ro, compose MODEL_DIR) and pass --model-path /models/<name>")


def _unreadable(path: str) -> list[str]:
    files = [path] if os.path.isfile(path) else [
        os.path.join(path, name) for name in sorted(os.listdir(path))
        if os.path.isfile(os.path.join(path, name))]
    return [f for f in files if not os.access(f, os.R_OK)]


def port_in_use(host: str, port: int) -> str | None:
    """Why an HTTP server cannot listen on ``host:port`` now, or None: each address ``host``
    resolves to is bound as uvicorn binds it (SO_REUSEADDR, IPv6 only on IPv6), then released.
    Only EADDRINUSE counts; any other error (an address this host lacks) is left to the server,
    which reports it itself."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, OverflowError):
        return None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"{addr[0]}:{addr[1]}: address already in use"
    return None


def check_http_port(host: str | None, port: int | None) -> str:
    """Refuse an HTTP ``--host``/``--port`` that another process holds: SGLang would load the
    model first and then wait in its warm-up for up to 12 minutes (compat ``fix:http_port_in_use``
    ends that wait when the port is taken later, during the load)."""
    host = SGLANG_DEFAULT_HOST if host is None else host
    port = SGLANG_DEFAULT_PORT if port is None else port
    problem = port_in_use(host, port)
    if problem:
        raise PreflightError(f"--port {port} (--host {host}) cannot be served: {problem}, by "
                             "another process. Stop that process or pass another --port")
    return f"port {host}:{port} free"


def split_host_port(addr: str) -> tuple[str, int]:
    m = re.match(r"^\[(?P<h6>[^]]+)\]:(?P<p6>\d+)$|^(?P<h>[^:]+):(?P<p>\d+)$", addr)
    if not m:
        raise PreflightError(f"--dist-init-addr {addr!r} is not HOST:PORT")
    return (m["h6"] or m["h"]), int(m["p6"] or m["p"])


def wait_for_leader(addr: str, rank: int, timeout: float, log=print) -> str:
    """Block until the leader's --dist-init-addr accepts a TCP connection, or fail after
    ``timeout`` seconds naming the address and the last error."""
    host, port = split_host_port(addr)
    start = time.monotonic()
    last_note = start
    error = "no attempt"
    while True:
        try:
            with socket.create_connection((host, port), timeout=5):
                pass
            return f"leader {host}:{port} reachable after {time.monotonic() - start:.0f} s"
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
        now = time.monotonic()
        if now - start >= timeout:
            raise PreflightError(
                f"node {rank} cannot reach the leader (node 0) at {host}:{port} after "
                f"{timeout:.0f} s ({error}). Check --dist-init-addr / MASTER_ADDR, that node 0 "
                "is running, and the network between the nodes", status=3)
        if now - last_note >= 30:
            log(f"sglang-fl preflight: node {rank} waiting for the leader at {host}:{port} "
                f"({now - start:.0f} s of {timeout:.0f} s; {error})")
            last_note = now
        time.sleep(1)


def run_checks(argv: list[str], leader_timeout: float, log=print) -> list[str]:
    opts = _server_options(argv)
    notes = [check_settings(), check_model_path(opts.model_path, opts.revision),
             check_http_port(opts.host, opts.port)]
    if opts.nnodes > 1 and opts.node_rank > 0:
        if not opts.dist_init_addr:
            raise PreflightError(f"node {opts.node_rank} of {opts.nnodes} needs --dist-init-addr "
                                 "(the leader's HOST:PORT)")
        notes.append(wait_for_leader(opts.dist_init_addr, opts.node_rank, leader_timeout, log))
    return notes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_fl.preflight", description=__doc__)
    ap.add_argument("--leader-timeout", type=float, default=600.0,
                    help="seconds a node of rank > 0 waits for the leader (default 600)")
    ap.add_argument("server_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    server_args = args.server_args[1:] if args.server_args[:1] == ["--"] else args.server_args
    try:
        notes = run_checks(server_args, args.leader_timeout,
                           log=lambda m: print(m, file=sys.stderr, flush=True))
    except PreflightError as exc:
        print(f"sglang-fl preflight: error: {exc}", file=sys.stderr, flush=True)
        return exc.status
    print("sglang-fl preflight: ok: " + "; ".join(notes), file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
