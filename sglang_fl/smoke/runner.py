"""Run the smoke checks: one in this process (``--layer``), or the suite, each check in a fresh
interpreter with its own environment. Exit status: 0 all passed (or reported disabled as
expected), 1 a check failed, 3 a check was skipped and ``--no-skip`` was given, 2 bad usage."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from sglang_fl.smoke import LAYER_ENV, LAYERS, SmokeFailure, SmokeSkip

RESULT_PREFIX = "SMOKE-RESULT "
# Switches a check pins or sets per run: the suite drops the caller's values of these.
_CONTROLLED = ("USE_FLAGGEMS", "SGLANG_FL_OOT_ENABLED", "SGLANG_FL_DISPATCH_LOG",
               "SGLANG_FLAGGEMS_RECORD", "SGLANG_FLAGGEMS_LOG_PATH")


def layer_env(layer: str, workdir: Path) -> dict[str, str]:
    """The variables the suite sets for one check (on top of the caller's environment)."""
    env = dict(LAYER_ENV[layer])
    if layer == "1":
        env["SGLANG_FLAGGEMS_RECORD"] = "1"
        env["SGLANG_FLAGGEMS_LOG_PATH"] = str(workdir / "layer1-aten.log")
    if layer in ("2", "all"):
        env["SGLANG_FL_DISPATCH_LOG"] = str(workdir / f"layer{layer}-dispatch.log")
    return env


def run_one(layer: str, workdir: Path, tp: int, server_args: tuple[str, ...] = ()) -> dict:
    """Run one check here and return its result (status passed|disabled|skipped|failed)."""
    from sglang_fl.smoke.checks import CHECKS

    start = time.monotonic()
    try:
        kwargs = {"tp": tp, "server_args": server_args} if layer == "all" else {}
        result = CHECKS[layer](workdir, **kwargs)
    except SmokeSkip as exc:
        result = {"status": "skipped", "detail": str(exc)}
    except (SmokeFailure, AssertionError) as exc:
        result = {"status": "failed", "detail": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - any crash is a failed smoke, reported with its trace
        result = {"status": "failed",
                  "detail": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"}
    result["layer"] = layer
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def run_suite(layers: list[str], workdir: Path, tp: int, timeout: float,
              server_args: str = "") -> list[dict]:
    base = {k: v for k, v in os.environ.items() if k not in _CONTROLLED}
    results = []
    for layer in layers:
        env = layer_env(layer, workdir)
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "(platform defaults)"
        print(f"--- smoke layer {layer}: {shown}", flush=True)
        cmd = [sys.executable, "-m", "sglang_fl.smoke", "--layer", layer, "--workdir",
               str(workdir), "--tp", str(tp)]
        if server_args:
            cmd.append(f"--server-args={server_args}")
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True,
                                  timeout=timeout)
            out = proc.stdout + proc.stderr
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
            if lines:
                result = json.loads(lines[-1][len(RESULT_PREFIX):])
            else:
                result = {"layer": layer, "status": "failed",
                          "detail": f"exit {proc.returncode} without a result:\n{out[-3000:]}"}
        except subprocess.TimeoutExpired:
            result = {"layer": layer, "status": "failed", "detail": f"timed out after {timeout:.0f}s"}
        result["seconds"] = round(time.monotonic() - start, 1)
        result["env"] = env
        print(f"    {result['status'].upper()} ({result['seconds']}s): {result['detail']}", flush=True)
        results.append(result)
    return results


def exit_status(results: list[dict], no_skip: bool) -> int:
    statuses = {r["status"] for r in results}
    if "failed" in statuses:
        return 1
    if "skipped" in statuses and no_skip:
        return 3
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_fl.smoke", description=__doc__)
    ap.add_argument("--layer", choices=LAYERS, help="run this one check in this process")
    ap.add_argument("--layers", default=",".join(LAYERS),
                    help="suite: comma-separated checks to run (default: all five)")
    ap.add_argument("--workdir", help="logs and the tiny model go here (default: a temp dir)")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel size of the served check")
    ap.add_argument("--server-args", default="",
                    help="extra launch_server arguments for the served check, one string")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per check (suite)")
    ap.add_argument("--no-skip", action="store_true", help="a skipped check fails the suite")
    ap.add_argument("--json", metavar="FILE", help="also write the suite's results to FILE")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="sglang-fl-smoke-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.tp < 1:
        ap.error("--tp must be >= 1")

    if args.layer:
        result = run_one(args.layer, workdir, args.tp, tuple(shlex.split(args.server_args)))
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return exit_status([result], no_skip=args.no_skip)

    layers = [x.strip() for x in args.layers.split(",") if x.strip()]
    bad = [x for x in layers if x not in LAYERS]
    if bad or not layers:
        ap.error(f"--layers {args.layers!r}: unknown {bad}; accepted: {', '.join(LAYERS)}")
    print(f"sglang-fl smoke suite in {workdir}", flush=True)
    results = run_suite(layers, workdir, args.tp, args.timeout, args.server_args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    code = exit_status(results, args.no_skip)
    print("smoke: " + ", ".join(f"layer {r['layer']} {r['status']}" for r in results)
          + f" -> exit {code}", flush=True)
    return code
