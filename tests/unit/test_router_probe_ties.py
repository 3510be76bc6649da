"""The router probe's arithmetic (sglang_fl/models/router_probe.py): which (router, position)
is a near-tie of its k-th and (k+1)-th experts, and how the rounding noise of router logits is
measured."""

from __future__ import annotations

import math

import pytest

from sglang_fl.models import router_probe as rp

torch = pytest.importorskip("torch")


def test_a_near_tie_is_a_top_k_boundary_within_the_bound_closest_first():
    # router 0: position 0's 2nd/3rd experts 0.05 apart, position 1's 1.0 apart; top_k 2
    r0 = torch.tensor([[3.0, 2.0, 1.95, 0.0], [3.0, 2.0, 1.0, 0.0]])
    r1 = torch.tensor([[0.0, 1.0, 1.01, 5.0]])
    ties = rp.near_ties([r0, r1], 2, [0.1, 0.01], sigmas=4.0)
    # bounds: 4 x sqrt(2) x 0.1 = 0.566 and x 0.01 = 0.0566; in deviations 0.35 and 0.71
    assert [(t["router"], t["position"], t["out"], t["in"]) for t in ties] == [(0, 0, 1, 2),
                                                                               (1, 0, 2, 1)]
    assert ties[0]["gap"] == pytest.approx(0.05) and ties[1]["gap"] == pytest.approx(0.01)
    assert ties[1]["gap_sigmas"] == pytest.approx(0.01 / (math.sqrt(2) * 0.01), abs=1e-3)
    assert rp.near_ties([r0, r1], 2, [0.0, 0.0]) == []  # no measured noise: nothing is a tie


def test_router_noise_ignores_a_shift_of_every_expert_alike():
    fp32 = [torch.randn(5, 8, generator=torch.Generator().manual_seed(0))]
    assert rp.router_noise(fp32, [fp32[0] + 3.0]) == [pytest.approx(0.0, abs=1e-6)]
    bumped = fp32[0].clone()
    bumped[:, 0] += 0.5
    assert rp.router_noise(fp32, [bumped])[0] > 0.1


def test_a_witness_that_is_not_a_lower_precision_copy_is_refused_by_name():
    with pytest.raises(ValueError, match="accepted: bfloat16, float16"):
        rp.probe("/nonexistent", [], witness="tf32")


def test_served_noise_is_the_rms_of_served_minus_hf_relative_to_the_served_token():
    row = torch.tensor([0.0, 1.0, 2.0, 3.0])  # HF's logits
    # served logprobs: token 3 chosen; token 2 0.1 further below it than in HF, token 1 as HF
    top = [[3, -0.5], [2, -1.6], [1, -2.5]]
    assert rp.served_noise(row, 3, top) == pytest.approx(math.sqrt((0.1**2 + 0.0) / 2))
    assert rp.served_noise(row, 0, top) is None  # the served token is not among its own top
    assert rp.served_noise(row, 3, [[3, -0.1]]) is None  # nothing to compare it with
    assert rp.served_noise(row, 3, None) is None  # a server that sent no logprobs


def test_a_gap_flips_at_the_odds_rounding_gives_it():
    assert rp.flip_chance(0.0) == pytest.approx(0.5)
    assert rp.flip_chance(1.0) == pytest.approx(0.158655, abs=1e-6)
    assert rp.flip_chance(4.0) < 4e-5
    assert rp.flip_chance(0.5) > rp.flip_chance(1.5) > rp.flip_chance(3.0)


def test_drawn_sets_are_seeded_and_flip_each_tie_at_its_odds():
    ties = [{"router": 0, "position": p, "out": 1, "in": 2, "gap_sigmas": z}
            for p, z in enumerate((0.0, 1.0, 3.0))]
    draws = rp.draw_flips(ties, 4000, seed=1)
    assert draws == rp.draw_flips(ties, 4000, seed=1)
    assert draws != rp.draw_flips(ties, 4000, seed=2)
    for tie in ties:
        seen = sum(tie in d for d in draws) / len(draws)
        # 4000 draws: a binomial's deviation is at most 0.008
        assert seen == pytest.approx(rp.flip_chance(tie["gap_sigmas"]), abs=0.03)
    assert rp.draw_flips([], 3) == [[], [], []]


def test_a_swap_never_routes_one_expert_twice():
    logits, weights = torch.zeros(3, 6), torch.ones(3, 2)
    indices = torch.tensor([[0, 1], [2, 3], [4, 5]])
    hook = rp._swap([(0, 1, 5), (1, 2, 3), (2, 0, 1)])
    _, same_weights, got = hook(None, (), (logits, weights, indices))
    # token 0: 1 -> 5; token 1: 3 is routed already, left; token 2: expert 0 is not routed, left
    assert got.tolist() == [[0, 5], [2, 3], [4, 5]]
    assert indices.tolist() == [[0, 1], [2, 3], [4, 5]]  # the router's own output untouched
    assert same_weights is weights
    with pytest.raises(TypeError, match="should return"):
        hook(None, (), logits)
