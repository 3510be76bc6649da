"""``sglang-fl make-tiny-model`` and ``sglang-fl demo``.

``demo`` is the one-command proof that the plugin serves: it builds (or reuses) the embedded
random-weight Qwen2, runs SGLang's unchanged ``launch_server`` with sglang-fl
loaded, sends one OpenAI-style chat completion, and prints the reply, which backend served each
fused op (from the ``[OOT-DISPATCH]`` log) and the throughput. The server is always shut down.
A Ctrl-C at any moment of the demo stops it, and the server with all it started, with exit
status 130 (`_CtrlC` says why Python's KeyboardInterrupt alone does not do that). Exit status 0
means the chat worked and the server then stopped cleanly
(SIGTERM, gone within the stop timeout; SGLang itself then exits with -9, see
`sglang_fl.serving.StopResult`); any failure, including a server that died on its own or had to
be SIGKILLed, exits non-zero with the reason.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

DISPATCH_LINE = re.compile(r"\[OOT-DISPATCH\]\s+(?P<cls>\S+)\s+→\s+(?P<kind>[a-z]+)\((?P<impl>[^)]*)\)")
DEFAULT_PROMPT = "Say hello to the chip in one sentence."


def default_model_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sglang-fl" / "tiny-qwen2"


def add_subcommands(subparsers) -> None:
    from sglang_fl.models import PRESETS, TinyModelSpec

    p = subparsers.add_parser("make-tiny-model", help="write a random-weight Qwen2, Qwen3-MoE or "
                              "Qwen3.5/3.6 hybrid with a local tokenizer")
    p.add_argument("dir", type=Path, help="output directory (reused if it already holds the same model)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                   help="tiny (Qwen2, 2 CPU cores), qwen3-moe / qwen3.5 / qwen3.5-moe (those "
                        "architectures at tiny sizes), qwen2.5-0.5b / qwen3-30b-a3b / qwen3.6-27b / "
                        "qwen3.6-35b-a3b (the real models' layer shapes, bf16, for GPUs); "
                        "the presets are in sglang_fl/models/tiny.py")
    for f in dataclasses.fields(TinyModelSpec):
        kind = {"bool": _bool_arg, "float": float, "int": int}.get(f.type, str)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=None,
                       help=f"override the preset's {f.name}")
    p.set_defaults(func=cmd_make_tiny_model)

    p = subparsers.add_parser("demo", help="serve the embedded tiny model with the plugin and chat once")
    p.add_argument("--model", help="serve this model (path or hub id) instead of the tiny one")
    p.add_argument("--model-dir", type=Path, default=None,
                   help=f"where the tiny model is built or reused (default {default_model_dir()})")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for /health")
    p.add_argument("--log", type=Path, default=None, help="server log file (default: a temp file)")
    p.add_argument("server_args", nargs="*", metavar="-- SERVER_ARG",
                   help="extra launch_server options after --, e.g. -- --tp-size 2")
    p.set_defaults(func=cmd_demo)


def _bool_arg(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is not a boolean (accepted: true/false, 1/0, yes/no, on/off)")


def cmd_make_tiny_model(args) -> int:
    from sglang_fl.models import TinyModelSpec, make_tiny_model

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TinyModelSpec)
                 if getattr(args, f.name) is not None}
    try:
        path = make_tiny_model(args.dir, preset=args.preset, **overrides)
    except (ValueError, FileExistsError) as exc:
        print(f"sglang-fl make-tiny-model: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def parse_dispatch_log(text: str) -> dict[str, set[str]]:
    """Layer class -> the ``kind(impl)`` labels that served it, from ``[OOT-DISPATCH]`` lines."""
    served: dict[str, set[str]] = {}
    for m in DISPATCH_LINE.finditer(text):
        served.setdefault(m["cls"], set()).add(f"{m['kind']}({m['impl']})")
    return served


class _Progress:
    """One status line while the server starts: rewritten in place on a terminal."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream
        self.tty = stream.isatty()
        self.last = -10.0

    def __call__(self, elapsed: float, last_line: str) -> None:
        if self.tty:
            spinner = "|/-\\"[int(elapsed * 2) % 4]
            self.stream.write(f"\r{spinner} waiting for the server ({elapsed:4.0f}s) {last_line[-60:]:<60}")
            self.stream.flush()
        elif elapsed - self.last >= 5:
            self.last = elapsed
            self.stream.write(f"... waiting for the server ({elapsed:.0f}s)\n")
            self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


class _CtrlC:
    """The demo's SIGINT handler: Python's own (raise KeyboardInterrupt) that also records the
    signal, so that no library can lose a Ctrl-C.

    Python raises KeyboardInterrupt in whatever the main thread runs when the signal comes, and
    some library code drops it: torch's C initialisation imports numpy and clears any error of
    that import, a KeyboardInterrupt included. The demo spends seconds in ``import torch``
    before it launches the server (platform detection: about 2 s, over 10 s on a loaded 2-core
    host); a Ctrl-C there was lost, and the demo served and exited 0. `check` raises it again
    at each step of start-up (and ``launched_server``'s wait then stops the server).
    A SIGINT inherited as ignored (a background job of a non-interactive shell) stays ignored,
    as Python leaves it.
    """

    def __init__(self) -> None:
        self.pressed = False
        self._previous = None

    def __enter__(self) -> _CtrlC:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame) -> None:
        self.pressed = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.pressed:
            raise KeyboardInterrupt


def cmd_demo(args) -> int:
    progress = _Progress()
    with _CtrlC() as ctrl_c:
        try:
            return _demo(args, progress, ctrl_c)
        except KeyboardInterrupt:  # before the launch; _demo answers those that come after it
            progress.done()
            print("\nsglang-fl demo: interrupted before the server was launched", file=sys.stderr)
            return 130


def _demo(args, progress: _Progress, ctrl_c: _CtrlC) -> int:
    from sglang_fl.serving import ServerStartError, build_command, launched_server

    if args.model:
        model = args.model
    else:
        from sglang_fl.models import make_tiny_model

        model_dir = args.model_dir or default_model_dir()
        print(f"tiny model (random weights, replies are gibberish): {model_dir}")
        model = str(make_tiny_model(model_dir))

    workdir = Path(tempfile.mkdtemp(prefix="sglang-fl-demo-"))
    dispatch_log = workdir / "dispatch.log"
    log_path = args.log or workdir / "server.log"
    env = {"SGLANG_FL_DISPATCH_LOG": str(dispatch_log)}
    launch = build_command(model, "<host>", 0)[1:3]  # -m <SGLang's launch_server module>
    ctrl_c.check()  # one that torch's import dropped (build_command detects the platform)
    print(f"launching: python {' '.join(launch)} --model-path {model} {' '.join(args.server_args)}")
    print(f"server log: {log_path}")

    def waiting(elapsed: float, last_line: str) -> None:
        ctrl_c.check()  # raised in launched_server's wait, which then stops the server
        progress(elapsed, last_line)

    try:
        with launched_server(model, args.server_args, env, log_path=log_path, timeout=args.timeout,
                             progress=waiting) as srv:
            ctrl_c.check()
            progress.done()
            print(f"server healthy after {srv.start_seconds:.1f}s at {srv.url}")
            payload = {
                "model": "default",
                "messages": [{"role": "user", "content": args.prompt}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            start = time.perf_counter()
            reply = srv.post_json("/v1/chat/completions", payload, timeout=max(args.timeout, 120))
            seconds = time.perf_counter() - start
            text = reply["choices"][0]["message"]["content"]
            tokens = reply["usage"]["completion_tokens"]
            print(f"\nuser: {args.prompt}\nassistant: {text!r}\n")
            served = parse_dispatch_log(dispatch_log.read_text(encoding="utf-8")
                                        if dispatch_log.exists() else "")
            print("fused ops (Layer 2 dispatch):")
            if served:
                for cls in sorted(served):
                    print(f"  {cls:<16} -> {', '.join(sorted(served[cls]))}")
            else:
                print("  none routed by sglang-fl (Layer 2 off, or the model has no routed layers);"
                      " SGLang's own forward ran")
            print(f"\nthroughput: {tokens} tokens in {seconds:.2f}s = {tokens / seconds:.1f} tok/s "
                  f"(one request, includes prefill)")
        ctrl_c.check()  # one dropped while the request ran or the server stopped
    except ServerStartError as exc:
        progress.done()
        print(f"sglang-fl demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.done()
        print("\nsglang-fl demo: interrupted; server stopped", file=sys.stderr)
        return 130
    except (RuntimeError, KeyError, OSError) as exc:
        print(f"sglang-fl demo: request failed: {exc}\nserver log: {log_path}", file=sys.stderr)
        return 1
    if not srv.stop_result.clean:
        print(f"sglang-fl demo: the server did not stop cleanly: {srv.stop_result.detail}\n"
              f"server log: {log_path}", file=sys.stderr)
        return 1
    print("server stopped")
    return 0
