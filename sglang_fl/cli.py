"""``sglang-fl`` command line: inspect the effective configuration and op dispatch.

- ``sglang-fl config [--json]``: every setting, its value and where it came from.
- ``sglang-fl ops [--json]``: the token buckets, then per op of the op table, its standard
  signature and the SGLang classes it serves (and whether the OOT white/blacklist routes them),
  the impl chosen on this machine, the kind order and the setting it came from (and, per token
  bucket with an order of its own, that bucket's choice and order), the candidates in order, why every
  other registered impl or backend was skipped (a vendor refused by the op table included), and
  (``preferred_unavailable``) the preferred kinds it had to pass over.
Other subcommands (``make-tiny-model``, ``demo``, ...) are added by ``cli_*`` modules.
Every subcommand stops quietly when its stdout is closed early (``| head``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys

from sglang_fl.config import FIELDS, SettingsError, get_settings

_EXTRA_COMMAND_MODULES = ("sglang_fl.cli_serving", "sglang_fl.cli_doctor", "sglang_fl.cli_tune")


def _format_value(value, name: str = "") -> str:
    if name == "token_buckets":
        from sglang_fl.config.settings import format_buckets

        return format_buckets(value.items())
    if isinstance(value, dict):
        return "; ".join(f"{k}={'|'.join(v)}" for k, v in value.items()) or "{}"
    if isinstance(value, list):
        return ",".join(value) or "[]"
    return "null" if value is None else str(value)


def cmd_config(args) -> int:
    settings = get_settings()
    values = settings.as_dict()
    if args.json:
        print(json.dumps({name: {"value": values[name], "origin": settings.origins[name]}
                          for name in values}, indent=2))
        return 0
    width = max(len(f.name) for f in FIELDS)
    for f in FIELDS:
        print(f"{f.name:<{width}}  {_format_value(values[f.name], f.name):<28}  "
              f"({settings.origins[f.name]})")
    return 0


def cmd_ops(args) -> int:
    from sglang_fl.dispatch.report import ops_report

    report = ops_report()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if all(e["chosen"] and all(b["chosen"] for b in e["buckets"].values())
                        for e in report["ops"].values()) else 1
    print(f"platform: {report['platform']}")
    print("backends:")
    for b in report["backends"]:
        if b["available"]:
            state = f"available ({', '.join(b['ops'])})"
            state += f"; lacks the rest here: {b['missing']}" if b["missing"] else ""
        else:
            state = f"unavailable: {b['detail']}"
        print(f"  {b['name']:<16} {b['kind']:<9} {state}")
    print("attention backends of vendor folders (--attention-backend <name>):")
    for a in report["attention_backends"]:
        state = f"not registered: {a['excluded']}" if a["excluded"] else "registered"
        print(f"  {a['name']:<16} {a['vendor']:<16} {state}")
    if not report["attention_backends"]:
        print("  none")
    default = report["attention_backend_default"]
    if default:
        print(f"  default when --attention-backend is unset: {default['name']} (from {default['from']})")
    from sglang_fl.config.settings import format_buckets

    print(f"token buckets: {format_buckets((b['name'], b['max_tokens']) for b in report['token_buckets'])}"
          f" (from {report['token_buckets_from']}); custom ops: {'on' if report['custom_ops'] else 'off'}")
    print("ops:")
    ok = True
    pad = " " * 19
    for op, e in report["ops"].items():
        print(f"  {op:<17} chosen: {e['chosen'] or 'NONE'}   order: {'>'.join(e['order'])} "
              f"(from {e['order_from']})")
        not_routed = [c for c in e["serves"] if c not in e["routed"]]
        serves = ", ".join(e["serves"]) + (f" (not routed: {', '.join(not_routed)})" if not_routed else "")
        if e.get("called_as") and not e["serves"]:
            serves = "SGLang's " + ", ".join(e["called_as"])
        print(f"{pad}serves: {serves}; signature: {e['signature']}")
        print(f"{pad}candidates: {', '.join(e['candidates']) or '-'}")
        for name, b in e["buckets"].items():
            print(f"{pad}bucket {name} ({b['tokens']}): chosen: {b['chosen'] or 'NONE'}"
                  f"   order: {'>'.join(b['order'])} (from op_backends {op}@{name}); "
                  f"candidates: {', '.join(b['candidates']) or '-'}")
            if b.get("error"):
                ok = False
                print(f"{pad}ERROR: {b['error']}")
        for impl_id, limits in e["limits"].items():
            print(f"{pad}{impl_id} accepts only {limits}; other calls go to the next candidate")
        for s in e["skipped"]:
            print(f"{pad}skipped {s['impl']}: {s['why']}")
        if e.get("preferred_unavailable"):
            kinds = ", ".join(p["kind"] for p in e["preferred_unavailable"])
            print(f"{pad}NOTE: no {kinds} impl here (see skipped): using {e['chosen']}")
        if e.get("error"):
            ok = False
            print(f"{pad}ERROR: {e['error']}")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-fl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("config", help="show the effective settings and their origin")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("ops", help="show which implementation each op uses here, and why")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ops)
    for modname in _EXTRA_COMMAND_MODULES:
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
            continue
        module.add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except BrokenPipeError:
        return _stdout_closed()


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SettingsError as exc:
        print(f"sglang-fl: invalid configuration: {exc}", file=sys.stderr)
        return 2


def _stdout_closed() -> int:
    """The reader of our stdout went away (``sglang-fl config --json | head -1``): stop quietly
    with the status a tool killed by SIGPIPE has (128 + 13), as ``cat`` or ``grep`` would.
    Point stdout at /dev/null so the interpreter's final flush does not raise again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (e.g. replaced by a test harness)
        pass
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
