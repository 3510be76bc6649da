"""``sglang-fl doctor [--json]``: the report of `sglang_fl.doctor`, as text or JSON; the exit
status is its verdict (0 ok, 1 warnings, 2 cannot serve)."""

from __future__ import annotations

import json


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("doctor", help="check this install and host without starting a "
                              "server: versions, empty mode, routes, Layers 1-3; exit 0/1/2")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    from sglang_fl.doctor import run_doctor

    report = run_doctor()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return report["exit_code"]


def format_report(r: dict) -> str:
    v = r["versions"]
    adapter = f" (adapter {r['sglang_adapter']})" if "sglang_adapter" in r else ""
    lines = [f"versions    sglang-fl {v['sglang_fl']}, SGLang {v['sglang']}{adapter}, torch {v['torch']}, "
             f"triton {v['triton']}, FlagGems {v['flag_gems']}, sglang-kernel {v['sglang_kernel']}"]
    if "platform" in r:
        p = r["platform"]
        device = f" ({p['device']})" if p["device"] else ""
        lines.append(f"platform    {p['name']} (from {p['from']}); chip detected: {p['chip']}{device}; "
                     f"platform YAML: {p['yaml'] or 'none'}")
    if "empty_mode" in r:
        e = r["empty_mode"]
        mode = (f"empty mode: stand-ins for {', '.join(e['standins'])}" if e["standins"]
                else "real install: no stand-ins")
        env = ", ".join(f"{k}={val}" for k, val in e["env_set"].items())
        lines.append(f"install     {mode}" + (f"; set {env}" if env else ""))
        lines.append(f"compat      {len(e['ledger'])} ledger entries active:")
        lines += [f"              {p['name']:<30} {p['why']}" for p in e["ledger"]]
    if r.get("radix_cache"):
        c = r["radix_cache"]
        why = f"; Rust TreeCore: {c['rust_problem']}" if c["rust_problem"] else ""
        lines.append(f"radix cache {c['tree_core']} TreeCore (from {c['from']}){why}")
    if "layer1" in r:
        one = r["layer1"]
        ops = ", ".join(one["ops"]) or "none"
        what = ("off: " + one["reason"] if not one["enabled"] else
                f"on (only_enable): only {ops}" if one["mode"] == "only_enable" else
                f"on (enable): every FlagGems ATen op except {ops}")
        lines.append(f"Layer 1     {what}")
    if "dispatch" in r:
        lines += _dispatch_lines(r["dispatch"])
    if r.get("distributed"):
        d = r["distributed"]
        lines.append(f"Layer 3     backend {d['backend']} (from {d['from'] or 'platform default'}), "
                     f"collectives run by {d['owner']}: {d.get('check', '')}")
        lines.append(f"            FlagCX library: {d['flagcx_library']}")
    notes = (r.get("dispatch") or {}).get("notes") or []
    if notes:
        lines.append("empty mode: these ops run on their next kind (the first one's package is "
                     "left out of this install):")
        lines += [f"  NOTE {n}" for n in notes]
    lines.append("findings:" if r["findings"] else "findings:   none")
    lines += [f"  {f['level'].upper()} [{f['area']}] {f['message']}" for f in r["findings"]]
    lines.append(f"verdict: {r['verdict']} (exit {r['exit_code']}, {r['seconds']} s)")
    return "\n".join(lines)


def _dispatch_lines(d: dict) -> list[str]:
    from sglang_fl.config.settings import format_buckets

    buckets = format_buckets((b["name"], b["max_tokens"]) for b in d["token_buckets"])
    out = ["Layer 2     backends:"]
    out += [f"              {b['name']:<16} " + (f"available ({len(b['ops'])} ops)" if b["available"]
                                                  else f"unavailable: {b['detail']}")
            for b in d["backends"]]
    out.append(f"            token buckets {buckets} (from {d['token_buckets_from']}); "
               f"routed at start-up: {', '.join(d['needed']) or 'nothing (Layer 2 off)'}")
    for op, e in d["ops"].items():
        routes = "  ".join(f"{b}: {label or 'NONE'}" for b, label in e["routes"].items())
        why = f"order {'>'.join(e['order'])} (from {e['order_from']})"
        for name, b in e["buckets"].items():
            why += f"; {name}: order {'>'.join(b['order'])} (from op_backends {op}@{name})"
        if e.get("preferred_unavailable"):
            why += "; passed over " + ", ".join(f"{p['kind']} ({p['why']})" for p in e["preferred_unavailable"])
        out.append(f"  {op:<26} {routes}")
        out.append(f"  {'':<26} {why}")
    return out
