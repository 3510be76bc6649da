"""End-to-end GPU benchmark: the same ``python -m sglang.launch_server`` command under several
sglang-fl configurations, measured interleaved.

Every configuration serves the same checkpoint with the same SGLang flags (triton attention,
pytorch sampling, CUDA graph on up to batch 32, piecewise CUDA graph off, SGLang's defaults for
the radix cache and chunked prefill); only environment variables differ. The servers share the
one GPU and are measured in turns: each repeat visits every configuration once, in rotating
order, so drift (clocks, other tenants) spreads over all of them. Per configuration and repeat:

- decode tok/s at batch 1 and batch 32: ``(batch * (N - 1)) / (t(N new tokens) - t(1 new token))``
  on prompts of the same shape (128 tokens, N = 128, ``ignore_eos``), i.e. prefill subtracted;
- prefill tok/s: 8 prompts of 2048 tokens, 1 new token, ``tokens / t``.

Every request has random prompts of its own, so with the radix cache on none reuses a cached
prefix: each request pays its whole prefill, as with the cache off, while the servers (and the
greedy check below) run as users run them.

Memory (benchmarks/e2e_plan.py): before any server starts, each configuration's need (weights
+ KV pool + activations) is checked against the GPU's free memory; a set that cannot fit is
refused with the numbers. Servers start one after another, each with the
``--mem-fraction-static`` that reserves its weights and KV pool out of the memory free at that
moment (``--mem-fraction`` fixes one for all). Configurations that do not fit together run in
groups, one after another: the anchor is in every group (its server stays up), so every ratio
is paired within one group's repeats. ``--repeats`` is per group; ``--max-seconds`` is shared.

Medians over repeats with min/max go to JSON (``--out``) and a markdown table, with each
configuration's paired ratio to the anchor (``--anchor``; ``native-L1off`` when it runs, else the
first configuration; per repeat, so drift cancels): median, 95 % bootstrap confidence interval
and IQR (benchmarks/paired_stats.py). The JSON names, for every number, its group (``groups``
beside ``runs``) and, per server, the exact flags and memory fraction it ran with (``servers``).

A configuration named ``NAME+mtp`` is ``NAME`` served with MTP speculative decoding
(``MTP_ARGS``, SGLang's NEXTN: the checkpoint's own MTP layer drafts); the run then also gives
its paired ratio to ``NAME`` (kept in the same group), the accept length SGLang reports (decode
at batch 1), and whether its greedy ids equal ``NAME``'s token for token; where they part,
``greedy.twin_partings`` judges the parting by HF's reference (`twin_partings`). GPU runs here swing
10-25 % between runs: use 60+ repeats before reading a verdict. The run keeps the
``[OOT-DISPATCH]`` lines each server wrote.

A configuration named ``NAME+pcg`` is ``NAME`` with the prefill CUDA graph on, spelled by the
installed SGLang's adapter (``PREFILL_GRAPH_ON``: 0.5.11's piecewise graph with sglang-fl's ops
as custom ops, 0.5.23's breakable graph): its paired ratio to ``NAME`` and whether its greedy
ids equal ``NAME``'s go to ``paired_prefill_graph`` and ``greedy.prefill_graph_equals_plain``.
``NAME+noradix`` is ``NAME`` with ``--disable-radix-cache`` (``paired_no_radix_cache``): what
the radix cache costs per step on the host. Suffixes combine (``flagos-L1off+pcg+mtp`` pairs
with ``flagos-L1off+pcg``).

``--variant NAME=BASE:op=kind;...`` adds BASE with some ops re-pinned (`per_op_variant`): to
find which op moves a speed or a greedy parting, one op group at a time.

Greedy ids: every server's, for ``--greedy-prompts`` random prompts, are judged against HF
transformers in fp32 on the same weights (sglang_fl/models/hf_reference.py): per configuration
and prompt, equal, or where they first part HF's top-1/top-2 gap, its margin over the served
token, the near-tie bound from the rounding noise measured there, and the verdict (near-tie,
DEFECT, or undecided where more of HF's tokens are within the bound than it keeps, until HF
along the served ids, which keeps the served token's logit, settles it: "(along)"). HF runs
after every server has stopped (a large checkpoint's fp32 copy needs the GPU to itself), once
per prompt: its reference is cached as JSON (``--hf-reference``) and reused by every
configuration and by later runs on the same checkpoint. Past a first parting the served
context is the server's own: HF then runs teacher-forced along each such server's ids
(`past_parting`, cached in the same file), and every later step where the served token is not
HF's pick there is judged by the same rule, so configurations that leave HF alike and part
from each other later are judged too. A DEFECT that a configuration of SGLang's own kernels
(sglang-own, native-L1off) makes on the same ids is marked as its (`attribute_to_sglang`):
SGLang's departure from HF, not sglang-fl's. On an MoE model each DEFECT is also probed for a
router near-tie (`probe_routers`, sglang_fl/models/router_probe.py): one expert flip that bf16
rounding can make, along the served prefix in HF fp32, after which HF gives the served token
within the bound and the server's own top logprobs, explains it; failing one, a set of flips
drawn at rounding's odds that does so. The exit status is 1 when any other verdict is DEFECT
or undecided, or the check could not be made. ``--repeats 0`` serves the greedy check
alone (no speed measured). A server that fails (to start, or later) is reported
at once with its log's last lines, and its whole log is kept as
``<out dir>/server-<config>-failed.log``. SIGTERM (a stage's ``timeout``) stops the servers and
still writes the JSON: the whole repeats and the greedy ids taken so far, ``stopped`` saying
where, HF's verdicts only from the cached reference; the exit status is then 1.

    python benchmarks/e2e_bench.py --model /tmp/qwen05b --out benchmarks/results/h200/e2e.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_plan  # noqa: E402
from paired_stats import summarize_pairs  # noqa: E402
from report import publish  # noqa: E402

from sglang_fl.config import BACKEND_KINDS  # noqa: E402
from sglang_fl.dispatch.ops import GDN_OPS, OP_NAMES, ROUTED_CLASSES  # noqa: E402
from sglang_fl.models import router_probe  # noqa: E402
from sglang_fl.models.config import read_config, text_settings  # noqa: E402
from sglang_fl.models.hf_reference import (  # noqa: E402
    ACCEPTED,
    DEFECT,
    EQUAL,
    NEAR_TIE,
    NEAR_TIE_SIGMAS,
    UNDECIDED,
    along_start,
    cached_hf_along,
    cached_hf_reference,
    first_parting,
    judge,
    judge_along,
    served_dtype,
    served_evidence,
    settle,
    witness_for,
)

ANCHOR = "native-L1off"  # the anchor when it runs (else the first configuration)
METRICS = ("decode_bs1_tok_s", "decode_bs32_tok_s", "prefill_tok_s")

# name -> environment (added to the server's). The plugin is installed in all of them; what
# changes is which backend runs SGLang's fused ops (Layer 2) and whether FlagGems replaces ATen
# ops (Layer 1). Every knob is an env variable, so a configuration does not depend on the YAML.
_ALL_CLASSES = ",".join(ROUTED_CLASSES)
#: The Gated DeltaNet ops SGLang calls as functions (no layer class to leave on SGLang's
#: forward): on a GPU sglang-fl routes them whatever the blacklist says (sglang_glue/gdn.py).
_GDN = tuple(spec.name for spec in GDN_OPS if not spec.serves)


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
    ops = [op for op in OP_NAMES if cls is None or callable(getattr(cls, op, None))]
    return ";".join(f"{op}={kind}" for op in ops)


_TUNED = ("rms_norm=vendor|flagos|reference;rotary_embedding=vendor|flagos|reference;"
          "silu_and_mul=flagos|vendor|reference;gemma_rms_norm=vendor|flagos|reference")
CONFIGS = {
    # SGLang's own forward_cuda (sgl_kernel / jit_kernel): Layer 2 routes no class, and the GDN
    # function ops go to the vendor kind, which on CUDA is SGLang's own Triton kernels. (Until
    # 2026-12-05 they followed cuda.yaml here, FlagGems' delta rule first: on the hybrid shapes
    # "native" ran FlagGems' GDN too.)
    "native-L1off": {"SGLANG_FL_OOT_BLACKLIST": _ALL_CLASSES,
                     "SGLANG_FL_PER_OP": ";".join(f"{op}=vendor" for op in _GDN),
                     "USE_FLAGGEMS": "0"},
    "vendor-L1off": {"SGLANG_FL_PER_OP": _every_op("vendor"), "USE_FLAGGEMS": "0"},
    "flagos-L1off": {"SGLANG_FL_PER_OP": _every_op("flagos"), "USE_FLAGGEMS": "0"},
    "reference-L1off": {"SGLANG_FL_PER_OP": _every_op("reference"), "USE_FLAGGEMS": "0"},
    # Per-op order from benchmarks/op_bench.py (decode sizes under CUDA graph), Layer 1 off.
    "tuned-L1off": {"SGLANG_FL_PER_OP": _TUNED, "USE_FLAGGEMS": "0"},
    # Whatever the platform YAML (sglang_fl/config/cuda.yaml) says when the run is made.
    "fl-defaults": {},
    # SGLang's own forward everywhere: sglang-fl routes nothing (Layer 2 off, and with it the
    # GDN calls that native-L1off still passes through sglang-fl to SGLang's kernels). Only its
    # import stand-ins and platform stay, so that it starts on an install without flashinfer,
    # as the GPU bundle is (`SGLANG_PLUGINS=__none__` would drop those too).
    "sglang-own": {"SGLANG_FL_OOT_ENABLED": "0", "USE_FLAGGEMS": "0"},
}

#: The configurations that compute with SGLang's own kernels, the one sglang-fl routes nothing
#: in first: a departure from HF that one of them makes on the same ids is SGLang's
#: (`attribute_to_sglang`). native-L1off's GDN calls go through sglang-fl's routing to SGLang's
#: kernels, so its own departures are SGLang's only where sglang-own makes them too.
SGLANG_OWN = ("sglang-own", "native-L1off")

#: What a ``NAME+mtp`` configuration adds: NEXTN, 3 draft steps of one token each.
MTP_SUFFIX = "+mtp"
MTP_ARGS = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
#: ``NAME+pcg``: NAME with the prefill CUDA graph on, as the installed SGLang spells it (its
#: adapter's ``PREFILL_GRAPH_ON``: 0.5.11's piecewise graph with sglang-fl's custom ops, 0.5.23's
#: breakable graph).
PCG_SUFFIX = "+pcg"
#: ``NAME+noradix``: NAME without the radix cache, to tell its host-side cost per step apart
#: (0.5.23 serves SGLang's Python TreeCore where its Rust one cannot run: compat ledger
#: fix:rust_tree_core).
NORADIX_SUFFIX = "+noradix"
#: Variant suffixes, combinable (``flagos-L1off+pcg+mtp``); each variant is paired with its
#: plain twin (the name without its last suffix), and its greedy ids compared with the twin's.
SUFFIXES = (MTP_SUFFIX, PCG_SUFFIX, NORADIX_SUFFIX)


def variant(suffix):
    """(env, server args) that the variant ``suffix`` adds."""
    if suffix == MTP_SUFFIX:
        return {}, list(MTP_ARGS)
    if suffix == NORADIX_SUFFIX:
        return {}, ["--disable-radix-cache"]
    from sglang_fl.sglang_glue.adapters import get_adapter

    env, flags = get_adapter().PREFILL_GRAPH_ON
    return dict(env), list(flags)


def resolve_configs(names, extra=(), variants=()):
    """{name: (env, extra server args)} for the chosen names: CONFIGS' entries, their variants
    (``NAME+mtp``, ``NAME+pcg``, ``NAME+noradix``, in any combination), ``--extra-config``
    ones and ``--variant`` ones (`per_op_variant`); an unknown name is refused naming the
    known."""
    extras = dict(parse_config(text) for text in extra)
    for text in variants:
        name, env = per_op_variant(text, {**CONFIGS, **extras})
        extras[name] = env
    known = {**CONFIGS, **extras}
    out = {}
    for name in [*(names or known), *extras]:  # an extra configuration is always run
        base, added = name, []
        while (twin := e2e_plan.twin_of(base, SUFFIXES)) is not None and base not in known:
            added.insert(0, base[len(twin):])
            base = twin
        if base not in known:
            raise SystemExit(f"--configs: unknown configuration {name!r}; known: "
                             f"{', '.join(known)} (each also as NAME" + ", NAME".join(SUFFIXES) + ")")
        env, flags = dict(known[base]), []
        for suffix in added:
            more_env, more_flags = variant(suffix)
            env.update(more_env)
            flags += more_flags
        out.setdefault(name, (env, flags))
    return out


#: The decode CUDA graph's batch cap (the benchmark's largest batch).
GRAPH_MAX_BS = 32


def _version_args() -> list[str]:
    """The prefill (piecewise) CUDA graph off and the decode graph's batch cap, spelled as the
    installed SGLang spells them."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    option, value = adapter.PREFILL_GRAPH_OFF
    flag = "--" + option.replace("_", "-")
    return [*([flag] if value is True else [flag, str(value)]),
            "--" + adapter.DECODE_GRAPH_MAX_BS.replace("_", "-"), str(GRAPH_MAX_BS)]


# No --disable-radix-cache and no --chunked-prefill-size: every server (whose numbers and
# greedy ids are reported alike) runs SGLang's defaults for both; `measure` keeps requests off
# the cache. Each server's --mem-fraction-static is added when it starts (e2e_plan).
SERVER_ARGS = [
    "--attention-backend", "triton", "--sampling-backend", "pytorch",
    "--max-running-requests", "64", "--grammar-backend", "none",
    "--skip-server-warmup", "--sleep-on-idle",
    # Caps the full-attention KV pool; e2e_plan sizes each server's pool for this many tokens.
    "--max-total-tokens", "131072",
]


def refuse_unstartable(configs, model, common_args):
    """Stop before any server starts where the installed SGLang would refuse one: speculative
    decoding on a recurrent-state (GDN/Mamba) model with the radix cache on, under SGLang 0.5.11
    (its ServerArgs raise; the adapter's ``SPECULATIVE_HYBRID_NEEDS_NO_RADIX``). The fix is
    named: the same configuration without the radix cache, paired with its plain twin without
    it too, so the pair still differs in speculation only."""
    from sglang_fl.sglang_glue.adapters import get_adapter
    from sglang_fl.sglang_glue.server_defaults import model_is_hybrid

    adapter = get_adapter()
    if not adapter.SPECULATIVE_HYBRID_NEEDS_NO_RADIX:
        return
    bad = [name for name, (_, flags) in configs.items()
           if "--speculative-algorithm" in (args := {*common_args, *flags})
           and "--disable-radix-cache" not in args]
    if bad and model_is_hybrid(model):
        fixes = ", ".join(f"{n.replace(MTP_SUFFIX, '')}{NORADIX_SUFFIX}{MTP_SUFFIX}" for n in bad)
        raise SystemExit(
            f"--configs: {', '.join(bad)} cannot start: SGLang {adapter.version} refuses speculative "
            f"decoding on a model with recurrent-state layers ({model}) while the radix cache is "
            f"on (--mamba-scheduler-strategy no_buffer). Ask for {fixes} instead, each paired "
            f"with its twin without {MTP_SUFFIX}, which also runs without the radix cache.")


def flag_value(args, flag, default):
    """The integer after ``flag`` in ``args`` (SGLang's ``--flag value`` form), else ``default``."""
    args = list(args)
    for i, arg in enumerate(args[:-1]):
        if arg == flag:
            return int(args[i + 1])
    return default


def pick_anchor(requested, names):
    """The configuration every ratio divides by: ``--anchor`` (which must be run), else
    `ANCHOR` when it runs, else the first configuration."""
    if requested is not None:
        if requested not in names:
            raise SystemExit(f"--anchor {requested!r} is not among the configurations run: "
                             f"{', '.join(names)}")
        return requested
    return ANCHOR if ANCHOR in names else names[0]


def parse_config(text):
    """``name=ENV=VAL,ENV=VAL`` (an extra configuration from the command line)."""
    name, _, rest = text.partition("=")
    env = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, env


def per_op_variant(text, known):
    """``NAME=BASE:op=kind|kind;op@bucket=kind`` -> (NAME, env): configuration BASE with those
    ops' orders replaced (or added) in its ``SGLANG_FL_PER_OP`` (for a BASE without one, such
    as fl-defaults, in the orders its YAML gives, `yaml_orders`), the rest of its environment
    kept. For bisecting which op moves a result: e.g. ``fo-gdn-vendor=flagos-L1off:
    chunk_gated_delta_rule=vendor``. Refused, naming the accepted values, for an unknown BASE,
    op or kind."""
    name, _, rest = text.partition("=")
    base, colon, spec = rest.partition(":")
    if not name or not colon or not spec.strip():
        raise SystemExit(f"--variant {text!r}: expected NAME=BASE:op=kind[|kind][;op=kind...]")
    if base not in known:
        raise SystemExit(f"--variant {text!r}: unknown base configuration {base!r}; known: "
                         f"{', '.join(known)}")
    env = dict(known[base])
    if "SGLANG_FL_PER_OP" in env:
        entries = {e.split("=", 1)[0].strip(): e.strip()
                   for e in env["SGLANG_FL_PER_OP"].split(";") if e.strip()}
    else:  # BASE's orders come from YAML, which the variable would replace whole: spell them out
        entries = {key: f"{key}={'|'.join(kinds)}"
                   for key, kinds in yaml_orders({**os.environ, **env}).items()}
    for item in filter(None, (c.strip() for c in spec.split(";"))):
        key, eq, kinds = item.partition("=")
        op = key.split("@", 1)[0].strip()
        bad = [k for k in kinds.split("|") if k.strip() not in BACKEND_KINDS]
        if not eq or op not in OP_NAMES or bad:
            raise SystemExit(f"--variant {text!r}: bad entry {item!r}; ops: {', '.join(OP_NAMES)}; "
                             f"kinds: {', '.join(BACKEND_KINDS)}")
        entries[key.strip()] = item
    env["SGLANG_FL_PER_OP"] = ";".join(entries.values())
    return name, env


def yaml_orders(env):
    """The ``op_backends`` a server started with ``env`` reads (its platform YAML, and
    ``SGLANG_FL_CONFIG``'s over it) on this machine's platform."""
    from sglang_fl.config import build_settings
    from sglang_fl.devices import detect_platform

    return dict(build_settings(env=env, detect_platform=detect_platform).op_backends)


def prompts(n, length, vocab, seed):
    """``n`` random prompts; ``seed`` may be a string, so each request can have its own."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def generate(server, ids, new_tokens, timeout=300.0, top_logprobs=0):
    """Greedy ``new_tokens`` for each prompt of ``ids``: (seconds, SGLang's outputs); with
    ``top_logprobs``, each output's ``meta_info`` holds that many top logprobs per step."""
    payload = {"input_ids": ids if len(ids) > 1 else ids[0],
               "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0,
                                   "ignore_eos": True}}
    if top_logprobs:
        payload.update(return_logprob=True, top_logprobs_num=top_logprobs)
    t0 = time.perf_counter()
    out = server.post_json("/generate", payload, timeout=timeout)
    dt = time.perf_counter() - t0
    outs = out if isinstance(out, list) else [out]
    got = [len(o.get("output_ids", [])) for o in outs]
    if any(g != new_tokens for g in got):
        raise RuntimeError(f"asked {new_tokens} new tokens, got {got}")
    return dt, outs


def measure(server, vocab, seed, new_tokens):
    """One repeat on one server. Every request has prompts of its own (seeded by ``seed``, the
    batch and the call), so with SGLang's radix cache on none reuses a cached prefix and each
    pays its whole prefill; the configurations of one repeat get the same prompts."""
    res = {}
    for batch in (1, 32):
        t_one = statistics.median(
            generate(server, prompts(batch, 128, vocab, f"{seed}/bs{batch}/one{i}"), 1)[0]
            for i in range(3))
        t_all, outs = generate(server, prompts(batch, 128, vocab, f"{seed}/bs{batch}/all"),
                               new_tokens)
        res[f"decode_bs{batch}_tok_s"] = batch * (new_tokens - 1) / max(t_all - t_one, 1e-9)
        accept = (outs[0].get("meta_info") or {}).get("spec_accept_length")
        if batch == 1 and accept is not None:  # reported by SGLang when speculating
            res["spec_accept_length"] = accept
    t_pref, _ = generate(server, prompts(8, 2048, vocab, f"{seed}/prefill"), 1)
    res["prefill_tok_s"] = 8 * 2048 / t_pref
    return res


#: Top logprobs asked per greedy step: HF's reference keeps its top 8 (`TOP_K`) at least.
GREEDY_TOP_LOGPROBS = 8
#: The logprob request's limit (or 5x the plain greedy request's time, on a slow or loaded
#: host): a server that cannot give logprobs (a speculative one may not) must not hold a device
#: call for minutes.
LOGPROB_TIMEOUT_S = 60.0


class GreedyIds(list):
    """One server's greedy ids per prompt, carrying its top logprobs (``top_logprobs``: per
    prompt, per step ``[[token, logprob], ...]`` or None; None for all where the server gave
    none), so the run's records stay plain id lists."""

    def __init__(self, ids, top_logprobs=None):
        super().__init__(ids)
        self.top_logprobs = top_logprobs


def top_logprobs_of(out):
    """``[[token, logprob], ...]`` per generated step from one /generate output (SGLang's
    ``meta_info.output_top_logprobs``: per step, ``[logprob, token, text]`` entries), or None."""
    rows = (out.get("meta_info") or {}).get("output_top_logprobs")
    if not rows:
        return None
    return [[[int(entry[1]), float(entry[0])] for entry in row or ()] for row in rows]


def served_greedy(server, prompts_, new_tokens):
    """The greedy ids of ``prompts_`` (`GreedyIds`, from a plain request, as every earlier run
    took them), then the same request again with the server's top logprobs: kept per prompt
    where that request gave the same ids (None elsewhere; all None where the server refuses
    logprobs, as a speculative one may, with the reason printed)."""
    took, outs = generate(server, prompts_, new_tokens)
    ids = [o["output_ids"] for o in outs]
    try:
        _, again = generate(server, prompts_, new_tokens, timeout=max(LOGPROB_TIMEOUT_S, 5 * took),
                            top_logprobs=GREEDY_TOP_LOGPROBS)
    except Exception as exc:  # noqa: BLE001 - the ids are the check; the logprobs are evidence
        print(f"# greedy logprobs not given ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
        return GreedyIds(ids)
    tops = [top_logprobs_of(o) if o["output_ids"] == i else None
            for o, i in zip(again, ids, strict=True)]
    return GreedyIds(ids, tops)


def greedy_verdicts(served, reference):
    """{configuration: one `judge` per prompt (with its index), or {"error": why}} for the greedy
    ids each server gave, against HF's reference (`sglang_fl.models.hf_reference`)."""
    out = {}
    for name, ids in served.items():
        if not isinstance(ids, list):
            out[name] = {"error": str(ids)}
            continue
        tops = getattr(ids, "top_logprobs", None) or [None] * len(ids)
        out[name] = [{"prompt": i, **judge(got, ref),
                      **(served_evidence(got, top, ref) if top else {})}
                     for i, (got, ref, top) in enumerate(zip(ids, reference, tops, strict=True))]
    return out


def past_parting(served, verdicts, prompts, along):
    """{configuration: per prompt whose ids left HF's before their last step, the later steps
    where the served token is not HF's pick given the served prefix (`judge_along`)}. Two
    configurations that leave HF alike and then part from each other are judged so; HF's
    reference (on HF's own ids) does not cover those steps. ``along(paths)`` gives HF's
    logits along each ``(prompt, ids)`` (`cached_hf_along`); it is not called when no
    configuration left HF's ids early or undecided. Where a server's ids carry its top
    logprobs (`GreedyIds`), each departure holds `step_evidence` too. A first parting `judge`
    left undecided is judged again on those logits (`settle`): its row in ``verdicts`` is
    replaced."""
    todo = []
    for name, rows in verdicts.items():
        for k, r in enumerate([] if isinstance(rows, dict) else rows):
            got = list(served[name][r["prompt"]])
            start = along_start(r["step"], len(got))
            if start is not None or r["verdict"] == UNDECIDED:
                todo.append((name, k, r["prompt"], got, start))
    entries = along([(prompts[i], got) for _, _, i, got, _ in todo]) if todo else []
    out = {}
    for (name, k, i, got, start), entry in zip(todo, entries, strict=True):
        verdicts[name][k] = settle(verdicts[name][k], entry) or verdicts[name][k]
        if start is not None:
            top = (getattr(served[name], "top_logprobs", None) or [None] * (i + 1))[i]
            out.setdefault(name, []).append({"prompt": i, "from_step": start,
                                             "steps": len(got) - start,
                                             "departures": judge_along(got, entry, start, top)})
    return out


def _base(name: str) -> str:
    """``NAME`` for ``NAME+suffix+...`` (every variant suffix stripped)."""
    while (twin := e2e_plan.twin_of(name, SUFFIXES)) is not None:
        name = twin
    return name


def attribute_to_sglang(greedy) -> list[tuple[str, int, int, str]]:
    """Mark each DEFECT (a first parting in ``greedy["verdicts"]`` or a later departure in
    ``greedy["past_parting"]``) that a configuration of `SGLANG_OWN` makes too, with ``"as"``:
    its name. It makes it too where its served ids for that prompt equal these up to and
    including the step: the same context and the same token, so HF's verdict there is the same.
    A configuration is not its own witness, nor are its variants (``NAME+noradix``), but
    sglang-own, in which sglang-fl routes nothing, is SGLang by definition. Such a departure is
    SGLang's against HF, not sglang-fl's: reported, and not a failure (`exit_status`).
    Returns (configuration, prompt, step, as) for each."""
    served = greedy.get("servers", {})
    own = [n for n in served if _base(n) in SGLANG_OWN and isinstance(served[n], list)]
    own.sort(key=lambda n: SGLANG_OWN.index(_base(n)))
    marked = []

    def mark(name, prompt, row):
        ids = served.get(name)
        if row.get("verdict") != DEFECT or not isinstance(ids, list):
            return
        upto = row["step"] + 1
        by = next((n for n in own if (_base(n) != _base(name) or _base(n) == "sglang-own")
                   and list(served[n][prompt][:upto]) == list(ids[prompt][:upto])), None)
        if by is not None:
            row["as"] = by
            marked.append((name, prompt, row["step"], by))

    for name, rows in greedy.get("verdicts", {}).items():
        for r in [] if isinstance(rows, dict) else rows:
            mark(name, r["prompt"], r)
    for name, rows in greedy.get("past_parting", {}).items():
        for r in rows:
            for d in r["departures"]:
                mark(name, r["prompt"], d)
    return marked


#: DEFECT steps of an MoE model whose router near-ties are probed (`probe_routers`), at most:
#: HF's witness and fp32 copies are loaded once for all, then one fp32 forward per swap or set
#: (`router_probe.MAX_FLIPS` + `router_probe.ENSEMBLE` per step; 35 s for one step's 64 swaps
#: and both loads on an H100). Keep JUDGE_RESERVE (gpu_session.sh) for them.
ROUTER_PROBES = 2


def _defects(greedy):
    """(configuration, prompt, row) of each DEFECT: first partings, then later departures."""
    for name, rows in greedy.get("verdicts", {}).items():
        for r in [] if isinstance(rows, dict) else rows:
            if r.get("verdict") == DEFECT:
                yield name, r["prompt"], r
    for name, rows in greedy.get("past_parting", {}).items():
        for r in rows:
            for d in r["departures"]:
                if d.get("verdict") == DEFECT:
                    yield name, r["prompt"], d


def probe_routers(greedy, prompts, run_probe, limit: int = ROUTER_PROBES) -> int:
    """Give each DEFECT row of an MoE model ``router_probe``: whether one rounding-sized router
    flip in HF fp32 along the served prefix, or a set drawn at rounding's odds, gives the served
    token within the step's bound and the server's own top logprobs there
    (`sglang_fl.models.router_probe`; ``run_probe(cases)``
    runs it). Rows with the same prefix and token share one probe (with the first row's top
    logprobs); past ``limit`` distinct ones a row says it was not probed. Returns how many
    were probed."""
    served, cases, rows = greedy.get("servers", {}), {}, []
    for name, prompt, row in _defects(greedy):
        prefix = list(prompts[prompt]) + list(served[name][prompt][:row["step"]])
        key = (tuple(prefix), row["served_token"])
        tops = getattr(served[name], "top_logprobs", None)
        top = tops[prompt][row["step"]] if tops and row["step"] < len(tops[prompt]) else None
        if key not in cases and len(cases) < limit:
            cases[key] = (prefix, row["served_token"], row["bound"], row["noise"], top)
        rows.append((key, row))
    if not rows:
        return 0
    found = dict(zip(cases, run_probe(list(cases.values())), strict=True)) if cases else {}
    for key, row in rows:
        row["router_probe"] = found.get(key, f"not probed: over the {limit} distinct steps "
                                             "probed in one run")
    return len(cases)


def reprobe(path: Path, model, out: Path | None, limit: int = ROUTER_PROBES,
            run_probe=None) -> dict:
    """An earlier run's JSON at ``path`` with its DEFECTs probed for router near-ties
    (`probe_routers`) on ``model``, written to ``out`` and printed: a step found on one device
    call is explained on the next without serving again. ``run_probe`` defaults to
    `router_probe.probe` on the GPU where there is one."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    greedy = doc.get("greedy") or {}
    if not greedy.get("servers") or "verdicts" not in greedy:
        raise SystemExit(f"{path}: no judged greedy ids (greedy.servers and greedy.verdicts) to "
                         "probe")
    if not text_settings(read_config(model)).get("num_experts"):
        raise SystemExit(f"{model}: not an MoE checkpoint (no num_experts in its config); the "
                         "router probe is for MoE models")
    tops = greedy.get("served_top_logprobs") or {}
    greedy["servers"] = {n: GreedyIds(ids, tops.get(n)) if isinstance(ids, list) else ids
                         for n, ids in greedy["servers"].items()}
    if run_probe is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        witness = (greedy.get("hf_reference") or {}).get("witness") or "bfloat16"

        def run_probe(cases):
            return router_probe.probe(model, cases, device=device, witness=witness)
    greedy["router_probes"] = probe_routers(greedy, greedy["prompts"], run_probe, limit)
    doc["reprobed_from"] = str(path)
    return publish(doc, out, table)


def _router_explanation(row) -> tuple[str, dict] | None:
    """``("flip", swap)`` or ``("set", drawn set)`` where the row's router probe explains it."""
    probe = row.get("router_probe")
    if not isinstance(probe, dict):
        return None
    if probe.get("explained_by") is not None:
        return "flip", probe["explained_by"]
    drawn = (probe.get("ensemble") or {}).get("explained_by")
    return None if drawn is None else ("set", drawn)


def _router_near_tie(row) -> bool:
    return _router_explanation(row) is not None


def _accepted(row) -> bool:
    """A verdict that does not fail the run: equal, a near-tie, or a DEFECT that SGLang's own
    kernels make too (`attribute_to_sglang`) or that one rounding-sized router flip explains
    (`probe_routers`)."""
    return row["verdict"] in ACCEPTED or (row["verdict"] == DEFECT and
                                          ("as" in row or _router_near_tie(row)))


def exit_status(doc):
    """1 when the greedy check found a defect, could not decide a parting, or could not be made
    for every configuration (no HF reference, a server without greedy ids), else 0: a GPU stage
    sees it in the exit code. A stopped run (SIGTERM) is 1 as well: it did not finish."""
    if doc.get("stopped"):
        return 1
    greedy = doc.get("greedy", {})
    verdicts = greedy.get("verdicts")
    if not verdicts or "hf_error" in greedy:
        return 1
    for rows in verdicts.values():
        if isinstance(rows, dict) or not all(map(_accepted, rows)):
            return 1
    if "past_parting_error" in greedy:
        return 1
    for rows in greedy.get("past_parting", {}).values():
        if not all(_accepted(d) for r in rows for d in r["departures"]):
            return 1
    return 0


def gpu_memory():
    """(free, total) bytes of the CUDA device the servers use, or None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.mem_get_info()


def plan_memory(model, configs, anchor, fraction):
    """(groups, {name: ServerNeed}, JSON record) for the chosen configurations on this GPU; one
    group and no needs without a GPU (a CPU smoke run). Exits with the numbers when the set
    cannot be served (`e2e_plan.plan_groups`)."""
    names = list(configs)
    memory = gpu_memory()
    if memory is None:
        return ([[anchor, *(n for n in names if n != anchor)]], {},
                {"device": None, "note": "no CUDA device: memory not planned, one group"})
    free, total = memory
    try:
        weights, source = e2e_plan.weights_bytes(model)
        cfg = text_settings(read_config(model))
        chunk = flag_value(SERVER_ARGS, "--chunked-prefill-size",
                           e2e_plan.default_chunked_prefill(total))
        needs = {name: e2e_plan.server_need(
            cfg, weights, max_total_tokens=flag_value(SERVER_ARGS, "--max-total-tokens", 131072),
            max_running_requests=flag_value(SERVER_ARGS, "--max-running-requests", 64),
            chunked_prefill=chunk, graph_max_bs=GRAPH_MAX_BS,
            draft_tokens=flag_value(extra, "--speculative-num-draft-tokens", 0))
            for name, (_, extra) in configs.items()}
        groups = e2e_plan.plan_groups(
            names, anchor, needs, free, total, fraction=fraction,
            units=lambda n, a: e2e_plan.twin_units(n, a, SUFFIXES))
    except e2e_plan.MemoryPlanError as exc:
        raise SystemExit(f"e2e_bench: {exc}") from None
    record = {"free_bytes": free, "total_bytes": total, "weights_bytes": weights,
              "weights_from": source, "chunked_prefill_assumed": chunk,
              "mem_fraction": "per server (static need / free memory at its start)"
              if fraction is None else fraction,
              "need_bytes": {n: {"weights": d.weights, "kv_pool": d.kv_pool,
                                 "static": d.static, "activations": d.activations,
                                 "total": d.total} for n, d in needs.items()},
              "groups": groups}
    return groups, needs, record


class Stopped(KeyboardInterrupt):
    """The run was told to stop (SIGTERM: a stage's ``timeout``). A KeyboardInterrupt, so that
    no ``except Exception`` swallows it and every Ctrl-C path of `sglang_fl.serving` (a server
    being spawned, one being stopped) cleans up for it too."""


class _Unbreakable:
    """stdout once SIGTERM came: a write or flush that fails is dropped. A ``timeout`` around
    a whole pipeline signals its readers too (``| tee | tail``), and a print into their closed
    pipe must not end the run before its JSON is written."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        with contextlib.suppress(OSError, ValueError):
            return self._stream.write(text)
        return 0

    def flush(self):
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def stop_on_sigterm():
    """From now on SIGTERM raises `Stopped` once: the servers are stopped and what was
    measured is written. A second SIGTERM ends the process at once (the servers then get
    their parent-death signal)."""
    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stdout = _Unbreakable(sys.stdout)
        raise Stopped(f"{signal.Signals(signum).name} received")
    signal.signal(signal.SIGTERM, stop)


def repeats_end(t0: float, max_seconds: float | None, end_by: float | None) -> float | None:
    """When `run_groups` stops starting repeats: the sooner of ``t0 + max_seconds`` and
    ``end_by`` (absolute), or None where neither is given."""
    ends = [t for t in (None if max_seconds is None else t0 + max_seconds, end_by)
            if t is not None]
    return min(ends) if ends else None


def run_groups(groups, anchor, open_server, measure_one, greedy, on_failure, *, repeats,
               new_tokens, end_time=None, clock=time.time):
    """Measure ``groups`` (each led by ``anchor``) one after another.

    In a group the servers not yet up are started one after another (``open_server(name,
    group)`` gives the context manager that starts and stops one), warmed up, then measured
    in ``repeats`` interleaved repeats in rotating order, then asked for their greedy ids;
    the group's servers stop before the next group starts, except the anchor's, which serves
    every group. Repeat numbers run on across groups, so a configuration pairs with the anchor
    only over the repeats of its own group; ``repeats`` 0 measures nothing (no warm-up
    either), for the greedy ids alone. ``end_time`` (``clock`` seconds) is shared: each
    group gets an equal part of what is left when it begins. A failure is handed to
    ``on_failure(name, stage, exc)`` at once, which returns the message kept; that server is
    not measured again. `Stopped` (SIGTERM) stops every server and returns what was complete:
    the whole repeats and the greedy ids taken so far, with ``stopped`` saying where."""
    runs, rep_group, errors, greedy_ids, records, start_seconds = {}, {}, {}, {}, [], {}
    rep, stopped = 0, None
    try:
        with contextlib.ExitStack() as across:  # the anchor's server, up across groups
            servers = {}
            for g, group in enumerate(groups):
                t_group = clock()
                group_end = (None if end_time is None
                             else t_group + (end_time - t_group) / (len(groups) - g))
                fresh, reps = [], []
                record = {"group": g, "configs": list(group), "started": fresh, "reps": reps,
                          "seconds": None, "t0": t_group}
                records.append(record)
                with contextlib.ExitStack() as within:
                    for name in group:
                        if name in servers or name in errors:
                            continue
                        try:
                            stack = across if name == anchor else within
                            servers[name] = stack.enter_context(open_server(name, g))
                        except Exception as exc:  # noqa: BLE001 - reported; the others are measured
                            errors[name] = on_failure(name, "start", exc)
                            continue
                        start_seconds[name] = round(getattr(servers[name], "start_seconds", 0.0), 1)
                        fresh.append(name)
                    # warm-up: first requests compile/allocate
                    for name in fresh if repeats else ():
                        try:
                            measure_one(servers[name], "warm-up", 8)
                        except Exception as exc:  # noqa: BLE001
                            errors[name] = on_failure(name, "warm-up", exc)
                    up = [n for n in group if n in servers and n not in errors]
                    for local in range(repeats):
                        live = [n for n in up if n not in errors]
                        if not live or (len(group) > 1 and live == [anchor]):
                            break  # nothing left to pair with the anchor in this group
                        if group_end is not None and clock() > group_end:
                            print(f"# group {g + 1}: time budget reached after {local} repeats",
                                  flush=True)
                            break
                        order = live[local % len(live):] + live[:local % len(live)]
                        for name in order:
                            try:
                                runs.setdefault(name, {})[rep] = measure_one(
                                    servers[name], f"rep{rep}", new_tokens)
                            except Exception as exc:  # noqa: BLE001 - no more repeats for it
                                errors[name] = on_failure(name, f"repeat {rep}", exc)
                        rep_group[rep] = g
                        reps.append(rep)
                        rep += 1
                        print(f"# group {g + 1}/{len(groups)}: repeat {local + 1}/{repeats} done "
                              f"({clock() - t_group:.0f}s)", flush=True)
                    for name in up:
                        if name not in greedy_ids:
                            try:
                                greedy_ids[name] = greedy(servers[name])
                            except Exception as exc:  # noqa: BLE001
                                greedy_ids[name] = f"{type(exc).__name__}: {exc}"
                    record["seconds"] = round(clock() - record.pop("t0"), 1)
    except Stopped as exc:
        for by_rep in runs.values():  # the repeat under way when it came is not a whole one
            by_rep.pop(rep, None)
        current = records[-1] if records else None
        stopped = (f"{exc} in group {current['group'] + 1} after {len(current['reps'])} of its "
                   f"repeats" if current else str(exc))
        if current and "t0" in current:
            current["seconds"] = round(clock() - current.pop("t0"), 1)
        print(f"# stopped: {stopped}; the servers are stopped, what was complete is kept",
              flush=True)
    return {"runs": runs, "rep_group": rep_group, "errors": errors, "greedy": greedy_ids,
            "groups": records, "start_seconds": start_seconds, "stopped": stopped}

def summarize(values, reps, groups=None):
    out = {"median": statistics.median(values), "min": min(values), "max": max(values),
           "runs": values, "reps": reps}
    if groups is not None:
        out["groups"] = groups  # the group each run (and repeat) came from
    return out


def collect_results(runs, rep_group):
    """{config: {metric: summary}} from `run_groups`' runs, each run with its group."""
    results = {}
    for name, rs in runs.items():
        if not rs:
            continue
        reps = sorted(rs)
        groups = [rep_group[r] for r in reps]
        results[name] = {k: summarize([rs[r][k] for r in reps], reps, groups) for k in METRICS}
        spec = [r for r in reps if "spec_accept_length" in rs[r]]
        if spec:
            results[name]["spec_accept_length"] = summarize(
                [rs[r]["spec_accept_length"] for r in spec], spec, [rep_group[r] for r in spec])
    return results


def _paired(res, base):
    out = {}
    for key in METRICS:
        a = dict(zip(res[key]["reps"], res[key]["runs"], strict=True))
        b = dict(zip(base[key]["reps"], base[key]["runs"], strict=True))
        common = sorted(set(a) & set(b))
        if len(common) >= 2:
            out[key] = summarize_pairs([a[r] for r in common], [b[r] for r in common])
            group_of = dict(zip(res[key]["reps"], res[key].get("groups") or [], strict=False))
            if group_of:
                out[key]["groups"] = sorted({group_of[r] for r in common})
    return out


def paired_to_anchor(results, anchor=ANCHOR):
    """{config: {metric: paired summary vs anchor}} over the repeats both completed."""
    if anchor not in results:
        return {}
    return {name: _paired(res, results[anchor]) for name, res in results.items() if name != anchor}


def paired_twins(results, suffix):
    """{NAME+suffix: {metric: paired summary vs NAME}} for each such configuration whose plain
    twin ran."""
    return {name: _paired(res, results[name.removesuffix(suffix)])
            for name, res in results.items()
            if name.endswith(suffix) and name.removesuffix(suffix) in results}


def paired_speculation(results):
    """{NAME+mtp: {metric: paired summary vs NAME}}."""
    return paired_twins(results, MTP_SUFFIX)


def twin_exact(greedy, suffix):
    """{NAME+suffix: whether its greedy ids equal NAME's, prompt by prompt} (None: one failed)."""
    out = {}
    for name, ids in greedy.items():
        plain = greedy.get(name.removesuffix(suffix))
        if name.endswith(suffix) and plain is not None:
            out[name] = ([list(a) == list(b) for a, b in zip(ids, plain, strict=True)]
                         if isinstance(ids, list) and isinstance(plain, list) else None)
    return out


def speculation_exact(greedy):
    """{NAME+mtp: whether its greedy ids equal NAME's, prompt by prompt}."""
    return twin_exact(greedy, MTP_SUFFIX)


#: A twin parting's verdict when both ids left HF's: the worse one.
_SEVERITY = {EQUAL: 0, NEAR_TIE: 1, UNDECIDED: 2, DEFECT: 3}


def twin_partings(greedy, verdicts):
    """{NAME+suffix: per prompt, where its greedy ids part from its plain twin NAME's and why}
    (for every suffix of `SUFFIXES` whose twin ran; None where either has no HF verdicts).

    A speculative or graph-captured server computes the same tokens with other kernels (NEXTN
    verifies 4 tokens per forward), so at a near-tie the two may pick differently. Where the
    twins part at step s with HF's ids kept up to s, the one that leaves HF's ids at s is judged
    by HF's reference there: its verdict (near-tie or DEFECT) is the parting's, the worse one
    where both leave. Where both had left HF's ids before s, HF's reference does not hold their
    context: ``undecided``."""
    out = {}
    for name, ids in greedy.items():
        twin = e2e_plan.twin_of(name, SUFFIXES)
        if twin is None or twin not in greedy:
            continue
        mine, theirs = verdicts.get(name), verdicts.get(twin)
        plain = greedy[twin]
        if not all(isinstance(v, list) for v in (ids, plain, mine, theirs)):
            out[name] = None
            continue
        rows = []
        for i, (a, b) in enumerate(zip(ids, plain, strict=True)):
            step = first_parting(a, b)
            if step is None:
                rows.append({"prompt": i, "step": None, "verdict": EQUAL, "by": []})
                continue
            left = {n: v[i] for n, v in ((name, mine), (twin, theirs))
                    if not v[i]["equal"] and v[i]["step"] <= step}
            if not left or any(v["step"] < step for v in left.values()):
                rows.append({"prompt": i, "step": step, "verdict": UNDECIDED, "by": sorted(left)})
                continue
            verdict = max((v["verdict"] for v in left.values()), key=_SEVERITY.__getitem__)
            rows.append({"prompt": i, "step": step, "verdict": verdict, "by": sorted(left)})
        out[name] = rows
    return out


def _twin_summary(rows, same):
    """``equal/prompts prompts`` and the partings by verdict (`twin_partings`)."""
    if rows is None:
        return "-" if same is None else f"{sum(same)}/{len(same)} prompts"
    return _verdict_summary([r["verdict"] for r in rows], " prompts")


def report_failure(name, stage, exc, log, keep_dir):
    """Say at once why ``name`` failed (``stage``: start, warm-up, repeat N), with its server
    log's last lines, and keep the whole log as ``keep_dir/server-<name>-failed.log``.
    Returns (the message the JSON keeps, the kept log's path or None)."""
    from sglang_fl.serving import log_tail

    message = f"{type(exc).__name__}: {exc}"
    print(f"# {name}: {stage} failed: {message.splitlines()[0]}", flush=True)
    kept = None
    if Path(log).exists():
        safe = "".join(c if c.isalnum() or c in "+-._" else "_" for c in name)
        kept = Path(keep_dir) / f"server-{safe}-failed.log"
        shutil.copyfile(log, kept)
        print(f"# {name}: last lines of its server log (whole log: {kept}):\n"
              f"{log_tail(log, 40)}", flush=True)
    return (message if stage == "start" else f"{stage}: {message}")[-3000:], kept


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint directory")
    ap.add_argument("--out", type=Path, help="JSON output; a failed server's whole log is kept "
                    "beside it as server-<config>-failed.log (in --log-dir without --out)")
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp/e2e-logs"))
    ap.add_argument("--configs", help="comma-separated subset of: " + "; ".join(CONFIGS)
                    + f" (each also as NAME{MTP_SUFFIX}: with MTP speculative decoding, "
                    f"NAME{PCG_SUFFIX}: with the prefill CUDA graph on, NAME{NORADIX_SUFFIX}: "
                    "without the radix cache; combinable)")
    ap.add_argument("--extra-config", action="append", default=[],
                    help="NAME=ENV=VAL,ENV=VAL (repeatable)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=BASE:op=kind|kind;op=kind: BASE with those ops re-pinned "
                         "(repeatable; always run, like --extra-config)")
    ap.add_argument("--anchor", default=None, help="configuration the paired ratios divide by, "
                    f"in every group (default: {ANCHOR} when it runs, else the first)")
    ap.add_argument("--repeats", type=int, default=60, help="interleaved repeats per group")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop starting new repeats after this many seconds from launch, split "
                         "evenly over the groups (the JSON still records every completed "
                         "repeat); for a hard time limit")
    ap.add_argument("--end-by", type=float, default=None,
                    help="Unix time by which the repeats must end, whatever --max-seconds says: "
                         "what a device call's deadline leaves after the HF check "
                         "(gpu_session.sh sets it from CALL_END)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--mem-fraction", type=float, default=None,
                    help="SGLang's --mem-fraction-static for every server (default: per server, "
                         "its weights + KV pool over the GPU memory free when it starts)")
    ap.add_argument("--start-timeout", type=float, default=420)
    ap.add_argument("--greedy-tokens", type=int, default=8)
    ap.add_argument("--greedy-prompts", type=int, default=4, help="random prompts of 32 tokens "
                    "whose greedy ids are checked against HF transformers")
    ap.add_argument("--hf-reference", type=Path, default=None,
                    help="JSON cache of HF's fp32 reference (ids, top logits, rounding noise per "
                         "step), keyed by prompt and reused while the checkpoint is unchanged "
                         "(default: hf-reference.json beside --out, else in --log-dir)")
    ap.add_argument("--server-args", help="replace the common SGLang flags (shell syntax), e.g. "
                    "for a CPU smoke run")
    ap.add_argument("--router-probes", type=int, default=ROUTER_PROBES,
                    help="distinct DEFECT steps of an MoE model probed for a router near-tie")
    ap.add_argument("--reprobe", type=Path, default=None,
                    help="serve nothing: probe the DEFECTs of this earlier run's JSON for router "
                         "near-ties on --model (the same checkpoint: a seeded preset made again "
                         "is) and write it again to --out")
    args = ap.parse_args(argv)
    if args.reprobe is not None:
        return reprobe(args.reprobe, args.model, args.out, args.router_probes)

    configs = resolve_configs(args.configs.split(",") if args.configs else None, args.extra_config,
                              args.variant)
    index = {name: i for i, name in enumerate(configs)}
    anchor = pick_anchor(args.anchor, list(configs))
    args.log_dir.mkdir(parents=True, exist_ok=True)
    keep_dir = args.out.parent if args.out else args.log_dir
    keep_dir.mkdir(parents=True, exist_ok=True)
    if args.server_args is not None:
        SERVER_ARGS[:] = shlex.split(args.server_args)
    else:
        SERVER_ARGS[4:4] = _version_args()  # after the attention/sampling backends
    refuse_unstartable(configs, args.model, SERVER_ARGS)
    vocab = model_vocab(args.model)
    groups, needs, memory = plan_memory(args.model, configs, anchor, args.mem_fraction)
    for g, group in enumerate(groups):
        print(f"# group {g + 1}/{len(groups)}: {', '.join(group)}", flush=True)

    from sglang_fl.serving import launched_server

    servers_doc, failed_logs = {}, {}

    def open_server(name, group):
        i = index[name]
        # Logs are appended to by the server processes: drop any left by an earlier run in the
        # same directory, or its dispatch lines would be read as this run's routes.
        for stale in (args.log_dir / f"dispatch-{i}.log", args.log_dir / f"server-{i}.log"):
            stale.unlink(missing_ok=True)
        env, extra = configs[name]
        env = {**env, "SGLANG_FL_DISPATCH_LOG": str(args.log_dir / f"dispatch-{i}.log")}
        flags, info = [*SERVER_ARGS, *extra], {"group": group}
        fraction = args.mem_fraction
        if needs:  # checked again now: other tenants may have taken memory since the plan
            free = gpu_memory()[0]
            taken = e2e_plan.footprint(needs[name], free, fraction)
            if taken is None:
                raise RuntimeError(f"not enough free GPU memory to start it: {free / e2e_plan.GiB:.1f}"
                                   f" GiB free, it needs {needs[name].describe()}"
                                   + (f" within --mem-fraction {fraction}" if fraction else ""))
            fraction = taken[0]
            info["free_bytes_at_start"] = free
        if fraction is not None:
            flags += ["--mem-fraction-static", str(fraction)]
        info.update(mem_fraction_static=fraction, args=flags)
        servers_doc[name] = info
        print(f"# starting {name} (group {group + 1}): --mem-fraction-static {fraction}",
              flush=True)
        return launched_server(args.model, flags, env=env, log_path=args.log_dir / f"server-{i}.log",
                               timeout=args.start_timeout)

    def on_failure(name, stage, exc):
        message, kept = report_failure(name, stage, exc, args.log_dir / f"server-{index[name]}.log",
                                       keep_dir)
        if kept:
            failed_logs[name] = str(kept)
        return message

    greedy_prompts = prompts(args.greedy_prompts, 32, vocab, 7)

    def greedy(server):
        return served_greedy(server, greedy_prompts, args.greedy_tokens)

    t0 = time.time()
    doc = {"benchmark": "e2e_bench", "model": args.model, "server_args": SERVER_ARGS,
           "mem_fraction_static": args.mem_fraction, "anchor": anchor,
           "configs": {n: env for n, (env, _) in configs.items()},
           "config_server_args": {n: a for n, (_, a) in configs.items() if a},
           "memory": memory, "servers": servers_doc, "failed_logs": failed_logs,
           "repeats_asked": args.repeats, "new_tokens": args.new_tokens, "results": {}}
    run = {"errors": {}, "greedy": {}}
    try:
        run = run_groups(
            groups, anchor, open_server, lambda srv, seed, n: measure(srv, vocab, seed, n),
            greedy, on_failure, repeats=args.repeats, new_tokens=args.new_tokens,
            end_time=repeats_end(t0, args.max_seconds, args.end_by))
        doc["groups"] = run["groups"]
        doc["start_seconds"] = run["start_seconds"]
        if run["stopped"]:
            doc["stopped"] = run["stopped"]
        doc["results"] = collect_results(run["runs"], run["rep_group"])
        doc["paired"] = paired_to_anchor(doc["results"], anchor)
        doc["paired_speculation"] = paired_speculation(doc["results"])
        doc["paired_prefill_graph"] = paired_twins(doc["results"], PCG_SUFFIX)
        doc["paired_no_radix_cache"] = paired_twins(doc["results"], NORADIX_SUFFIX)
    finally:
        doc["start_errors"] = run["errors"]
        # Greedy ids against HF transformers on the same weights, from the measured servers.
        doc["greedy"] = {"prompts": greedy_prompts, "servers": run["greedy"],
                         "served_top_logprobs": {n: getattr(v, "top_logprobs", None)
                                                 for n, v in run["greedy"].items()},
                         "served_by": "the measured servers (flags: servers.<config>.args)",
                         "speculative_equals_plain": speculation_exact(run["greedy"]),
                         "prefill_graph_equals_plain": twin_exact(run["greedy"], PCG_SUFFIX)}
        doc["dispatch_log"] = {}
        for name, i in index.items():
            p = args.log_dir / f"dispatch-{i}.log"
            lines = sorted(set(p.read_text().splitlines())) if p.exists() else []
            doc["dispatch_log"][name] = lines
    try:  # every server has stopped: the GPU is free for HF's fp32 copy
        if not doc["greedy"]["servers"]:
            raise RuntimeError("no server answered")
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = served_dtype(SERVER_ARGS, read_config(args.model))
        witness = witness_for(dtype, device)
        cache = args.hf_reference or keep_dir / "hf-reference.json"
        reference = cached_hf_reference(cache, args.model, greedy_prompts, args.greedy_tokens,
                                        device=device, witness=witness,
                                        compute_missing="stopped" not in doc)
        doc["greedy"]["hf_transformers"] = [r["ids"] for r in reference]
        doc["greedy"]["hf_reference"] = {
            "cache": str(cache), "device": device, "served_dtype": dtype, "witness": witness,
            "near_tie_sigmas": NEAR_TIE_SIGMAS,
            "reused_prompts": sum(r["cached"] for r in reference)}
        verdicts = greedy_verdicts(doc["greedy"]["servers"], reference)
        doc["greedy"]["verdicts"] = verdicts
        doc["greedy"]["match"] = {n: None if isinstance(v, dict) else
                                  sum(r["equal"] for r in v) / len(v) for n, v in verdicts.items()}
        try:  # may settle an undecided first parting in `verdicts`, so before twin_partings
            doc["greedy"]["past_parting"] = past_parting(
                doc["greedy"]["servers"], verdicts, greedy_prompts,
                lambda paths: cached_hf_along(cache, args.model, paths, device=device,
                                              witness=witness, compute_missing="stopped" not in doc))
        except Stopped as exc:  # the verdicts above stand; the later steps are not judged
            doc["stopped"] = doc.get("stopped") or f"{exc} while HF's logits past the partings were computed"
            doc["greedy"]["past_parting_error"] = f"not judged: {doc['stopped']}"
        except Exception as exc:  # noqa: BLE001
            doc["greedy"]["past_parting_error"] = f"{type(exc).__name__}: {exc}"
            print(f"# HF's check past the partings failed: {doc['greedy']['past_parting_error']}",
                  flush=True)
        doc["greedy"]["twin_partings"] = twin_partings(doc["greedy"]["servers"], verdicts)
        doc["greedy"]["as_sglang"] = attribute_to_sglang(doc["greedy"])
        if "stopped" not in doc and text_settings(read_config(args.model)).get("num_experts"):
            try:
                doc["greedy"]["router_probes"] = probe_routers(
                    doc["greedy"], greedy_prompts,
                    lambda cases: router_probe.probe(args.model, cases, device=device,
                                                     witness=witness or "bfloat16"),
                    args.router_probes)
            except Stopped as exc:  # the verdicts above stand; the DEFECTs are not probed
                doc["stopped"] = f"{exc} while the router near-ties were probed"
                doc["greedy"]["router_probe_error"] = f"not probed: {doc['stopped']}"
            except Exception as exc:  # noqa: BLE001 - the verdicts stand without it
                doc["greedy"]["router_probe_error"] = f"{type(exc).__name__}: {exc}"
                print(f"# router probe failed: {doc['greedy']['router_probe_error']}", flush=True)
    except Stopped as exc:  # what the servers gave is written all the same
        doc["stopped"] = doc.get("stopped") or f"{exc} while HF's reference was computed"
        doc["greedy"]["hf_error"] = f"not judged: {doc['stopped']}"
    except Exception as exc:  # noqa: BLE001
        doc["greedy"]["hf_error"] = f"{type(exc).__name__}: {exc}"
        print(f"# greedy check against HF failed: {doc['greedy']['hf_error']}", flush=True)
    doc["seconds"] = round(time.time() - t0, 1)
    doc["versions"] = _versions()
    return publish(doc, args.out, table)


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
    lines = [f"stopped before the end: {doc['stopped']} (the whole repeats and the greedy ids "
             "taken before it are kept)", ""] if doc.get("stopped") else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdicts = doc.get("greedy", {}).get("verdicts", {})
    grouped = len(doc.get("groups") or ()) > 1
    for name, r in doc["results"].items():
        groups = sorted(set(r[METRICS[0]].get("groups") or ()))
        cells = [name + (f" (group {', '.join(str(g + 1) for g in groups)})" if grouped else "")]
        for k in METRICS:
            m = r[k]
            cells.append(f"{m['median']:,.0f} ({m['min']:,.0f}-{m['max']:,.0f})")
        cells.append(_ratios(doc.get("paired", {}).get(name, {})))
        cells.append(_greedy_summary(verdicts.get(name)))
        lines.append("| " + " | ".join(cells) + " |")
    for name, err in doc.get("start_errors", {}).items():
        lines.append(f"| {name} | failed: {err.splitlines()[-1][:120] if err else ''} |||||")
    if doc.get("paired_speculation"):
        exact = doc.get("greedy", {}).get("speculative_equals_plain", {})
        partings = doc.get("greedy", {}).get("twin_partings", {})
        lines += ["", "| speculative | vs plain twin: bs1 / bs32 / prefill, median [95% CI] | "
                  "accept length bs1, median (min-max) | greedy ids = plain twin |", "|---|---|---|---|"]
        for name, paired in doc["paired_speculation"].items():
            acc = doc["results"][name].get("spec_accept_length")
            lines.append(f"| {name} | {_ratios(paired)} | "
                         + (f"{acc['median']:.2f} ({acc['min']:.2f}-{acc['max']:.2f})" if acc else "-")
                         + " | " + _twin_summary(partings.get(name), exact.get(name)) + " |")
    served = doc.get("greedy", {}).get("servers", {})
    for key, title, suffix in (("paired_prefill_graph", "prefill CUDA graph", PCG_SUFFIX),
                               ("paired_no_radix_cache", "radix cache off", NORADIX_SUFFIX)):
        if not doc.get(key):
            continue
        exact = twin_exact(served, suffix)
        partings = doc.get("greedy", {}).get("twin_partings", {})
        lines += ["", f"| {title} | vs plain twin: bs1 / bs32 / prefill, median [95% CI] | "
                  "greedy ids = plain twin |", "|---|---|---|"]
        for name, paired in doc[key].items():
            lines.append(f"| {name} | {_ratios(paired)} | "
                         + _twin_summary(partings.get(name), exact.get(name)) + " |")
    return "\n".join(lines + ["", greedy_table(doc)])


def _greedy_summary(rows):
    """``equal/prompts`` and the partings by verdict, for one configuration's row."""
    if rows is None or isinstance(rows, dict):
        return "-"
    return _verdict_summary([r["verdict"] for r in rows])


def _verdict_summary(verdicts, unit=""):
    """``equal/all`` (``unit`` after it) and the others counted by verdict, in first-seen order."""
    parted = [v for v in verdicts if v != EQUAL]
    kinds = ", ".join(f"{parted.count(v)} {v}" for v in dict.fromkeys(parted))
    return f"{len(verdicts) - len(parted)}/{len(verdicts)}{unit}" + (f" ({kinds})" if kinds else "")


def _unexplained(probe) -> str:
    """What a router probe that explains nothing tried: its single swaps, its drawn sets (how
    close they came), and how far the sets move HF's distribution beside the server's distance."""
    text = (f" (no router flip explains it: {probe['flips_tried']} of {probe['near_ties']} "
            "near-ties tried")
    ens = probe.get("ensemble")
    if ens:
        text += (f", nor {ens['samples']} sets drawn at rounding's odds (least margin "
                 f"{ens['least_margin']:.4g}")
        shift = ens.get("shift")
        if shift and probe.get("served_noise") is not None:
            text += (f"; they move HF's distribution by {shift['median']:.3g} (median) to "
                     f"{shift['max']:.3g}, the server sits {probe['served_noise']:.3g} from it")
        text += ")"
    return text + ")"


def _label(row) -> str:
    """A row's verdict, with the SGLang configuration that makes the same DEFECT and the router
    flip that explains it."""
    label = row["verdict"] + (f" (as {row['as']})" if "as" in row else "")
    kind, how = _router_explanation(row) or (None, None)
    probe = row.get("router_probe")
    if kind == "flip":
        label += (f" = router near-tie (router {how['router']}, token {how['position']}: "
                  f"expert {how['out']} -> {how['in']}, {how['gap_sigmas']} sigma; HF's "
                  f"margin then {how['margin']:.4g})")
    elif kind == "set":
        ens = probe["ensemble"]
        label += (f" = router near-ties ({len(how['flips'])} flips drawn at rounding's odds, "
                  f"set {how['sample']} of {ens['samples']}, {ens['explaining']} explaining; "
                  f"HF's margin then {how['margin']:.4g})")
    elif isinstance(probe, dict):
        label += _unexplained(probe)
    return label


def greedy_table(doc):
    """Per configuration and prompt: equal to HF, else where it parts, HF's top-1/top-2 gap and
    margin over the served token there, the near-tie bound and the verdict."""
    greedy = doc.get("greedy", {})
    if "hf_error" in greedy:
        return f"greedy ids vs HF transformers: not checked ({greedy['hf_error'][:300]})"
    ref = greedy.get("hf_reference", {})
    head = (f"greedy ids vs HF transformers fp32 ({ref.get('witness') or 'no'} rounding witness, "
            f"bound {ref.get('near_tie_sigmas')} sigma; served: the server's own logprobs)\n\n"
            "| configuration | prompt | = HF | parts at step | HF / served token | HF gap "
            "top-1/top-2 | HF margin over served | bound | verdict | served margin | served / "
            "witness noise |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]

    def num(x):
        return "-" if x is None else f"{x:.4g}"

    for name, rows in greedy.get("verdicts", {}).items():
        if isinstance(rows, dict):
            lines.append(f"| {name} | - | no ids: {rows['error'].splitlines()[-1][:100] if rows['error'] else ''} ||||||")
            continue
        for r in rows:
            margin = (num(r["margin"]) if r["margin_at_least"] is None
                      else f"> {num(r['margin_at_least'])} (beyond HF's {r['kept']} kept)")
            served = r.get("served_margin")
            tie = (" (tie: lower id)" if served == 0.0 and r["served_token"] < r["hf_token"]
                   else " (tie)" if served == 0.0 else "")
            lines.append(f"| {name} | {r['prompt']} | {'yes' if r['equal'] else 'no'} | "
                         f"{'-' if r['step'] is None else r['step']} | "
                         + ("-" if r["equal"] else f"{r['hf_token']} / {r['served_token']}")
                         + f" | {num(r['gap'])} | {margin} | {num(r['bound'])} | {_label(r)}"
                         + (" (along)" if r.get("settled_along") else "") + " | "
                         f"{num(served)}{tie} | {num(r.get('served_noise'))} / "
                         f"{num(r.get('witness_noise'))} |")
    return "\n".join(lines + _past_parting_table(greedy, num))


def _step_evidence_text(d, num) -> str:
    """`step_evidence` of one departure, where the server's logprobs gave it."""
    if "step_shared" not in d:
        return ""
    return (f" [served noise {num(d['step_noise'])} / {num(d['step_witness_noise'])}, "
            f"{d['step_shared']}/{d['step_top']} of its top in HF's]")


def _past_parting_table(greedy, num):
    """Past each first parting: the steps where a server's token is not HF's pick on the
    server's own context (`past_parting`)."""
    if "past_parting_error" in greedy:
        return ["", f"past the first parting: not judged ({greedy['past_parting_error'][:300]})"]
    rows = greedy.get("past_parting")
    if not rows:
        return []
    lines = ["", "past the first parting: HF fp32 along each server's own ids; every later step "
             "where the served token is not HF's pick there", "",
             "| configuration | prompt | steps judged | not HF's pick: step HF / served token, "
             "HF margin over served (bound): verdict |", "|---|---|---|---|"]
    for name, prompts in rows.items():
        for r in prompts:
            found = "; ".join(
                f"{d['step']} {d['hf_token']} / {d['served_token']}, "
                + (num(d["margin"]) if d["margin_at_least"] is None
                   else f"> {num(d['margin_at_least'])}")
                + f" ({num(d['bound'])}): {_label(d)}" + _step_evidence_text(d, num)
                for d in r["departures"])
            lines.append(f"| {name} | {r['prompt']} | {r['from_step']}-{r['from_step'] + r['steps'] - 1}"
                         f" | {found or 'none: HF picks the served token at each'} |")
    return lines


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    stop_on_sigterm()  # here, not in main(): a caller's own process keeps its handler
    sys.exit(exit_status(main()))
