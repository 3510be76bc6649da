"""End-to-end GPU benchmark: the same ``python -m sglang.launch_server`` command under several
sglang-fl configurations, measured interleaved.

Every configuration serves the same checkpoint with the same SGLang flags (triton attention,
pytorch sampling, CUDA graph on up to batch 32, piecewise CUDA graph off, radix cache off so
prefill is really computed); only environment variables differ. All servers are started side
by side on the one GPU (each gets a slice of its memory) and then measured in turns: each repeat visits every
configuration once, in rotating order, so drift (clocks, other tenants) spreads over all of them.
Per configuration and repeat:

- decode tok/s at batch 1 and batch 32: ``(batch * (N - 1)) / (t(N new tokens) - t(1 new token))``
  on the same prompts (128-token prompts, N = 128, ``ignore_eos``), i.e. prefill subtracted;
- prefill tok/s: 8 prompts of 2048 tokens, 1 new token, ``tokens / t``.

Medians over repeats with min/max go to JSON (``--out``) and a markdown table, with each
configuration's paired ratio to ``native-L1off`` (``--anchor``; per repeat, so drift cancels):
median, 95 % bootstrap confidence interval and IQR (benchmarks/paired_stats.py).

A configuration named ``NAME+mtp`` is ``NAME`` served with MTP speculative decoding
(``MTP_ARGS``, SGLang's NEXTN: the checkpoint's own MTP layer drafts); the run then also gives
its paired ratio to ``NAME``, the accept length SGLang reports (decode at batch 1), and whether
its greedy ids equal ``NAME``'s token for token. GPU runs here swing 10-25 %
between runs: use 60+ repeats before reading a verdict. The run also
checks greedy ids of every configuration against HF transformers on the same weights, and keeps
the ``[OOT-DISPATCH]`` lines each server wrote.

    python benchmarks/e2e_bench.py --model /tmp/qwen05b --out benchmarks/results/h200/e2e.json
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from paired_stats import summarize_pairs  # noqa: E402

from sglang_fl.models.config import read_config, text_settings  # noqa: E402

ANCHOR = "native-L1off"
METRICS = ("decode_bs1_tok_s", "decode_bs32_tok_s", "prefill_tok_s")

# name -> environment (added to the server's). The plugin is installed in all of them; what
# changes is which backend runs SGLang's fused ops (Layer 2) and whether FlagGems replaces ATen
# ops (Layer 1). Every knob is an env variable, so a configuration does not depend on the YAML.
_ALL_CLASSES = ("SiluAndMul,RMSNorm,GemmaRMSNorm,RotaryEmbedding,MRotaryEmbedding,TopK,"
                "UnquantizedFusedMoEMethod")
_OPS = ("rms_norm", "gemma_rms_norm", "rotary_embedding", "mrotary_embedding", "silu_and_mul",
        "topk", "fused_moe")



def model_vocab(model_path) -> int:
    """The checkpoint's vocabulary size (multimodal configs keep it under text_config)."""
    cfg = text_settings(read_config(model_path))
    if not isinstance(cfg.get("vocab_size"), int):
        raise SystemExit(f"{model_path}/config.json has no integer vocab_size (top level or "
                         "text_config)")
    return cfg["vocab_size"]

def _every_op(kind):
    """SGLANG_FL_PER_OP pinning every op that ``kind`` implements to it (a per-op list in the
    platform YAML beats PREFER). An op the kind has no method for (FlagGems has no mRoPE) is
    left to the platform YAML: pinning it would stop the server at start-up, as it should for
    a user who asks for an implementation that does not exist."""
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    cls = {"flagos": FlagGemsBackend, "reference": ReferenceBackend}.get(kind)
    ops = [op for op in _OPS if cls is None or callable(getattr(cls, op, None))]
    return ";".join(f"{op}={kind}" for op in ops)


_TUNED = ("rms_norm=vendor|flagos|reference;rotary_embedding=vendor|flagos|reference;"
          "silu_and_mul=flagos|vendor|reference;gemma_rms_norm=vendor|flagos|reference")
CONFIGS = {
    # SGLang's own forward_cuda (sgl_kernel / jit_kernel): Layer 2 routes no class.
    "native-L1off": {"SGLANG_FL_OOT_BLACKLIST": _ALL_CLASSES, "USE_FLAGGEMS": "0"},
    "vendor-L1off": {"SGLANG_FL_PER_OP": _every_op("vendor"), "USE_FLAGGEMS": "0"},
    "flagos-L1off": {"SGLANG_FL_PER_OP": _every_op("flagos"), "USE_FLAGGEMS": "0"},
    "reference-L1off": {"SGLANG_FL_PER_OP": _every_op("reference"), "USE_FLAGGEMS": "0"},
    # Per-op order from benchmarks/op_bench.py (decode sizes under CUDA graph), Layer 1 off.
    "tuned-L1off": {"SGLANG_FL_PER_OP": _TUNED, "USE_FLAGGEMS": "0"},
    # Whatever the platform YAML (sglang_fl/config/cuda.yaml) says when the run is made.
    "fl-defaults": {},
}

#: What a ``NAME+mtp`` configuration adds: NEXTN, 3 draft steps of one token each.
MTP_SUFFIX = "+mtp"
MTP_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def resolve_configs(names, extra=()):
    """{name: (env, extra server args)} for the chosen names: CONFIGS' entries, ``NAME+mtp``
    variants of them and ``--extra-config`` ones; an unknown name is refused naming the known."""
    extras = dict(parse_config(text) for text in extra)
    known = {**CONFIGS, **extras}
    out = {}
    for name in [*(names or known), *extras]:  # an extra configuration is always run
        base = name.removesuffix(MTP_SUFFIX)
        if base not in known:
            raise SystemExit(f"--configs: unknown configuration {name!r}; known: "
                             f"{', '.join(known)} (each also as NAME{MTP_SUFFIX})")
        out.setdefault(name, (known[base], MTP_ARGS if name.endswith(MTP_SUFFIX) else []))
    return out


def _version_args() -> list[str]:
    """The prefill (piecewise) CUDA graph off and the decode graph's batch cap, spelled as the
    installed SGLang spells them."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    option, value = adapter.PREFILL_GRAPH_OFF
    flag = "--" + option.replace("_", "-")
    return [*([flag] if value is True else [flag, str(value)]),
            "--" + adapter.DECODE_GRAPH_MAX_BS.replace("_", "-"), "32"]


SERVER_ARGS = [
    "--attention-backend", "triton", "--sampling-backend", "pytorch",
    "--max-running-requests", "64",
    "--disable-radix-cache", "--grammar-backend", "none", "--chunked-prefill-size", "8192",
    "--skip-server-warmup", "--sleep-on-idle",
    # Several servers share the GPU: SGLang sizes its KV cache from the free memory it sees
    # (rest = free_after_load - free_before_load * (1 - mem_fraction_static)); a fraction well
    # above the real need keeps that positive while the others allocate, and the token cap
    # keeps what each one actually takes small.
    "--max-total-tokens", "131072",
]


def parse_config(text):
    """``name=ENV=VAL,ENV=VAL`` (an extra configuration from the command line)."""
    name, _, rest = text.partition("=")
    env = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, env


def prompts(n, length, vocab, seed):
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def generate(server, ids, new_tokens, timeout=300.0):
    payload = {"input_ids": ids if len(ids) > 1 else ids[0],
               "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0,
                                   "ignore_eos": True}}
    t0 = time.perf_counter()
    out = server.post_json("/generate", payload, timeout=timeout)
    dt = time.perf_counter() - t0
    outs = out if isinstance(out, list) else [out]
    got = [len(o.get("output_ids", [])) for o in outs]
    if any(g != new_tokens for g in got):
        raise RuntimeError(f"asked {new_tokens} new tokens, got {got}")
    return dt, outs


def measure(server, vocab, seed, new_tokens):
    res = {}
    for batch in (1, 32):
        ids = prompts(batch, 128, vocab, seed + batch)
        t_one = statistics.median(generate(server, ids, 1)[0] for _ in range(3))
        t_all, outs = generate(server, ids, new_tokens)
        res[f"decode_bs{batch}_tok_s"] = batch * (new_tokens - 1) / max(t_all - t_one, 1e-9)
        accept = (outs[0].get("meta_info") or {}).get("spec_accept_length")
        if batch == 1 and accept is not None:  # reported by SGLang when speculating
            res["spec_accept_length"] = accept
    ids = prompts(8, 2048, vocab, seed + 99)
    t_pref, _ = generate(server, ids, 1)
    res["prefill_tok_s"] = 8 * 2048 / t_pref
    return res


def hf_greedy(model_path, ids, new_tokens):
    """Greedy continuation by HF transformers on the same weights (checkpoint dtype)."""
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Qwen3.5/3.6 checkpoints are image-text models (weights under model.language_model).
    config = read_config(model_path)
    auto = (transformers.AutoModelForImageTextToText if "vision_config" in config
            else transformers.AutoModelForCausalLM)
    model = auto.from_pretrained(model_path).to(device).eval()
    outs = []
    with torch.no_grad():
        for seq in ids:
            x = torch.tensor([seq], device=device)
            y = model.generate(x, max_new_tokens=new_tokens, do_sample=False,
                               attention_mask=torch.ones_like(x), pad_token_id=0)
            outs.append(y[0, len(seq):].tolist())
    del model
    return outs


def greedy_match(got, expected):
    """Fraction of prompts whose whole greedy continuation equals HF's."""
    return sum(list(a) == list(b) for a, b in zip(got, expected, strict=True)) / len(expected)


def start_all(configs, model, mem_fraction, log_dir, timeout):
    """Start every server concurrently; returns {name: Server}, {name: error}. (Servers started
    together can take each other's ports: `launched_server` starts such a one again.)"""
    from sglang_fl.serving import launched_server

    cms, servers, errors = {}, {}, {}
    for i, (name, (env, extra_args)) in enumerate(configs.items()):
        # Logs are appended to by the server processes: drop any left by an earlier run in the
        # same directory, or its dispatch lines would be read as this run's routes.
        for stale in (log_dir / f"dispatch-{i}.log", log_dir / f"server-{i}.log"):
            stale.unlink(missing_ok=True)
        env = dict(env)
        env["SGLANG_FL_DISPATCH_LOG"] = str(log_dir / f"dispatch-{i}.log")
        cms[name] = launched_server(
            model, [*SERVER_ARGS, *extra_args, "--mem-fraction-static", str(mem_fraction)], env=env,
            log_path=log_dir / f"server-{i}.log", timeout=timeout)
    with cf.ThreadPoolExecutor(len(cms)) as pool:
        futures = {pool.submit(cm.__enter__): name for name, cm in cms.items()}
        for fut in cf.as_completed(futures):
            name = futures[fut]
            try:
                servers[name] = fut.result()
            except Exception as exc:  # noqa: BLE001 - recorded; the others are measured
                errors[name] = f"{type(exc).__name__}: {exc}"[-3000:]
    return cms, servers, errors


def summarize(values, reps):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values, "reps": reps}


def _paired(res, base):
    out = {}
    for key in METRICS:
        a = dict(zip(res[key]["reps"], res[key]["runs"], strict=True))
        b = dict(zip(base[key]["reps"], base[key]["runs"], strict=True))
        common = sorted(set(a) & set(b))
        if len(common) >= 2:
            out[key] = summarize_pairs([a[r] for r in common], [b[r] for r in common])
    return out


def paired_to_anchor(results, anchor=ANCHOR):
    """{config: {metric: paired summary vs anchor}} over the repeats both completed."""
    if anchor not in results:
        return {}
    return {name: _paired(res, results[anchor]) for name, res in results.items() if name != anchor}


def paired_speculation(results):
    """{NAME+mtp: {metric: paired summary vs NAME}} for each speculative configuration whose
    plain twin ran."""
    return {name: _paired(res, results[name.removesuffix(MTP_SUFFIX)])
            for name, res in results.items()
            if name.endswith(MTP_SUFFIX) and name.removesuffix(MTP_SUFFIX) in results}


def speculation_exact(greedy):
    """{NAME+mtp: whether its greedy ids equal NAME's, prompt by prompt} (None: one failed)."""
    out = {}
    for name, ids in greedy.items():
        plain = greedy.get(name.removesuffix(MTP_SUFFIX))
        if name.endswith(MTP_SUFFIX) and plain is not None:
            out[name] = ([list(a) == list(b) for a, b in zip(ids, plain, strict=True)]
                         if isinstance(ids, list) and isinstance(plain, list) else None)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/e2e-logs"))
    ap.add_argument("--configs", help="comma-separated subset of: " + "; ".join(CONFIGS)
                    + f" (each also as NAME{MTP_SUFFIX}: with MTP speculative decoding)")
    ap.add_argument("--extra-config", action="append", default=[],
                    help="NAME=ENV=VAL,ENV=VAL (repeatable)")
    ap.add_argument("--anchor", default=ANCHOR, help="configuration the paired ratios divide by")
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop starting new repeats after this many seconds from launch (the "
                         "JSON still records every completed repeat); for a hard time limit")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--mem-fraction", type=float, default=0.25)
    ap.add_argument("--start-timeout", type=float, default=420)
    ap.add_argument("--greedy-tokens", type=int, default=8)
    ap.add_argument("--server-args", help="replace the common SGLang flags (shell syntax), e.g. "
                    "for a CPU smoke run")
    args = ap.parse_args(argv)

    configs = resolve_configs(args.configs.split(",") if args.configs else None, args.extra_config)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    if args.server_args is not None:
        SERVER_ARGS[:] = shlex.split(args.server_args)
    else:
        SERVER_ARGS[4:4] = _version_args()  # after the attention/sampling backends
    vocab = model_vocab(args.model)

    t0 = time.time()
    cms, servers, errors = start_all(configs, args.model, args.mem_fraction, args.log_dir,
                                     args.start_timeout)
    print(f"# started {len(servers)}/{len(configs)} servers in {time.time() - t0:.0f}s; "
          f"failed: {list(errors)}", flush=True)
    doc = {"benchmark": "e2e_bench", "model": args.model, "server_args": SERVER_ARGS,
           "mem_fraction_static": args.mem_fraction, "anchor": args.anchor,
           "configs": {n: env for n, (env, _) in configs.items()},
           "config_server_args": {n: a for n, (_, a) in configs.items() if a},
           "start_errors": errors,
           "repeats_asked": args.repeats, "new_tokens": args.new_tokens, "results": {}}
    try:
        with contextlib.ExitStack() as stack:
            for name in servers:
                stack.push(cms[name])
            doc["start_seconds"] = {n: round(s.start_seconds, 1) for n, s in servers.items()}
            names = list(servers)
            for name in names:  # warm-up: first requests compile/allocate
                try:
                    measure(servers[name], vocab, 0, 8)
                except Exception as exc:  # noqa: BLE001
                    errors[name] = f"warm-up: {type(exc).__name__}: {exc}"[-3000:]
            names = [n for n in names if n not in errors]
            runs = {n: {} for n in names}  # name -> {repeat: measurement}
            for rep in range(args.repeats if names else 0):
                live = [n for n in names if n not in errors]
                if not live:
                    break
                if args.max_seconds is not None and time.time() - t0 > args.max_seconds:
                    print(f"# time budget reached after {rep} repeats", flush=True)
                    break
                order = live[rep % len(live):] + live[:rep % len(live)]
                for name in order:
                    try:
                        runs[name][rep] = measure(servers[name], vocab, 1000 * rep, args.new_tokens)
                    except Exception as exc:  # noqa: BLE001 - recorded; no more repeats for it
                        errors[name] = f"rep {rep}: {type(exc).__name__}: {exc}"[-3000:]
                print(f"# repeat {rep + 1}/{args.repeats} done ({time.time() - t0:.0f}s)", flush=True)
            for name, rs in runs.items():
                if rs:
                    reps = sorted(rs)
                    doc["results"][name] = {k: summarize([rs[r][k] for r in reps], reps)
                                            for k in METRICS}
                    spec = [r for r in reps if "spec_accept_length" in rs[r]]
                    if spec:
                        doc["results"][name]["spec_accept_length"] = summarize(
                            [rs[r]["spec_accept_length"] for r in spec], spec)
            doc["paired"] = paired_to_anchor(doc["results"], args.anchor)
            doc["paired_speculation"] = paired_speculation(doc["results"])

            # Greedy ids against HF transformers on the same weights.
            ids = prompts(4, 32, vocab, 7)
            greedy = {}
            for name in names:
                try:
                    _, outs = generate(servers[name], ids, args.greedy_tokens)
                    greedy[name] = [o["output_ids"] for o in outs]
                except Exception as exc:  # noqa: BLE001
                    greedy[name] = f"{type(exc).__name__}: {exc}"
            doc["greedy"] = {"prompts": ids, "servers": greedy,
                             "speculative_equals_plain": speculation_exact(greedy)}
    finally:
        doc["start_errors"] = errors
        doc.setdefault("greedy", {})
        doc["dispatch_log"] = {}
        for i, name in enumerate(configs):
            p = args.log_dir / f"dispatch-{i}.log"
            lines = sorted(set(p.read_text().splitlines())) if p.exists() else []
            doc["dispatch_log"][name] = lines
    try:
        if not doc["greedy"].get("prompts"):
            raise RuntimeError("no server answered")
        hf = hf_greedy(args.model, doc["greedy"]["prompts"], args.greedy_tokens)
        doc["greedy"]["hf_transformers"] = hf
        doc["greedy"]["match"] = {n: greedy_match(g, hf) if isinstance(g, list) else None
                                  for n, g in doc["greedy"]["servers"].items()}
    except Exception as exc:  # noqa: BLE001
        doc["greedy"]["hf_error"] = f"{type(exc).__name__}: {exc}"
    doc["seconds"] = round(time.time() - t0, 1)
    doc["versions"] = _versions()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1))
    print(table(doc))
    return doc


def _versions():
    import importlib.metadata as md

    info = {"python": sys.version.split()[0]}
    for pkg in ("torch", "triton", "flag_gems", "sglang", "sglang-kernel", "apache-tvm-ffi",
                "transformers", "sglang_fl"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = None
    try:
        import torch

        info["gpu"] = torch.cuda.get_device_name()
    except Exception:  # noqa: BLE001
        pass
    return info


def _ratios(paired):
    return " / ".join(f"{p['median']:.3f} [{p['ci95'][0]:.3f}-{p['ci95'][1]:.3f}]"
                      if (p := paired.get(k)) else "-" for k in METRICS) if paired else "-"


def table(doc):
    head = ["configuration", "decode bs1 tok/s", "decode bs32 tok/s", "prefill tok/s",
            f"paired vs {doc.get('anchor', ANCHOR)}: bs1 / bs32 / prefill, median [95% CI]",
            "greedy = HF"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    match = doc.get("greedy", {}).get("match", {})
    for name, r in doc["results"].items():
        cells = [name]
        for k in METRICS:
            m = r[k]
            cells.append(f"{m['median']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f})")
        cells.append(_ratios(doc.get("paired", {}).get(name, {})))
        mm = match.get(name)
        cells.append("-" if mm is None else f"{mm:.0%}")
        lines.append("| " + " | ".join(cells) + " |")
    for name, err in doc.get("start_errors", {}).items():
        lines.append(f"| {name} | failed: {err.splitlines()[-1][:120] if err else ''} |||||")
    if doc.get("paired_speculation"):
        exact = doc.get("greedy", {}).get("speculative_equals_plain", {})
        lines += ["", "| speculative | vs plain twin: bs1 / bs32 / prefill, median [95% CI] | "
                  "accept length bs1, median (min-max) | greedy ids = plain twin |", "|---|---|---|---|"]
        for name, paired in doc["paired_speculation"].items():
            acc = doc["results"][name].get("spec_accept_length")
            same = exact.get(name)
            lines.append(f"| {name} | {_ratios(paired)} | "
                         + (f"{acc['median']:.2f} ({acc['min']:.2f}-{acc['max']:.2f})" if acc else "-")
                         + " | " + ("-" if same is None else f"{sum(same)}/{len(same)} prompts") + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
