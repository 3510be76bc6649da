"""``sglang-fl tune``: per-op, per-token-bucket backend orders measured on this device
(`sglang_fl.tune`), written as a config YAML that ``SGLANG_FL_CONFIG`` loads."""

from __future__ import annotations

import sys
from pathlib import Path

DTYPES = ("bfloat16", "float16", "float32")


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", help="time every op's implementations per token bucket here; write the orders as YAML")
    p.add_argument("--model", action="append",
                   help="Hugging Face model directory (or its config.json) whose shapes to time "
                        "(default: Qwen2.5-0.5B's); repeat it for several models: each op is "
                        "timed on every model that uses it, and ordered by the summed time")
    p.add_argument("--out", type=Path, help="YAML file to write (default: stdout)")
    p.add_argument("--buckets", help="token buckets, e.g. 'decode=64;prefill' (default: the "
                                     "token_buckets setting)")
    p.add_argument("--tokens", help="comma-separated token counts to time, at least one per bucket "
                                    "(default: each bucket's smallest and largest; the "
                                    "unbounded one at 4x and 32x the bound before it, and 8192 if above it, "
                                    "none above the larger of 8192 and 4x the bound)")
    p.add_argument("--graph-buckets",
                   help="comma-separated buckets timed under a CUDA graph, or 'none' (default on "
                        "CUDA: the first bucket of several, which SGLang serves with graph decode; "
                        "elsewhere none)")
    p.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    p.add_argument("--device", help="torch device (default: the accelerator if any, else cpu)")
    p.add_argument("--ops", help="comma-separated subset of ops (default: every op the model uses)")
    p.add_argument("--iters", type=int, default=20, help="calls per timing")
    p.add_argument("--warmup", type=int, default=3, help="calls before timing")
    p.add_argument("--repeats", type=int, default=5, help="timings per (impl, token count); median")
    p.set_defaults(func=cmd_tune)


def default_device() -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    for kind in ("npu", "musa"):
        mod = getattr(torch, kind, None)
        if mod is not None and getattr(mod, "is_available", lambda: False)():
            return kind
    return "cpu"


def parse_args(args):
    """The validated inputs of a tune run; TuneError names the bad argument."""
    import torch

    from sglang_fl.config import SettingsError, get_settings
    from sglang_fl.config.settings import _token_buckets
    from sglang_fl.dispatch.ops import OP_NAMES, did_you_mean
    from sglang_fl.tune import ModelShapes, TuneError, assign_tokens, default_tokens

    for name in ("iters", "warmup", "repeats"):
        value = getattr(args, name)
        if value < (0 if name == "warmup" else 1):
            raise TuneError(f"--{name} {value}: must be at least {0 if name == 'warmup' else 1}")
    if args.buckets:
        try:
            buckets = _token_buckets(args.buckets, "--buckets")
        except SettingsError as exc:
            raise TuneError(str(exc)) from None
    else:
        buckets = get_settings().token_buckets
    if args.tokens:
        try:
            counts = [int(t) for t in args.tokens.split(",") if t.strip()]
        except ValueError:
            raise TuneError(f"--tokens {args.tokens!r}: expected comma-separated positive integers, "
                            "e.g. 1,64,256,2048") from None
        tokens = assign_tokens(buckets, counts)
    else:
        tokens = default_tokens(buckets)
    ops = None
    if args.ops:
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        bad = [f"{o!r}{did_you_mean(o)}" for o in ops if o not in OP_NAMES]
        if bad:
            raise TuneError(f"--ops: unknown op(s) {', '.join(bad)}; accepted: {', '.join(OP_NAMES)}")
    device = args.device or default_device()
    try:
        torch.empty(1, device=device)
    except (RuntimeError, ValueError) as exc:
        raise TuneError(f"--device {device!r}: not usable here ({exc})") from None
    shapes = [ModelShapes.from_model(m) for m in args.model] if args.model else [ModelShapes()]
    return dict(shapes=shapes, buckets=buckets, tokens=tokens, dtype=getattr(torch, args.dtype),
                device=device, ops=ops, iters=args.iters, warmup=args.warmup, repeats=args.repeats,
                graph_buckets=graph_buckets(args.graph_buckets, buckets, device))


def graph_buckets(raw, buckets, device) -> tuple[str, ...]:
    """The buckets timed under a CUDA graph: ``raw`` ('none' or names) checked against the
    buckets and the device; by default, on CUDA, the first of several buckets (decode)."""
    from sglang_fl.tune import TuneError

    names = [name for name, _ in buckets]
    on_cuda = str(device).split(":")[0] == "cuda"
    if raw is None:
        return (names[0],) if on_cuda and len(names) > 1 else ()
    chosen = [b.strip() for b in raw.split(",") if b.strip()]
    if chosen == ["none"]:
        return ()
    bad = [b for b in chosen if b not in names]
    if bad or not chosen:
        raise TuneError(f"--graph-buckets {raw!r}: unknown bucket(s) {', '.join(map(repr, bad)) or '(none given)'}; "
                        f"accepted: 'none' or a comma-separated subset of {', '.join(names)}")
    if not on_cuda:
        raise TuneError(f"--graph-buckets {raw!r}: CUDA graph timing needs a CUDA device, and "
                        f"--device is {device!r}; use --graph-buckets none")
    return tuple(dict.fromkeys(chosen))


def publish_sglang_defaults() -> None:
    """SGLang's own kernels (the vendor backend) read the ServerArgs a server publishes; tune is
    no server, so publish SGLang's defaults, or say why not (those kernels then show as raised)."""
    from sglang_fl.sglang_glue.adapters import (
        UnsupportedSGLangVersion,
        get_adapter,
        installed_sglang_version,
    )

    if installed_sglang_version() is None:
        return
    try:
        get_adapter().ensure_server_args()
    except (UnsupportedSGLangVersion, ImportError, AttributeError) as exc:
        print(f"sglang-fl tune: SGLang's default ServerArgs not published ({exc}); SGLang kernels "
              "that read them will be reported as raised", file=sys.stderr)


def cmd_tune(args) -> int:
    from sglang_fl.config import build_settings
    from sglang_fl.dispatch import get_manager
    from sglang_fl.tune import TuneError, report, to_yaml, tune

    try:
        inputs = parse_args(args)
    except TuneError as exc:
        print(f"sglang-fl tune: {exc}", file=sys.stderr)
        return 2
    publish_sglang_defaults()
    try:
        result = tune(get_manager(), **inputs, progress=lambda line: print(line, file=sys.stderr))
    except TuneError as exc:  # the run could not go on (a CUDA context lost to a failed capture)
        print(f"sglang-fl tune: {exc}", file=sys.stderr)
        return 1
    text = to_yaml(result)
    print(report(result), file=sys.stderr)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    # What we write must load: check it as the user will use it.
    build_settings(env={"SGLANG_FL_CONFIG": str(args.out)}, detect_platform=lambda: "none")
    print(f"wrote {args.out} (load it with SGLANG_FL_CONFIG={args.out})", file=sys.stderr)
    return 0
