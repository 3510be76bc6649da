"""Write a `sglang-fl tune` result into a platform YAML, so that the shipped orders are tune's
output and say so.

    python tools/apply_tune.py benchmarks/results/h200/<date>/tuned.yaml            # cuda.yaml
    python tools/apply_tune.py TUNED --platform-yaml sglang_fl/config/<platform>.yaml
    python tools/apply_tune.py FULL.yaml REDO.yaml   # REDO's ops (tune --ops ...) replace FULL's
    python tools/apply_tune.py --check [--platform-yaml ...]   # exit 1 unless it is tune's output

What it changes in the platform YAML, and nothing else (Layer-1 keys, ``prefer``,
``dist_backend`` and every comment outside the block stay as they are):

- ``token_buckets`` becomes the tuned file's (tune orders per bucket, so its buckets go with it);
- ``op_backends``: every op the tuned file orders takes its order and its timing comments; an op
  it does not order (not used by the tuned models, or not tuned there) keeps its entry and the
  comments above it, under a line that says so;
- a ``# tuned-from: PATH`` line at the top names the tuned file (relative to the repository), so
  `--check` (and tests/unit/test_apply_tune.py on the shipped cuda.yaml) can tell whether the
  platform's orders still are that file's.

Several tuned files (a full run, then ``tune --ops OP`` runs that redo some ops) apply as one: an
op takes the order of the last file that orders it, each file's provenance is kept, and the
``tuned-from`` line names them all, in order. Their ``token_buckets`` must be the same: an
order is per bucket.

The result is validated as sglang-fl loads a config (known keys, known backends, buckets) before
it is written.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PLATFORM_YAML = REPO / "sglang_fl" / "config" / "cuda.yaml"
TUNED_FROM = "# tuned-from: "
_OP = re.compile(r"^  ([A-Za-z_][A-Za-z0-9_]*):")
_UNTIMED = "not ordered by tune (see its file for why): the platform's order kept"
_KEPT = ("  # Not ordered by that tune run (no tuned model uses them, or they were not tuned "
         "there): kept as before.")


def top_level_block(lines: list[str], key: str) -> tuple[int, int] | None:
    """``[start, end)`` of top-level ``key``'s lines: its own line and every following line
    that is indented, blank or a comment indented under it; None when absent."""
    start = next((i for i, line in enumerate(lines) if line.startswith(f"{key}:")), None)
    if start is None:
        return None
    end = start + 1  # a comment at column 0 ends it: it belongs to what follows
    while end < len(lines) and (lines[end].startswith((" ", "\t")) or not lines[end].strip()):
        end += 1
    return start, end


def op_chunks(block: list[str]) -> dict[str, list[str]]:
    """An ``op_backends`` block's lines by op: each op's key line, its deeper lines and the
    comment lines at its own indent right above it."""
    chunks: dict[str, list[str]] = {}
    pending: list[str] = []
    current = None
    for line in block[1:]:
        m = _OP.match(line)
        if m:
            current = m.group(1)
            chunks[current] = pending + [line]
            pending = []
        elif line.startswith("  #") or not line.strip():
            pending.append(line)
        elif current is not None:  # deeper: the current op's buckets or comments
            chunks[current].append(line)
    return chunks


def _tuned_header(lines: list[str]) -> list[str]:
    """The tuned file's provenance lines (date, device, versions, shapes, dtype, timing), and
    its MIXED lines: a bucket whose fastest kind differs by token count, which a reader of the
    platform YAML should see beside the order that sums it."""
    keep = ("# source:", "# date:", "# device:", "# versions:", "# shapes:", "# dtype:",
            "# buckets:", "# MIXED ")
    return [line for line in lines if line.startswith(keep)]


def merge(named: list[tuple[str, str]]) -> str:
    """One tuned text from several (path, text) runs: the last run that orders an op gives its
    order; each run's provenance under a ``# source:`` line naming its ops."""
    if len(named) == 1:
        return named[0][1]
    buckets = {name: (yaml.safe_load(text) or {}).get("token_buckets") for name, text in named}
    if len({repr(b) for b in buckets.values()}) > 1:
        raise ValueError("the tuned files time different token buckets, so their orders do not "
                         "combine: " + "; ".join(f"{n}: {b}" for n, b in buckets.items()))
    header: list[str] = []
    chunks: dict[str, list[str]] = {}
    bucket_lines: list[str] = []
    for name, text in named:
        lines = text.splitlines()
        span = top_level_block(lines, "op_backends")
        ops = op_chunks(lines[span[0]:span[1]]) if span else {}
        header += [f"# source: {name} (orders {', '.join(ops) or 'no op'})"]
        header += [line for line in _tuned_header(lines) if not line.startswith("# source:")]
        chunks.update(ops)
        own = top_level_block(lines, "token_buckets")
        bucket_lines = bucket_lines or (lines[own[0]:own[1]] if own else [])
    body = ["op_backends:"] + [line for chunk in chunks.values() for line in chunk]
    return "\n".join(header + bucket_lines + body) + "\n"


def apply(tuned_text: str, platform_text: str, tuned_from: str) -> str:
    """``platform_text`` with ``tuned_text``'s buckets and orders (module docstring)."""
    tuned = yaml.safe_load(tuned_text) or {}
    if not isinstance(tuned.get("op_backends"), dict) or not tuned["op_backends"]:
        raise ValueError("the tuned file orders no op (its op_backends is empty or missing): "
                         "nothing to apply; see its '# not tuned' / '# EXCLUDED' lines")
    t_lines = tuned_text.splitlines()
    p_lines = platform_text.splitlines()
    t_ops = top_level_block(t_lines, "op_backends")
    t_buckets = top_level_block(t_lines, "token_buckets")
    buckets = ([line for line in t_lines[t_buckets[0]:t_buckets[1]] if line.strip()]
               if t_buckets else [])
    own_buckets = top_level_block(p_lines, "token_buckets")
    if buckets and own_buckets:  # the platform's own, superseded by the tuned file's
        del p_lines[own_buckets[0]:own_buckets[1]]
    ops_span = top_level_block(p_lines, "op_backends")
    if ops_span is None:
        raise ValueError("the platform YAML has no op_backends block")
    tuned_ops = op_chunks(t_lines[t_ops[0]:t_ops[1]])
    kept = {op: chunk for op, chunk in op_chunks(p_lines[ops_span[0]:ops_span[1]]).items()
            if op not in tuned_ops}
    # A bucket tune could not order (nothing passed there) keeps the platform's order for it.
    before = (yaml.safe_load(platform_text) or {}).get("op_backends") or {}
    for op, order in tuned["op_backends"].items():
        if not isinstance(order, dict) or op not in before:
            continue
        for bucket in tuned.get("token_buckets") or {}:
            old = before[op].get(bucket) if isinstance(before[op], dict) else before[op]
            if bucket not in order and old:
                tuned_ops[op].append(f"    {bucket}: [{', '.join(old)}]  # {_UNTIMED}")

    block = ["op_backends:", f"  # From `sglang-fl tune` ({tuned_from}):"]
    block += [f"  {line}" for line in _tuned_header(t_lines)]
    for chunk in tuned_ops.values():
        block += [line for line in chunk if line.strip()]
    if kept:
        block.append(_KEPT)
        for chunk in kept.values():
            block += [line for line in chunk if line.strip() and line != _KEPT]
    out = p_lines[:ops_span[0]] + buckets + block + p_lines[ops_span[1]:]
    out = [line for line in out if not line.startswith(TUNED_FROM)]
    first = next((i for i, line in enumerate(out) if not line.startswith("#")), len(out))
    out.insert(first, f"{TUNED_FROM}{tuned_from}")
    return "\n".join(out) + "\n"


def validate(text: str) -> None:
    """Load ``text`` as sglang-fl loads a config; raise SettingsError with the reason."""
    from sglang_fl.config.settings import build_settings

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(text)
    try:
        build_settings(env={"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_CONFIG": f.name})
    finally:
        os.unlink(f.name)


def check(platform_yaml: Path) -> str | None:
    """None when ``platform_yaml`` is its named tuned file applied to itself, else why not."""
    text = platform_yaml.read_text(encoding="utf-8")
    named = [line[len(TUNED_FROM):].strip() for line in text.splitlines()
             if line.startswith(TUNED_FROM)]
    if not named:
        return f"{platform_yaml.name} names no tuned file ('{TUNED_FROM}PATH'): not tune's output"
    files = named[0].split()
    missing = [f for f in files if not (REPO / f).is_file()]
    if missing or not files:
        return f"{platform_yaml.name} names {', '.join(missing) or 'no file'}, which does not exist"
    tuned = merge([(f, (REPO / f).read_text(encoding="utf-8")) for f in files])
    want = yaml.safe_load(apply(tuned, text, named[0]))
    have = yaml.safe_load(text)
    for key in ("token_buckets", "op_backends"):
        if want.get(key) != have.get(key):
            return (f"{platform_yaml.name}'s {key} differs from {named[0]} applied: "
                    f"{have.get(key)} != {want.get(key)}")
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tuned", nargs="*", help="YAML written by `sglang-fl tune --out`; several: "
                                             "a later file's ops replace an earlier's")
    ap.add_argument("--platform-yaml", type=Path, default=DEFAULT_PLATFORM_YAML)
    ap.add_argument("--check", action="store_true",
                    help="do not write: exit 1 unless the platform YAML is its named tuned file's")
    args = ap.parse_args(argv)
    if args.check:
        why = check(args.platform_yaml)
        print(why or f"{args.platform_yaml.name}: tune's output ({TUNED_FROM.strip()} line checked)")
        return 1 if why else 0
    if not args.tuned:
        ap.error("the tuned YAML is required unless --check")
    named = []
    for path in args.tuned:
        tuned = Path(path).resolve()
        try:
            rel = str(tuned.relative_to(REPO))
        except ValueError:
            ap.error(f"{tuned} is outside the repository: commit it (benchmarks/results/...) "
                     "first, so that the platform YAML can name it")
        if " " in rel:
            ap.error(f"{rel}: a path with a space cannot be named on the '{TUNED_FROM.strip()}' line")
        named.append((rel, tuned.read_text(encoding="utf-8")))
    rel = " ".join(n for n, _ in named)
    try:
        text = apply(merge(named), args.platform_yaml.read_text(encoding="utf-8"), rel)
    except ValueError as exc:
        ap.error(str(exc))
    validate(text)
    args.platform_yaml.write_text(text, encoding="utf-8")
    print(f"{args.platform_yaml}: op_backends and token_buckets from {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
