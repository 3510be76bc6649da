"""Markdown tables for docs/performance.md from the raw JSON of ``op_bench.py`` and
``e2e_bench.py`` (nothing is typed by hand).

    python benchmarks/report.py benchmarks/results/h200/ops.json benchmarks/results/h200/e2e.json

For the end-to-end run it prints medians with min-max and, because single runs on a shared
machine swing by tens of percent, the paired ratio to the anchor: each repeat measured every
configuration back to back, so ``config / anchor`` is taken within a repeat; the median of those
ratios, its 95 % bootstrap confidence interval and the verdict it supports are reported
(benchmarks/paired_stats.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_stats import summarize_pairs  # noqa: E402

E2E_KEYS = (("decode_bs1_tok_s", "decode bs1"), ("decode_bs32_tok_s", "decode bs32"),
            ("prefill_tok_s", "prefill"))


def ops_table(doc):
    head = ("| op | shape | flagos graph | vendor.cuda graph | reference graph | flagos eager | "
            "vendor.cuda eager | reference eager | flagos speed-up vs vendor (graph) |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["results"]:
        shape = ", ".join(f"{k}={v}" for k, v in r.items()
                          if k not in ("op", "dtype") and not isinstance(v, dict))
        cells = [r["op"], shape]
        for mode in ("graph_us", "eager_us"):
            for name in ("flagos", "vendor.cuda", "reference"):
                c = r.get(name, {})
                cells.append(f"{c[mode]['median']:.2f}" if mode in c else "-")
        f, v = r.get("flagos", {}), r.get("vendor.cuda", {})
        cells.append(f"{v['graph_us']['median'] / f['graph_us']['median']:.2f}x"
                     if "graph_us" in f and "graph_us" in v else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _paired(results, name, anchor, key):
    """Paired summary over the repeats both configurations completed (older JSON without
    ``reps`` pairs by position); None with fewer than two such repeats."""
    a, b = results[name][key], results[anchor][key]
    ra = dict(zip(a.get("reps", range(len(a["runs"]))), a["runs"], strict=True))
    rb = dict(zip(b.get("reps", range(len(b["runs"]))), b["runs"], strict=True))
    common = sorted(set(ra) & set(rb))
    if len(common) < 2:  # e2e_bench ran them in different groups
        return None
    return summarize_pairs([ra[r] for r in common], [rb[r] for r in common])


def e2e_tables(doc, anchor="native-L1off", pairs=()):
    res = doc["results"]
    lines = ["| configuration | Layer 2 (dispatch log) | " + " | ".join(
        f"{label} tok/s" for _, label in E2E_KEYS) + " | greedy = HF |",
        "|---|---|" + "---:|" * len(E2E_KEYS) + "---:|"]
    match = doc.get("greedy", {}).get("match", {})
    for name, r in res.items():
        log = doc.get("dispatch_log", {}).get(name) or []
        routes = ", ".join(line.split("] ", 1)[-1] for line in log) or "none (SGLang's own forward)"
        cells = [name, routes]
        for key, _ in E2E_KEYS:
            m = r[key]
            cells.append(f"{m['median']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f})")
        mm = match.get(name)
        cells.append("-" if mm is None else f"{mm:.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    out = ["\n".join(lines)]
    if anchor in res:
        rows = ["| paired ratio: median [95% CI] (verdict), n pairs | " + " | ".join(
            label for _, label in E2E_KEYS) + " |", "|---|" + "---:|" * len(E2E_KEYS)]
        pairs = list(pairs) or [(n, anchor) for n in res if n != anchor]
        for name, base in pairs:
            if name not in res or base not in res:
                continue
            cells = [f"{name} / {base}"]
            for key, _ in E2E_KEYS:
                p = _paired(res, name, base, key)
                if p is None:
                    cells.append("- (not measured in the same repeats: another group)")
                    continue
                cells.append(f"{p['median']:.3f} [{p['ci95'][0]:.3f}-{p['ci95'][1]:.3f}] "
                             f"({p['verdict']}), n={p['n']}")
            rows.append("| " + " | ".join(cells) + " |")
        out.append("\n".join(rows))
    return "\n\n".join(out)


def publish(doc, out, table):
    """How every benchmark here ends: ``doc`` written as JSON to ``out`` when one is given (its
    folder made), then ``table(doc)`` printed; returns ``doc``."""
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1))
    print(table(doc))
    return doc


def main(argv=None):
    for path in (argv or sys.argv[1:]):
        doc = json.loads(Path(path).read_text())
        print(f"<!-- {path} -->")
        if doc.get("benchmark") == "op_bench":
            print(ops_table(doc))
        elif doc.get("benchmark") == "e2e_bench":
            print(e2e_tables(doc, pairs=[
                ("fl-defaults", "native-L1off"), ("vendor-L1off", "native-L1off"),
                ("tuned-L1off", "native-L1off"), ("flagos-L1off", "native-L1off"),
                ("reference-L1off", "native-L1off"), ("fl-defaults", "tuned-L1off"),
                ("tuned-L1off", "vendor-L1off")]))
        print()


if __name__ == "__main__":
    main()
