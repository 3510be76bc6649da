"""The router probe (sglang_fl/models/router_probe.py) on a real tiny Qwen3.5-MoE checkpoint
in HF transformers: it finds the (router, position) near-ties that bf16 rounding can flip, a
swap changes HF's own forward the way a served router flip would, and a served token that such
a swap gives is explained while one that no swap reaches is not."""

from __future__ import annotations

import math

import pytest

from sglang_fl.models import router_probe as rp
from sglang_fl.models.hf_reference import load_hf_model

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.e2e

PROMPT = list(range(5, 21))  # 16 tokens: a near-tie near the top moves HF's pick


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from sglang_fl.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("moe") / "qwen3.5-moe", preset="qwen3.5-moe")


@pytest.fixture(scope="module")
def fp32(moe):
    return load_hf_model(moe, "float32")


def test_every_router_is_found_and_its_logits_are_the_ones_it_routes_by(fp32):
    found = rp.routers(fp32)
    assert len(found) == 4 and {r.top_k for r in found} == {4}
    logits, last = rp.router_logits(fp32, PROMPT, "cpu")
    assert [tuple(t.shape) for t in logits] == [(len(PROMPT), 16)] * 4
    with torch.no_grad():
        want = fp32(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    assert torch.allclose(last, want, atol=1e-5)


def test_a_model_without_a_router_is_refused_by_name(tiny_model):
    with pytest.raises(ValueError, match="has no MoE router"):
        rp.routers(load_hf_model(tiny_model))


def test_a_swap_changes_only_the_forward_from_its_position_on(fp32):
    ties = rp.near_ties(rp.router_logits(fp32, PROMPT, "cpu")[0], 4, [1.0] * 4, sigmas=100.0)
    flip = next(t for t in ties if t["position"] == 10)
    router = rp.routers(fp32)[flip["router"]]
    with torch.no_grad():
        base = fp32(input_ids=torch.tensor([PROMPT])).logits[0]
        handle = router.register_forward_hook(rp._swap([(flip["position"], flip["out"], flip["in"])]))
        try:
            swapped = fp32(input_ids=torch.tensor([PROMPT])).logits[0]
        finally:
            handle.remove()
    # causal: the tokens before it are untouched (to the order of fp32 sums in the experts)
    assert torch.allclose(base[:10], swapped[:10], atol=1e-5)
    assert not torch.allclose(base[10], swapped[10])
    assert torch.allclose(rp.logits_with_flip(fp32, PROMPT, flip, "cpu"), swapped[-1], atol=1e-5)


def _top(row, k=8):
    """What a server whose logits are ``row`` reports: its top-``k`` logprobs."""
    lp = torch.log_softmax(row, dim=-1)
    top = lp.topk(k)
    return [[int(t), float(v)] for t, v in zip(top.indices, top.values, strict=True)]


def test_a_served_step_one_rounding_sized_flip_gives_is_explained_and_others_are_not(moe, fp32):
    """A server that flipped one near-tied expert serves that flip's token and distribution:
    explained by that flip. The same token from a server whose distribution is HF's own (no
    flip behind it), or a token no flip reaches, is not."""
    logits, last = rp.router_logits(fp32, PROMPT, "cpu")
    witness = rp.router_logits(load_hf_model(moe, "bfloat16"), PROMPT, "cpu")[0]
    ties = rp.near_ties(logits, 4, rp.router_noise(logits, witness))
    assert ties and all(t["gap_sigmas"] <= rp.NEAR_TIE_SIGMAS for t in ties)
    base, noise = int(last.argmax()), 0.005
    match = rp.MATCH * math.sqrt(2.0) * noise

    def moves(t):  # HF's pick, and the top logprobs well beyond what rounding explains
        row = rp.logits_with_flip(fp32, PROMPT, t, "cpu")
        token = int(row.argmax())
        return token != base and rp.served_noise(last, token, _top(row)) > 2 * match, row

    moved = ((t, row) for t in ties for ok, row in [moves(t)] if ok)
    flip, row = next(moved, (None, None))
    assert flip is not None, "no near-tie of this seeded model moves HF's pick"
    token, lowest, upto = int(row.argmax()), int(last.argmin()), ties.index(flip) + 1
    got = rp.probe(moe, [(PROMPT, token, 0.0, noise, _top(row)),
                         (PROMPT, token, 0.0, noise, _top(last)),
                         (PROMPT, lowest, 0.5, noise, _top(last))], max_flips=upto)
    explained = got[0]["explained_by"]
    assert got[0]["margin"] > 0 and got[0]["hf_token"] == base
    assert explained is not None and explained["hf_token"] == token
    assert explained["served_noise"] <= got[0]["match"] < got[0]["served_noise"]
    assert got[0]["near_ties"] == len(ties) and got[0]["flips_tried"] == upto
    assert got[0]["ensemble"] is None  # one swap explains it: no sets are drawn
    assert got[1]["explained_by"] is None  # the margin alone is not enough
    assert got[1]["least_margin"] <= 0.0
    assert got[1]["ensemble"] is None  # HF's own distribution: nothing for a flip to explain
    assert got[2]["explained_by"] is None and got[2]["least_margin"] > 0.5


def test_a_served_step_a_set_of_flips_gives_is_explained_by_the_drawn_sets(moe, fp32):
    """A server that flipped several near-ties at once, at rounding's odds, is explained by a
    drawn set where no single swap is tried; a server whose token and distribution no set
    reaches is not, and its row says how close the sets came."""
    logits, last = rp.router_logits(fp32, PROMPT, "cpu")
    witness = rp.router_logits(load_hf_model(moe, "bfloat16"), PROMPT, "cpu")[0]
    ties = rp.near_ties(logits, 4, rp.router_noise(logits, witness))
    base, noise, seed = int(last.argmax()), 0.005, 3
    match = rp.MATCH * math.sqrt(2.0) * noise

    def moves(drawn):  # HF's pick, and the top logprobs well beyond what rounding explains
        row = rp.logits_with_flips(fp32, PROMPT, drawn, "cpu")
        token = int(row.argmax())
        return token != base and rp.served_noise(last, token, _top(row)) > 2 * match, row

    moved = ((i + 1, row) for i, drawn in enumerate(rp.draw_flips(ties, 32, seed))
             if len(drawn) >= 2 for ok, row in [moves(drawn)] if ok)
    upto, row = next(moved, (None, None))
    assert upto is not None, "no drawn set of two or more flips moves HF's pick"
    token = int(row.argmax())
    lowest = int(last.argmin())
    stray = [[lowest, -0.1]] + _top(last)[1:]  # a token HF ranks last, served with confidence
    got = rp.probe(moe, [(PROMPT, token, 0.0, noise, _top(row)),
                         (PROMPT, lowest, 0.5, noise, stray)],
                   max_flips=0, samples=upto, seed=seed)
    assert got[0]["explained_by"] is None and got[0]["flips_tried"] == 0
    ensemble = got[0]["ensemble"]
    assert ensemble["samples"] == upto and ensemble["seed"] == seed
    assert ensemble["expected_flips"] == pytest.approx(
        sum(rp.flip_chance(t["gap_sigmas"]) for t in ties), abs=1e-3)
    explained = ensemble["explained_by"]
    assert explained is not None and explained["sample"] < upto
    assert explained["hf_token"] == token and explained["margin"] == 0.0
    assert explained["served_noise"] <= got[0]["match"] < got[0]["served_noise"]
    assert len(explained["flips"]) >= 1 and ensemble["explaining"] >= 1
    # the set that moved HF to the served distribution moved it as far as the server is from HF
    assert 0.0 < ensemble["shift"]["median"] <= ensemble["shift"]["max"]
    assert ensemble["shift"]["max"] >= got[0]["served_noise"] - got[0]["match"]
    stray_sets = got[1]["ensemble"]
    assert got[1]["explained_by"] is None and stray_sets["explained_by"] is None
    assert stray_sets["within_bound"] == 0 and stray_sets["least_margin"] > 0.5
