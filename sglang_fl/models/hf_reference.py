"""HF transformers in float32 as the ground truth for served greedy ids, and the near-tie rule
that says whether a served sequence parting from it is rounding or a defect.

A server in bf16 (or fp32 with TF32 GEMMs) may pick HF's runner-up wherever HF's own top logits
are closer than its rounding can move them; anywhere else a parting is a defect. How far
rounding moves the logits is measured, not guessed: the same HF model is run once more in the
served precision (the *witness*: bf16 / fp16 weights and activations, or fp32 with TF32 GEMMs)
on HF's own fp32 sequence, and at each step the spread of ``witness logits - fp32 logits`` over
the vocabulary is taken (``noise``, the centred standard deviation: a shift common to every
logit moves no argmax). That is what the depth of this model, its norms, the size of its logits
and its MoE routing (a bf16 router picks another expert near a tie) make of rounding, at this
very step. A router flip is discrete and the served run's flips fall on other tokens than the
witness' own, but a step's logits depend on every routing decision of the prefix, so the spread
over the vocabulary measures their typical effect.

A served token wins over HF's when ``margin`` (HF's logit of its own token minus that of the
served one) is below the two logits' noise, whose deviation is ``sqrt(2) * noise`` for
independent errors; `NEAR_TIE_SIGMAS` of it is the bound:

    near-tie  <=>  margin <= NEAR_TIE_SIGMAS * sqrt(2) * noise

Four deviations: a Gaussian error that large in the served token's favour comes once in ~30 000
draws, while the served kernels' rounding differs from the witness' (another reduction order,
fused kernels that keep fp32 longer or shorter) by a factor of order one, not four. A fp32
server with no TF32 (the CPU) has no witness: its bound is 0, and any parting is a defect.

Each step keeps every HF logit a near-tie can reach: the top `TOP_K` and every token within the
bound of HF's own (at most `MAX_KEPT`; ``complete`` says whether that cap cut any). A served
token beyond a complete set is then behind by more than the bound: a defect, proven. On a model
whose rounding noise is wide (Qwen3.6-35B-A3B's random 256-expert routing in bf16 puts the
served token beyond HF's top 8 with a bound of 2-4 logits) a fixed top 8 could not tell; a
parting beyond a cut set whose least margin is still within the bound is ``undecided``, which
fails a check like a defect but says why.

The reference for a prompt is computed once (HF's greedy ids, the kept logits and the
noise of every step) and can be cached as JSON keyed by prompt (`cached_hf_reference`), so
every configuration is judged against the same numbers and a large model's fp32 copy is
loaded once, after the servers that shared its GPU are gone.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

from sglang_fl.models.config import read_config, text_settings

#: Standard deviations of the measured rounding noise within which a parting is a near-tie.
NEAR_TIE_SIGMAS = 4.0
#: HF logits kept per step at least; more where more are within the near-tie bound.
TOP_K = 8
#: ...and at most: a step with more tokens within the bound is marked incomplete.
MAX_KEPT = 1024
#: Witness precisions: the served dtype's (bf16/fp16 weights and activations), or fp32 with
#: TF32 GEMMs (CUDA only), or None (a fp32 server without TF32: bound 0).
WITNESSES = ("bfloat16", "float16", "tf32")
#: Marks an `hf_along` entry whose every step keeps the served token's logit (`kept_logits`).
ALONG_KEEPS_SERVED = "keeps_served"
#: Verdicts of `judge`.
EQUAL, NEAR_TIE, DEFECT, UNDECIDED = "equal", "near-tie", "DEFECT", "undecided"
#: Verdicts a check accepts: the rest fail it.
ACCEPTED = (EQUAL, NEAR_TIE)


def served_dtype(server_args, config: dict) -> str:
    """The dtype SGLang serves ``config``'s checkpoint in under ``server_args``: ``--dtype``
    when given, else the checkpoint's, float32 taken down to float16 (SGLang's ``auto``)."""
    args = list(server_args)
    asked = args[args.index("--dtype") + 1] if "--dtype" in args[:-1] else "auto"
    if asked != "auto":
        return {"half": "float16", "float": "float32"}.get(asked, asked)
    text = text_settings(config)
    dtype = str(text.get("dtype") or text.get("torch_dtype") or "float32")
    return "float16" if dtype == "float32" else dtype


def witness_for(dtype: str, device: str) -> str | None:
    """The witness of a server computing in ``dtype`` on ``device``: fp32 is TF32 on CUDA
    (Triton's default for fp32 dots, which FlagGems' kernels use), exact on the CPU."""
    if dtype in ("bfloat16", "float16"):
        return dtype
    return "tf32" if str(device).startswith("cuda") else None


def load_hf_model(model_path, dtype: str = "float32", device: str = "cpu"):
    """HF transformers' model of the checkpoint, in ``dtype``, on ``device``, for inference.
    Qwen3.5/3.6 checkpoints are image-text models (prompted with text only)."""
    import torch
    import transformers

    auto = (transformers.AutoModelForImageTextToText if "vision_config" in read_config(model_path)
            else transformers.AutoModelForCausalLM)
    return auto.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device).eval()


@contextlib.contextmanager
def _matmul_precision(tf32: bool):
    """fp32 GEMMs in full fp32 (HF's reference) or in TF32 (the witness), restored after."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def free_device_memory(device: str) -> None:
    """Hand the caching allocator's blocks back to the driver (a no-op on CPU): a server
    started next sizes its pools from the free memory."""
    import gc

    import torch

    gc.collect()
    if str(device).startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _generate(model, prompt, new_tokens, device, logits=False):
    """HF's greedy continuation (no EOS stop) and, with ``logits``, its raw logits per step."""
    import torch

    x = torch.tensor([list(prompt)], device=device)
    out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                         pad_token_id=0, output_logits=logits, return_dict_in_generate=True)
    ids = out.sequences[0, len(prompt):].tolist()
    return (ids, torch.stack(out.logits)[:, 0].float().cpu()) if logits else ids


def _step_logits(model, prompt, ids, device):
    """Teacher-forced logits of every generated step: row j predicts ``ids[j]``."""
    import torch

    seq = torch.tensor([list(prompt) + list(ids[:-1])], device=device)
    return model(input_ids=seq).logits[0, len(prompt) - 1:].float().cpu()


def hf_greedy_ids(model_path, prompts, new_tokens: int, device: str = "cpu") -> list[list[int]]:
    """HF's greedy continuations (float32, full-fp32 GEMMs, no EOS stop)."""
    import torch

    model = load_hf_model(model_path, "float32", device)
    with torch.no_grad(), _matmul_precision(tf32=False):
        ids = [_generate(model, p, new_tokens, device) for p in prompts]
    del model
    free_device_memory(device)
    return ids


def hf_reference(model_path, prompts, new_tokens: int, *, device: str = "cpu",
                 witness: str | None = "bfloat16") -> list[dict]:
    """Per prompt, HF's float32 greedy ids and, per step, the rounding noise the ``witness``
    precision measures there (module docstring; 0.0 without a witness) and the ids and logits a
    near-tie can reach (`kept_logits`). The fp32 model and a bf16/fp16 witness model are on
    ``device`` one after the other, never together."""
    def greedy(model):
        runs = [_generate(model, p, new_tokens, device, logits=True) for p in prompts]
        return [logits for _, logits in runs], [(p, ids) for p, (ids, _) in zip(prompts, runs, strict=True)]

    rows, sequences = _fp32_and_witness(model_path, greedy, device, witness)
    return [{"ids": ids, "steps": steps} for (_, ids), steps in zip(sequences, rows, strict=True)]


def hf_along(model_path, paths, *, device: str = "cpu",
             witness: str | None = "bfloat16") -> list[dict]:
    """Per ``(prompt, ids)`` of ``paths``: HF's fp32 logits teacher-forced along ``ids`` (step j
    given the prompt and ``ids[:j]``) and the witness' noise there, as `hf_reference`'s steps.
    Past a served sequence's first parting from HF's ids its context is its own, which HF's
    reference does not cover: `judge_along` judges those steps by these."""
    def forced(model):
        return [_step_logits(model, p, ids, device) for p, ids in paths], list(paths)

    rows, _ = _fp32_and_witness(model_path, forced, device, witness)
    return [{"steps": steps, ALONG_KEEPS_SERVED: True} for steps in rows]


def _fp32_and_witness(model_path, fp32_rows, device, witness):
    """(per sequence, `_steps` of its fp32 logits and the witness' noise; the sequences):
    ``fp32_rows(model)`` gives the fp32 logits and the (prompt, ids) sequences they are of,
    with full-fp32 GEMMs; the witness then runs teacher-forced on those sequences."""
    import torch

    if witness is not None and witness not in WITNESSES:
        raise ValueError(f"witness={witness!r}; accepted: {', '.join(WITNESSES)} or None")
    if witness == "tf32" and not str(device).startswith("cuda"):
        raise ValueError("the tf32 witness needs a CUDA device")
    seen = None
    model = load_hf_model(model_path, "float32", device)
    with torch.no_grad():
        with _matmul_precision(tf32=False):
            logits, sequences = fp32_rows(model)
        if witness == "tf32":
            with _matmul_precision(tf32=True):
                seen = [_step_logits(model, p, ids, device) for p, ids in sequences]
        del model
        free_device_memory(device)
        if witness in ("bfloat16", "float16"):
            model = load_hf_model(model_path, witness, device)
            seen = [_step_logits(model, p, ids, device) for p, ids in sequences]
            del model
            free_device_memory(device)
    return [_steps(row, seen[i] if seen else None, sequences[i][1])
            for i, row in enumerate(logits)], sequences


def _steps(logits, seen, ids) -> list[dict]:
    """Per step (row): the kept fp32 logits, with the logit of the sequence's own token ``ids[j]``
    (HF's pick along HF's ids; the served token along a server's), and the witness' noise (0.0
    without one)."""
    # Centred: a shift of every logit alike moves no argmax.
    noise = (seen - logits).std(dim=-1).tolist() if seen is not None else [0.0] * len(logits)
    return [{**kept_logits(logits[j], near_tie_bound(noise[j]), also=ids[j]), "noise": noise[j]}
            for j in range(len(logits))]


def kept_logits(row, bound: float, also: int | None = None) -> dict:
    """One step's logits ``row`` cut to what a near-tie can reach: the top `TOP_K` and every
    token within ``bound`` of the top, at most `MAX_KEPT` (``complete`` False when the cap cut
    any), and token ``also`` after them where the cut left it out: a served token's margin is
    then exact even where more than `MAX_KEPT` tokens are within the bound (a 256-expert MoE in
    bf16), instead of ``undecided``. Logits rounded to 1e-6, far below any bound, to keep the
    JSON small."""
    within = int((row >= row.max() - bound).sum())
    top = row.topk(min(max(TOP_K, within), MAX_KEPT, row.shape[-1]))
    ids, logits = top.indices.tolist(), top.values.tolist()
    if also is not None and also not in ids:
        ids.append(int(also))
        logits.append(float(row[also]))
    return {"top_ids": ids, "top_logits": [round(v, 6) for v in logits],
            "complete": within <= MAX_KEPT}


def prompt_key(prompt) -> str:
    return ",".join(str(int(t)) for t in prompt)


def checkpoint_identity(model_path) -> dict:
    """What the cached reference of a checkpoint is valid for: its weight files' names and
    sizes, and a sglang-fl tiny model's manifest (its weights are seeded: the same manifest on
    another machine is the same model, so a reference carried from an earlier GPU session is
    reused), else the files' mtimes; and the torch and transformers that compute it."""
    import importlib.metadata as md

    from sglang_fl.models.tiny import MANIFEST

    path = Path(model_path)
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    manifest = path / MANIFEST
    ident = {"files": [[f.name, f.stat().st_size] for f in files]}
    if manifest.exists():
        ident["tiny_model"] = json.loads(manifest.read_text(encoding="utf-8"))
    else:
        ident["mtimes"] = [f.stat().st_mtime_ns for f in files]
    return {**ident, **{p: md.version(p) for p in ("torch", "transformers")}}


def cached_hf_reference(cache: Path, model_path, prompts, new_tokens: int, *,
                        device: str = "cpu", witness: str | None = "bfloat16",
                        compute_missing: bool = True) -> list[dict]:
    """`hf_reference` of ``prompts`` (aligned with them), through the JSON file ``cache``:
    entries of the same checkpoint (`checkpoint_identity`) and witness with at least
    ``new_tokens`` steps are reused
    (cut to ``new_tokens``); only the other prompts are computed, then the file is rewritten.
    The entries say ``"cached": True`` when they came from the file. Without
    ``compute_missing`` (a run with no time left) a prompt not in the file is a `LookupError`."""
    cache = Path(cache)
    header, doc = _read_cache(cache, model_path, witness)
    entries = doc.get("prompts", {})
    usable = {k: e for k, e in entries.items() if len(e.get("ids", ())) >= new_tokens}
    missing = [p for p in dict.fromkeys(map(tuple, prompts)) if prompt_key(p) not in usable]
    if missing and not compute_missing:
        raise LookupError(f"HF's reference of {len(missing)} of the {len(prompts)} prompts is not "
                          f"in {cache} for this checkpoint and witness, and was not computed")
    if missing:
        fresh = hf_reference(model_path, missing, new_tokens, device=device, witness=witness)
        entries = {**entries, **{prompt_key(p): e for p, e in zip(missing, fresh, strict=True)}}
        _write_cache(cache, {**doc, **header, "prompts": entries})
    new = {prompt_key(p) for p in missing}
    out = []
    for p in prompts:
        e = entries[prompt_key(p)]
        out.append({"ids": e["ids"][:new_tokens], "steps": e["steps"][:new_tokens],
                    "cached": prompt_key(p) not in new})
    return out


def cached_hf_along(cache: Path, model_path, paths, *, device: str = "cpu",
                    witness: str | None = "bfloat16", compute_missing: bool = True) -> list[dict]:
    """`hf_along` of ``paths`` through the same JSON file as `cached_hf_reference` (its
    ``along`` section, keyed by prompt and ids): a path already there for this checkpoint and
    witness is reused. Without ``compute_missing`` a path not in the file is a `LookupError`."""
    cache = Path(cache)
    header, doc = _read_cache(cache, model_path, witness)
    entries = doc.get("along", {})
    keys = [f"{prompt_key(p)}|{prompt_key(ids)}" for p, ids in paths]
    by_key = dict(zip(keys, paths, strict=True))  # equal keys: equal paths
    # Entries written before they kept the served token's logit are computed again.
    new = [k for k in dict.fromkeys(keys) if not entries.get(k, {}).get(ALONG_KEEPS_SERVED)]
    if new and not compute_missing:
        raise LookupError(f"HF's logits along {len(new)} of the {len(paths)} served sequences are "
                          f"not in {cache} for this checkpoint and witness, and were not computed")
    if new:
        fresh = hf_along(model_path, [by_key[k] for k in new], device=device,
                         witness=witness)
        entries = {**entries, **dict(zip(new, fresh, strict=True))}
        _write_cache(cache, {**doc, **header, "along": entries})
    return [entries[k] for k in keys]


def _read_cache(cache: Path, model_path, witness) -> tuple[dict, dict]:
    """(the header this checkpoint and witness need, the cache file's document if it has that
    header, else {})."""
    header = {"checkpoint": checkpoint_identity(model_path), "witness": witness, "top_k": TOP_K,
              "max_kept": MAX_KEPT}
    doc = {}
    if cache.exists():
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(cache.read_text(encoding="utf-8"))
    return header, (doc if {k: doc.get(k) for k in header} == header else {})


def _write_cache(cache: Path, doc: dict) -> None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(doc), encoding="utf-8")


def near_tie_bound(noise: float) -> float:
    """The largest HF margin a served token may win by through rounding (module docstring)."""
    return NEAR_TIE_SIGMAS * math.sqrt(2.0) * noise


def first_parting(got, want) -> int | None:
    """The first step where two id sequences differ, over the steps both have; None if none."""
    return next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)


def judge(got, reference: dict) -> dict:
    """Served greedy ids ``got`` against one prompt's `hf_reference` entry: whether they are
    equal over the steps both have, else the first parting step, HF's top-1/top-2 gap and its
    margin over the served token there (or, for a served token beyond the ``kept`` logits, the
    least it can be: ``margin_at_least``), the bound and the verdict: near-tie within the bound,
    DEFECT beyond it or beyond a complete kept set, else undecided (module docstring)."""
    want = reference["ids"]
    step = first_parting(got, want)
    if step is None:
        return {"equal": True, "step": None, "hf_token": None, "served_token": None, "gap": None,
                "margin": None, "margin_at_least": None, "noise": None, "bound": None,
                "kept": None, "verdict": EQUAL}
    return {"equal": False, "step": step, **_verdict(reference["steps"][step], want[step], got[step])}


def _verdict(at: dict, want: int, got: int) -> dict:
    """One step ``at`` (kept logits and noise) where the served token ``got`` is not HF's
    ``want``: HF's top-1/top-2 gap, its margin over ``got`` (or the least it can be), the bound
    and the verdict (`judge`)."""
    logit = _hf_logits(at)
    best = logit[want]
    others = [v for t, v in logit.items() if t != want]
    bound = near_tie_bound(at["noise"])
    margin = best - logit[got] if got in logit else None
    least = None if margin is not None else best - min(at["top_logits"])
    if margin is not None:
        verdict = NEAR_TIE if margin <= bound else DEFECT
    else:  # a reference cached before `complete` existed kept the top 8 only
        verdict = DEFECT if at.get("complete", False) or least > bound else UNDECIDED
    return {"hf_token": want, "served_token": got, "gap": best - max(others) if others else None,
            "margin": margin, "margin_at_least": least, "noise": at["noise"], "bound": bound,
            "kept": len(logit), "verdict": verdict}


def along_start(step: int | None, length: int) -> int | None:
    """Where `judge_along` starts on a served sequence of ``length`` ids whose first parting
    from HF's ids was at ``step``: the step after it; None without a parting or a later step."""
    return None if step is None or step + 1 >= length else step + 1


def judge_along(got, along: dict, start: int, top=None) -> list[dict]:
    """Each step of ``got`` from ``start`` on where the served token is not HF's argmax given
    the served prefix (`hf_along`), with its `_verdict`: past the first parting from HF's ids
    every later step is judged on the server's own context, so two configurations that leave
    HF alike and then part from each other are judged there too. ``top`` (the server's top
    logprobs per step, as `served_evidence` takes them) adds `step_evidence` to each."""
    out = []
    for j in range(start, min(len(got), len(along["steps"]))):
        at = along["steps"][j]
        if got[j] != at["top_ids"][0]:
            seen = step_evidence(got[j], top[j], at) if top and j < len(top) and top[j] else {}
            out.append({"step": j, **_verdict(at, at["top_ids"][0], got[j]), **seen})
    return out


def step_evidence(got: int, top, at: dict) -> dict:
    """What the server's own top logprobs ``top`` (``[[token, logprob], ...]``) say at one
    step ``at`` of HF's logits on the same context, where it served ``got``: ``step_noise``,
    the RMS over the other tokens both hold of (served - HF) difference to ``got``, against
    ``step_witness_noise``, sqrt(2) x HF's own witness noise there (what the near-tie bound
    assumes); ``step_shared`` of ``step_top`` served tokens are among HF's kept logits. A
    step where the served distribution as a whole moved away from HF's, further than rounding
    moves it, shows a large noise and few shared tokens. Evidence, not a verdict."""
    served, hf = dict(top), _hf_logits(at)
    diffs = _diffs_to(got, served, hf) or []
    return {"step_noise": _rms(diffs), "step_witness_noise": math.sqrt(2.0) * at["noise"],
            "step_shared": sum(t in hf for t in served), "step_top": len(served)}


def _hf_logits(at: dict) -> dict:
    return dict(zip(at["top_ids"], at["top_logits"], strict=True))


def _diffs_to(chosen: int, served: dict, hf: dict) -> list[float] | None:
    """(served - HF) difference of each other token both hold to ``chosen``; None where
    either lacks ``chosen``."""
    if chosen not in served or chosen not in hf:
        return None
    return [(served[t] - served[chosen]) - (hf[t] - hf[chosen])
            for t in served if t != chosen and t in hf]


def _rms(values: list[float]) -> float | None:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else None


def settle(verdict: dict, along: dict) -> dict | None:
    """A first parting that `judge` left undecided (the served token beyond the logits HF's
    reference kept, with more within the bound than it keeps), judged again on the `hf_along`
    entry of the served sequence: up to the parting its context is HF's own, and that entry
    keeps the served token's logit. The row with that verdict and ``settled_along``; None where
    ``verdict`` is not undecided or the entry lacks HF's or the served token there."""
    if verdict.get("verdict") != UNDECIDED:
        return None
    at = along["steps"][verdict["step"]]
    if not {verdict["hf_token"], verdict["served_token"]} <= set(at["top_ids"]):
        return None
    return {**verdict, **_verdict(at, verdict["hf_token"], verdict["served_token"]),
            "settled_along": True}


def served_evidence(got, top, reference: dict) -> dict:
    """What the server's own logprobs say about one prompt's greedy ids ``got`` against its
    `hf_reference` entry. ``top``: per generated step, the server's top logprobs as
    ``[[token, logprob], ...]`` (SGLang computes them in fp32 from the logits it takes its
    argmax over; in bf16 those logits sit on bf16's grid, where two tokens can tie exactly and
    ``torch.argmax`` gives the tie to the lower id).

    - ``served_margin``: at the first parting from HF, the server's logprob of its own token
      minus that of HF's; 0.0 is an exact tie in the served logits. None where there is no
      parting or HF's token is beyond the server's top.
    - ``served_noise``: over the steps before any parting (the served context is HF's there)
      and each token both top sets hold, the RMS of (served - HF) difference to HF's chosen
      token: how far the server's rounding moves a two-logit difference, measured on this
      prompt. ``witness_noise`` is the same quantity the near-tie bound assumes:
      sqrt(2) x the witness' noise, median over those steps. ``noise_pairs`` counts the
      differences behind ``served_noise``.

    Evidence beside the verdict, not a verdict: `judge` alone decides (module docstring)."""
    want, steps = reference["ids"], reference["steps"]
    parting = first_parting(got, want)
    last = min(len(top), len(steps), len(want) if parting is None else parting)
    diffs, noises = [], []
    for j in range(last):
        step = _diffs_to(want[j], dict(top[j]), _hf_logits(steps[j]))
        if step is not None:
            noises.append(steps[j]["noise"])
            diffs += step
    margin = None
    if parting is not None and parting < len(top):
        served = dict(top[parting])
        if got[parting] in served and want[parting] in served:
            margin = served[got[parting]] - served[want[parting]]
    noises.sort()
    return {"served_margin": margin,
            "served_noise": _rms(diffs),
            "witness_noise": math.sqrt(2.0) * noises[len(noises) // 2] if noises else None,
            "noise_pairs": len(diffs)}
