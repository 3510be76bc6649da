"""Whether a served MoE model's token that HF fp32 puts beyond the near-tie bound comes from a
router near-tie: one token's k-th and (k+1)-th experts closer than bf16 rounding can tell apart.

The near-tie rule (`hf_reference`) measures rounding on the output logits. A router that picks
another expert for one token of the prefix is a discrete change, and its effect can be far
larger than that spread: the whole next-token distribution moves (seen on the Qwen3.6-35B-A3B
shape, with 256 experts, in SGLang's own forward and in sglang-fl's alike; docs/performance.md,
2026-12-06/07). This probe takes HF fp32 along the served prefix and finds every (layer,
position) whose top-k boundary gap is within `NEAR_TIE_SIGMAS` x sqrt(2) x the router logits'
rounding noise there. The noise is measured like the logits' own: the witness (bf16) minus
fp32, centred per token, per layer. For each such near-tie, closest first, it reruns fp32 with
that one expert swapped for its runner-up (the routing weight kept: within the noise they are
equal). A swap explains the step when, after it, HF's margin over the served token is within
the step's bound and the server's own top logprobs sit as close to HF's as rounding leaves them
(`MATCH`), where before it they did not: a rounding-sized router flip gives that token and that
whole distribution.

One swap is the narrow case. A served prefix of some tens of tokens through eight routers of
256 experts holds hundreds of near-ties, many a fraction of a deviation apart, and a bf16 server
flips each at the odds rounding gives it (`flip_chance`): many at once. Where no single swap
explains the step, the probe draws `ENSEMBLE` such sets (seeded, `draw_flips`) and reruns fp32
with each set swapped together; a set that meets the same two conditions explains the step.
The H200's 35B-A3B step of 2026-12-06 is the case: 299 near-ties, and the best single swap
closed only 12 % of the served distribution's distance from HF's (docs/performance.md,
2026-12-07). HF's own model, run on a GPU after the servers stop (`benchmarks/e2e_bench.py`)."""

from __future__ import annotations

import math
import random

from sglang_fl.models.hf_reference import (
    NEAR_TIE_SIGMAS,
    _diffs_to,
    _matmul_precision,
    _rms,
    free_device_memory,
    load_hf_model,
)

#: Near-ties swapped one at a time, closest first: each is one fp32 forward of the prefix (on
#: an H100, two HF loads and 64 forwards of a 39-token prefix of the 35B-A3B shape took 35 s).
MAX_FLIPS = 64
#: Sets of near-ties drawn at rounding's odds and swapped together, where no single swap
#: explains a step: one fp32 forward each.
ENSEMBLE = 64
#: The draws' seed: a rerun draws the same sets.
ENSEMBLE_SEED = 0
#: How close (in two-logit deviations of the witness' noise, RMS) the served top logprobs must
#: come to HF's after a swap: a faithful server's sit about 1 deviation away.
MATCH = 2.0


def routers(model) -> list:
    """The MoE routers of ``model`` in layer order: transformers 5's ``*TopKRouter`` modules,
    which return (router logits, routing weights, expert indices) and carry ``top_k``."""
    found = [m for m in model.modules()
             if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k")]
    if not found:
        raise ValueError(f"{type(model).__name__} has no MoE router (a transformers "
                         "*TopKRouter module): the router probe is for MoE models")
    return found


def _forward(model, seq, device, hooks=()):
    """fp32 logits of the last position of ``seq`` (what predicts the next token)."""
    import torch

    handles = [module.register_forward_hook(hook) for module, hook in hooks]
    try:
        with torch.no_grad(), _matmul_precision(tf32=False):
            x = torch.tensor([list(seq)], device=device)
            return model(input_ids=x).logits[0, -1].float().cpu()
    finally:
        for h in handles:
            h.remove()


def router_logits(model, seq, device, found=None) -> tuple[list, object]:
    """(per router, its logits over ``seq`` as a [tokens, experts] float CPU tensor; the last
    position's output logits). ``found``: `routers` of ``model``, where the caller has them."""
    found, captured = found or routers(model), {}

    def keep(i):
        def hook(_module, _inputs, output):
            captured[i] = output[0].detach().float().cpu()
        return hook

    last = _forward(model, seq, device, [(r, keep(i)) for i, r in enumerate(found)])
    return [captured[i] for i in range(len(found))], last


def router_noise(fp32, witness) -> list[float]:
    """Per router, the spread of (witness - fp32) router logits, centred per token (a shift of
    every expert alike changes no choice)."""
    out = []
    for f, w in zip(fp32, witness, strict=True):
        d = w - f
        out.append(float((d - d.mean(dim=-1, keepdim=True)).std()))
    return out


def near_ties(logits, top_k: int, noise, sigmas: float = NEAR_TIE_SIGMAS) -> list[dict]:
    """Every (router, position) whose k-th and (k+1)-th expert logits are closer than
    ``sigmas`` x sqrt(2) x that router's ``noise``, closest (in deviations) first: the expert
    chosen (``out``), its runner-up (``in``), the gap and the gap in deviations."""
    rows = []
    for layer, (row, sd) in enumerate(zip(logits, noise, strict=True)):
        if sd <= 0:
            continue
        top = row.topk(top_k + 1, dim=-1)
        gaps = (top.values[:, top_k - 1] - top.values[:, top_k]).tolist()
        pair = math.sqrt(2.0) * sd
        bound = sigmas * pair
        for pos, gap in enumerate(gaps):
            if gap <= bound:
                rows.append({"router": layer, "position": pos,
                             "out": int(top.indices[pos, top_k - 1]),
                             "in": int(top.indices[pos, top_k]),
                             "gap": round(gap, 6), "gap_sigmas": round(gap / pair, 3)})
    rows.sort(key=lambda r: r["gap_sigmas"])
    return rows


def flip_chance(gap_sigmas: float) -> float:
    """The chance that rounding reverses a k-th/(k+1)-th gap of ``gap_sigmas`` deviations of the
    two logits' rounding difference: P(N(0, 1) > gap_sigmas)."""
    return 0.5 * math.erfc(gap_sigmas / math.sqrt(2.0))


def draw_flips(ties, samples: int, seed: int = ENSEMBLE_SEED) -> list[list[dict]]:
    """``samples`` sets of `near_ties` rows, each row in a set with its `flip_chance`: what
    rounding might have flipped along one served prefix. Seeded: the same ties draw the same
    sets."""
    rng = random.Random(seed)
    odds = [flip_chance(t["gap_sigmas"]) for t in ties]
    return [[t for t, p in zip(ties, odds, strict=True) if rng.random() < p]
            for _ in range(samples)]


def _swap(swaps):
    """A forward hook on a router: at each ``(position, out, into)`` of ``swaps`` the expert
    ``out`` is replaced by ``into``, with its routing weight. A swap whose ``out`` is not routed
    there, or whose ``into`` already is (an earlier router's swap moved this token's input), is
    left out: it would route one expert twice."""
    def hook(_module, _inputs, output):
        if not (isinstance(output, tuple) and len(output) == 3):
            raise TypeError("a *TopKRouter should return (logits, weights, indices); got "
                            f"{type(output).__name__}")
        logits, weights, indices = output
        indices = indices.clone()
        for position, out, into in swaps:
            row = indices[position]
            if not bool((row == into).any()):
                row[row == out] = into
        return logits, weights, indices
    return hook


def logits_with_flips(model, seq, flips, device, found=None):
    """The last position's fp32 logits with every `near_ties` row of ``flips`` swapped.
    ``found``: `routers` of ``model``, where the caller has them (a walk over every module)."""
    found, by_router = found or routers(model), {}
    for f in flips:
        by_router.setdefault(f["router"], []).append((f["position"], f["out"], f["in"]))
    return _forward(model, seq, device,
                    [(found[r], _swap(swaps)) for r, swaps in by_router.items()])


def logits_with_flip(model, seq, flip: dict, device, found=None):
    """The last position's fp32 logits with one `near_ties` row's expert swapped."""
    return logits_with_flips(model, seq, [flip], device, found)


def served_noise(row, served: int, top) -> float | None:
    """RMS over the server's own top tokens ``top`` (``[[token, logprob], ...]``) of (served -
    HF) difference to ``served``, against HF's full logits ``row``: how far the served
    distribution is from HF's at this step (`hf_reference.step_evidence`'s measure). None where
    ``top`` is missing or holds nothing beside ``served``."""
    top = dict(top or ())
    return _rms(_diffs_to(served, top, {t: float(row[t]) for t in top}) or [])


def _outcome(row, served: int, top) -> dict:
    """HF's pick, its margin over ``served`` and the served distribution's distance
    (`served_noise`) in the logits ``row`` of one swapped forward."""
    spread = served_noise(row, served, top)
    return {"hf_token": int(row.argmax()), "margin": round(float(row.max() - row[served]), 6),
            "served_noise": None if spread is None else round(spread, 6)}


def _explains(outcome, bound: float, match: float) -> bool:
    return (outcome["margin"] <= bound and outcome["served_noise"] is not None
            and outcome["served_noise"] <= match)


def _ensemble(model, prefix, served, top, last, ties, bound, match, device, found, samples,
              seed):
    """`draw_flips`' sets swapped together, one fp32 forward each: how many bring HF's margin
    over ``served`` within ``bound``, how many also bring the served distribution within
    ``match``, and the first set that does (``explained_by``, its flips listed). ``shift``: how
    far each set moves HF's own distribution (``last``, unswapped) on the served top tokens, by
    the same measure (median, max): the size of departure that rounding's router flips make,
    beside the server's own (``served_noise`` of the probe)."""
    draws = draw_flips(ties, samples, seed)
    rows = [logits_with_flips(model, prefix, drawn, device, found) for drawn in draws]
    outcomes = [_outcome(row, served, top) for row in rows]
    hits = [i for i, o in enumerate(outcomes) if _explains(o, bound, match)]
    noises = [o["served_noise"] for o in outcomes if o["served_noise"] is not None]
    own = [[t, float(last[t])] for t, _ in top or ()]
    shifts = sorted(v for v in (served_noise(row, served, own) for row in rows) if v is not None)
    return {
        "shift": None if not shifts else {"median": round(shifts[len(shifts) // 2], 6),
                                          "max": round(shifts[-1], 6)},
        "samples": samples, "seed": seed,
        "expected_flips": round(sum(flip_chance(t["gap_sigmas"]) for t in ties), 3),
        "mean_flips": round(sum(map(len, draws)) / samples, 3),
        "within_bound": sum(o["margin"] <= bound for o in outcomes),
        "explaining": len(hits),
        "least_margin": min((o["margin"] for o in outcomes), default=None),
        "least_served_noise": min(noises, default=None),
        "explained_by": None if not hits else {
            "sample": hits[0], **outcomes[hits[0]],
            "flips": [{k: f[k] for k in ("router", "position", "out", "in", "gap_sigmas")}
                      for f in draws[hits[0]]]},
    }


def probe(model_path, cases, *, device: str = "cpu", witness: str = "bfloat16",
          sigmas: float = NEAR_TIE_SIGMAS, max_flips: int = MAX_FLIPS,
          samples: int = ENSEMBLE, seed: int = ENSEMBLE_SEED) -> list[dict]:
    """Per case ``(prefix, served, bound, noise, top)``: whether a router near-tie in HF fp32
    along ``prefix`` (the prompt and the served ids before the step) explains the server's
    token ``served`` there, where HF's margin over it exceeds ``bound`` (the step's near-tie
    bound; ``noise``, the witness' logit noise there; ``top``, the server's own top logprobs
    there). With some hundreds of near-ties in a prefix, some swap may bring the margin within
    the bound by chance; the served distribution itself is what one swap cannot match by
    chance. So ``explained_by`` is the first swap, closest first, after which HF's margin over
    ``served`` is within ``bound`` *and* the served top logprobs sit within `MATCH` x sqrt(2) x
    ``noise`` of HF's (RMS, `served_noise`), where without it they did not. Where none of the
    first ``max_flips`` does both, ``ensemble`` holds ``samples`` sets drawn at rounding's odds
    and swapped together (`_ensemble`), and its ``explained_by`` the first set that does. Both
    are None where the server's logprobs are missing or already HF's. Each model is loaded
    once for every case: the witness first, then fp32."""
    if witness not in ("bfloat16", "float16"):
        raise ValueError(f"witness={witness!r}: the router probe's witness is a lower-precision "
                         "copy of the weights; accepted: bfloat16, float16")
    model = load_hf_model(model_path, witness, device)
    found = routers(model)
    seen = [router_logits(model, case[0], device, found)[0] for case in cases]
    del model, found  # the routers hold the witness' weights too
    free_device_memory(device)
    model = load_hf_model(model_path, "float32", device)
    out, found = [], None
    try:
        found = routers(model)
        top_k = found[0].top_k
        for (prefix, served, bound, noise, top), witnessed in zip(cases, seen, strict=True):
            exact, last = router_logits(model, prefix, device, found)
            spreads = router_noise(exact, witnessed)
            ties = near_ties(exact, top_k, spreads, sigmas)
            match = MATCH * math.sqrt(2.0) * noise
            before = served_noise(last, served, top)
            # a flip can explain the step only where the served distribution is not HF's already
            apart = before is not None and before > match
            flips = [{**flip, **_outcome(logits_with_flip(model, prefix, flip, device, found),
                                         served, top)} for flip in ties[:max_flips]]
            single = next((f for f in flips if apart and _explains(f, bound, match)), None)
            out.append({
                "served_token": served, "hf_token": int(last.argmax()),
                "margin": round(float(last.max() - last[served]), 6), "bound": bound,
                "served_noise": None if before is None else round(before, 6),
                "match": round(match, 6), "top_k": top_k,
                "router_noise": [round(v, 6) for v in spreads],
                "near_ties": len(ties), "flips_tried": len(flips),
                "explained_by": single,
                "least_margin": min((f["margin"] for f in flips), default=None),
                "best_match": min((f for f in flips if f["served_noise"] is not None),
                                  key=lambda f: f["served_noise"], default=None),
                "ensemble": None if single is not None or not apart or not ties or samples < 1
                else _ensemble(model, prefix, served, top, last, ties, bound, match, device,
                               found, samples, seed)})
    finally:
        del model, found
        free_device_memory(device)
    return out
