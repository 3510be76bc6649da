"""The near-tie rule (sglang_fl/models/hf_reference.py) on made-up references: equal ids, a
parting within the measured rounding noise, one beyond it, a served token HF ranks nowhere near
the top; which precision witnesses which server; and the JSON cache that lets every
configuration (and a later run) reuse one HF reference instead of loading the model again."""

from __future__ import annotations

import json
import math

import pytest

from sglang_fl.models import hf_reference as hr


def entry(ids, steps):
    """A reference entry: ``steps`` are (top ids, top logits, noise) per step."""
    return {"ids": ids, "steps": [{"top_ids": t, "top_logits": v, "noise": n} for t, v, n in steps]}


REF = entry([5, 6, 7], [
    ([5, 9, 1], [3.0, 2.0, 1.0], 0.1),
    ([6, 8, 2], [4.0, 3.9, 1.0], 0.1),     # a near-tie: margin 0.1 <= 4 * sqrt(2) * 0.1
    ([7, 3, 4], [5.0, 4.0, 3.5], 0.1),     # 1.0 > 0.566: no tie
])


def test_bound_is_four_deviations_of_the_difference_of_two_noisy_logits():
    assert hr.NEAR_TIE_SIGMAS == 4.0
    assert hr.near_tie_bound(0.1) == pytest.approx(4 * math.sqrt(2) * 0.1)


def test_equal_ids_need_no_tie():
    v = hr.judge([5, 6, 7], REF)
    assert v["equal"] and v["verdict"] == hr.EQUAL and v["step"] is None and v["bound"] is None


def test_the_runner_up_within_the_noise_is_a_near_tie():
    v = hr.judge([5, 8, 0], REF)  # parts at step 1 with HF's runner-up; later steps not judged
    assert (v["equal"], v["step"], v["hf_token"], v["served_token"]) == (False, 1, 6, 8)
    assert v["gap"] == pytest.approx(0.1) and v["margin"] == pytest.approx(0.1)
    assert v["bound"] == pytest.approx(hr.near_tie_bound(0.1)) and v["noise"] == 0.1
    assert v["verdict"] == hr.NEAR_TIE


def test_a_token_behind_by_more_than_the_noise_is_a_defect():
    v = hr.judge([5, 6, 4], REF)  # HF's third choice at step 2: 1.5 behind
    assert v["step"] == 2 and v["gap"] == pytest.approx(1.0) and v["margin"] == pytest.approx(1.5)
    assert v["verdict"] == hr.DEFECT


def test_a_token_beyond_hfs_top_k_is_a_defect_with_the_least_margin_it_can_have():
    v = hr.judge([42], REF)
    assert v["margin"] is None and v["margin_at_least"] == pytest.approx(2.0)
    assert v["verdict"] == hr.DEFECT


def test_each_step_keeps_the_top_k_and_every_token_a_near_tie_can_reach():
    torch = pytest.importorskip("torch")
    row = torch.arange(100, dtype=torch.float32) / 10  # 9.9, 9.8, ... 0.0
    few = hr.kept_logits(row, 0.25)  # 3 within the bound: the top 8 are kept
    assert few["top_ids"] == list(range(99, 91, -1)) and few["complete"]
    assert few["top_logits"][:3] == pytest.approx([9.9, 9.8, 9.7])
    many = hr.kept_logits(row, 2.05)  # 21 within the bound (9.9 down to 7.9)
    assert len(many["top_ids"]) == 21 and many["complete"]
    assert min(many["top_logits"]) == pytest.approx(7.9)


def test_a_step_with_more_within_the_bound_than_the_cap_is_marked_incomplete(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(hr, "MAX_KEPT", 16)
    cut = hr.kept_logits(torch.zeros(100), 0.5)  # all 100 tie
    assert len(cut["top_ids"]) == 16 and not cut["complete"]


def test_a_served_tokens_logit_is_kept_even_beyond_the_cap(monkeypatch):
    # Along a served sequence the token whose margin is judged is known: it is kept after the
    # cut, so a step with more tokens within the bound than the cap still has an exact margin.
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(hr, "MAX_KEPT", 16)
    row = torch.arange(100, dtype=torch.float32) / 10  # 9.9 down to 0.0
    kept = hr.kept_logits(row, 5.0, also=3)
    assert kept["top_ids"][:16] == list(range(99, 83, -1)) and not kept["complete"]
    assert kept["top_ids"][16:] == [3] and kept["top_logits"][16] == pytest.approx(0.3)
    assert hr.kept_logits(row, 5.0, also=98)["top_ids"] == list(range(99, 83, -1))  # already in
    at = {**kept, "noise": 2.0}  # bound 11.3: 9.6 behind is a near-tie, now decided
    v = hr.judge_along([3], {"steps": [at]}, 0)[0]
    assert v["margin"] == pytest.approx(9.6) and v["verdict"] == hr.NEAR_TIE


def beyond(complete, least_logit, noise=0.5):
    """HF's token 1 at step 0, its kept logits ending at ``least_logit``."""
    return {"ids": [1], "steps": [{"top_ids": [1, 2, 3], "top_logits": [5.0, 4.9, least_logit],
                                   "noise": noise, "complete": complete}]}


def test_a_served_token_beyond_a_complete_set_is_a_proven_defect():
    v = hr.judge([42], beyond(True, 4.8))  # least margin 0.2, within the bound 2.83
    assert v["verdict"] == hr.DEFECT and v["margin_at_least"] == pytest.approx(0.2)
    assert v["kept"] == 3


def test_beyond_a_cut_set_within_the_bound_is_undecided_and_fails_the_check():
    v = hr.judge([42], beyond(False, 4.8))
    assert v["verdict"] == hr.UNDECIDED and hr.UNDECIDED not in hr.ACCEPTED
    # ...but a least margin already beyond the bound is a defect, cut or not.
    assert hr.judge([42], beyond(False, 1.0))["verdict"] == hr.DEFECT
    assert hr.ACCEPTED == (hr.EQUAL, hr.NEAR_TIE)


def test_without_a_witness_every_parting_is_a_defect():
    exact = entry([1, 2], [([1, 2], [1.0, 1.0 - 1e-6], 0.0), ([2, 1], [1.0, 0.5], 0.0)])
    assert hr.judge([2], exact)["verdict"] == hr.DEFECT
    assert hr.judge([1, 2], exact)["verdict"] == hr.EQUAL


def test_each_server_precision_has_its_witness():
    bf16 = {"text_config": {"dtype": "bfloat16"}, "vision_config": {}}
    fp32 = {"torch_dtype": "float32"}
    assert hr.served_dtype(["--attention-backend", "triton"], bf16) == "bfloat16"
    assert hr.served_dtype([], fp32) == "float16"  # SGLang's auto takes fp32 down to fp16
    assert hr.served_dtype(["--dtype", "float32"], bf16) == "float32"
    assert hr.served_dtype(["--dtype", "half"], fp32) == "float16"
    assert hr.witness_for("bfloat16", "cuda") == "bfloat16"
    assert hr.witness_for("float32", "cuda") == "tf32"  # FlagGems' fp32 dots are TF32
    assert hr.witness_for("float32", "cpu") is None
    with pytest.raises(ValueError, match="tf32 witness needs a CUDA device"):
        hr.hf_reference("/nonexistent", [[1]], 1, device="cpu", witness="tf32")
    with pytest.raises(ValueError, match="accepted: bfloat16, float16, tf32"):
        hr.hf_reference("/nonexistent", [[1]], 1, witness="int8")


class FakeHF:
    """Stands in for HF transformers (`hf_reference`): records which prompts it was asked for
    and gives each prompt ids of its own."""

    def __init__(self):
        self.calls = []

    def __call__(self, model_path, prompts, new_tokens, *, device, witness):
        self.calls.append(([list(p) for p in prompts], new_tokens, witness))
        return [entry([p[0] + j for j in range(new_tokens)],
                      [([p[0] + j], [1.0], 0.01) for j in range(new_tokens)]) for p in prompts]


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.safetensors").write_bytes(b"w" * 10)
    return tmp_path / "model"


def test_the_cache_computes_each_prompt_once_and_reuses_it(tmp_path, checkpoint, monkeypatch):
    fake = FakeHF()
    monkeypatch.setattr(hr, "hf_reference", fake)
    cache = tmp_path / "out" / "hf-reference.json"
    first = hr.cached_hf_reference(cache, checkpoint, [[10, 1], [20, 2]], 4, witness="bfloat16")
    assert fake.calls == [([[10, 1], [20, 2]], 4, "bfloat16")]
    assert [e["ids"] for e in first] == [[10, 11, 12, 13], [20, 21, 22, 23]]
    assert not any(e["cached"] for e in first)

    # Every configuration (and a later run) is judged against the same numbers, HF not loaded.
    again = hr.cached_hf_reference(cache, checkpoint, [[20, 2], [10, 1]], 3, witness="bfloat16")
    assert len(fake.calls) == 1 and all(e["cached"] for e in again)
    assert [e["ids"] for e in again] == [[20, 21, 22], [10, 11, 12]]  # cut to the steps asked
    assert len(again[0]["steps"]) == 3

    # Only what the file lacks is computed: a new prompt, or longer continuations.
    hr.cached_hf_reference(cache, checkpoint, [[10, 1], [30, 3]], 4, witness="bfloat16")
    assert fake.calls[-1] == ([[30, 3]], 4, "bfloat16")
    hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 6, witness="bfloat16")
    assert fake.calls[-1] == ([[10, 1]], 6, "bfloat16")
    assert len(fake.calls) == 3


def test_a_run_out_of_time_uses_the_cache_only(tmp_path, checkpoint, monkeypatch):
    """A stopped e2e run judges what the file holds and never starts HF for the rest."""
    fake = FakeHF()
    monkeypatch.setattr(hr, "hf_reference", fake)
    cache = tmp_path / "hf-reference.json"
    hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 4)
    got = hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 4, compute_missing=False)
    assert got[0]["cached"] and got[0]["ids"] == [10, 11, 12, 13]
    with pytest.raises(LookupError, match="1 of the 2 prompts is not in .*not computed"):
        hr.cached_hf_reference(cache, checkpoint, [[10, 1], [30, 3]], 4, compute_missing=False)
    assert len(fake.calls) == 1


def test_another_checkpoint_or_witness_does_not_reuse_the_cache(tmp_path, checkpoint, monkeypatch):
    fake = FakeHF()
    monkeypatch.setattr(hr, "hf_reference", fake)
    cache = tmp_path / "hf-reference.json"
    hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 2, witness="bfloat16")
    hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 2, witness="tf32")
    assert len(fake.calls) == 2
    (checkpoint / "model.safetensors").write_bytes(b"w" * 11)  # rebuilt at the same path
    assert not hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 2, witness="tf32")[0]["cached"]
    assert len(fake.calls) == 3
    cache.write_text("not json")
    assert not hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 2, witness="tf32")[0]["cached"]


def test_a_tiny_model_made_again_elsewhere_reuses_the_carried_reference(tmp_path, monkeypatch):
    """A tiny model is seeded: the same manifest and weight sizes are the same weights, so the
    reference brought back from one GPU session serves the next (whose checkpoint is new)."""
    from sglang_fl.models.tiny import MANIFEST

    fake = FakeHF()
    monkeypatch.setattr(hr, "hf_reference", fake)
    cache = tmp_path / "hf-reference.json"
    for name in ("session1", "session2"):
        model = tmp_path / name / "m"
        model.mkdir(parents=True)
        (model / "model.safetensors").write_bytes(b"w" * 10)
        (model / MANIFEST).write_text('{"format_version": 1, "spec": {"seed": 0}}')
        hr.cached_hf_reference(cache, model, [[10, 1]], 2)
    assert len(fake.calls) == 1
    (model / MANIFEST).write_text('{"format_version": 1, "spec": {"seed": 1}}')
    hr.cached_hf_reference(cache, model, [[10, 1]], 2)
    assert len(fake.calls) == 2


def test_the_servers_own_logprobs_show_a_tie_and_its_rounding_noise():
    """served_evidence: at the parting, the server's margin of its token over HF's (0.0: an
    exact tie, which argmax gives to the lower id); before it, the RMS of the server's minus
    HF's difference to HF's chosen token, beside the sqrt(2) x noise the bound assumes."""
    ref = entry([5, 6, 7], [
        ([5, 9, 1], [3.0, 2.0, 1.0], 0.1),
        ([6, 8, 2], [4.0, 3.9, 1.0], 0.2),
        ([7, 3, 4], [5.0, 4.0, 3.5], 0.3),
    ])
    # the server: step 0 moves token 9 by +0.1 and token 1 by -0.1 against HF; step 1 ties
    # 6 and 3 (HF's 6 and the served 3, a lower id), step 2 is after the parting
    top = [[[5, -1.0], [9, -1.9], [1, -3.1]],
           [[3, -0.5], [6, -0.5], [8, -0.7]],
           [[0, -0.1]]]
    ev = hr.served_evidence([5, 3, 0], top, ref)
    assert ev["served_margin"] == 0.0  # the exact tie, in the server's own logits
    assert ev["noise_pairs"] == 2 and ev["served_noise"] == pytest.approx(0.1)
    assert ev["witness_noise"] == pytest.approx(math.sqrt(2) * 0.1)  # steps before the parting
    # equal ids: every step counts; HF's token beyond the served top: no margin
    same = hr.served_evidence([5, 6, 7], [top[0], [[6, -0.5], [8, -0.6]], [[7, -0.2]]], ref)
    assert same["served_margin"] is None and same["noise_pairs"] == 3
    assert same["witness_noise"] == pytest.approx(math.sqrt(2) * 0.2)
    assert hr.served_evidence([5, 8], [top[0], [[8, -0.1]]], ref)["served_margin"] is None
    assert hr.served_evidence([5], [], ref) == {"served_margin": None, "served_noise": None,
                                                "witness_noise": None, "noise_pairs": 0}


def along(steps):
    """`hf_along`'s entry: per step (top ids, top logits, noise) on the served context."""
    return {"steps": [{"top_ids": t, "top_logits": v, "noise": n} for t, v, n in steps]}


def test_past_the_first_parting_each_step_is_judged_on_the_servers_own_context():
    # The served ids leave HF's at step 1 (judged by `judge`); from step 2 on, HF's logits
    # along the served ids say what HF would pick there.
    path = along([([5, 9], [3.0, 2.0], 0.1), ([8, 6], [4.0, 3.9], 0.1),
                  ([3, 4], [5.0, 4.95], 0.1),   # served 4: within 0.566 of HF's 3
                  ([2, 7], [6.0, 4.0], 0.1),    # served 2: HF's own pick there
                  ([1, 6], [2.0, 1.0], 0.1)])   # served 6: 1.0 behind, a defect
    got = [5, 8, 4, 2, 6]
    rows = hr.judge_along(got, path, start=2)
    assert [(r["step"], r["hf_token"], r["served_token"], r["verdict"]) for r in rows] == [
        (2, 3, 4, hr.NEAR_TIE), (4, 1, 6, hr.DEFECT)]
    assert rows[0]["margin"] == pytest.approx(0.05) and rows[1]["margin"] == pytest.approx(1.0)
    assert hr.judge_along(got, path, start=5) == []
    assert hr.judge_along([5, 8, 3, 2, 1], path, start=2) == []  # HF's picks all along


def test_a_departures_evidence_says_how_far_the_served_distribution_moved_there():
    """`step_evidence`: the served two-logit differences to the served token against HF's,
    as an RMS beside sqrt(2) x HF's witness noise, and how many served top tokens HF kept;
    judge_along adds it to each departure where the server's logprobs are given."""
    at = {"top_ids": [6, 8, 5, 4], "top_logits": [3.0, 2.0, 1.0, 0.5], "noise": 0.1}
    top = [[8, -1.0], [6, -1.1], [5, -2.0], [99, -2.5]]
    ev = hr.step_evidence(8, top, at)
    # 6: (-1.1 + 1.0) - (3.0 - 2.0) = -1.1; 5: (-2.0 + 1.0) - (1.0 - 2.0) = 0; 99: not HF's
    assert ev["step_noise"] == pytest.approx(math.sqrt((1.1 ** 2 + 0.0) / 2))
    assert ev["step_witness_noise"] == pytest.approx(math.sqrt(2) * 0.1)
    assert (ev["step_shared"], ev["step_top"]) == (3, 4)
    assert hr.step_evidence(7, top, at)["step_noise"] is None  # not among the served top
    path = along([([5, 9], [3.0, 2.0], 0.1), ([6, 8, 5, 4], [3.0, 2.0, 1.0, 0.5], 0.1)])
    (row,) = hr.judge_along([5, 8], path, start=1, top=[None, top])
    assert row["verdict"] == hr.DEFECT and row["step_shared"] == 3
    assert "step_noise" not in hr.judge_along([5, 8], path, start=1)[0]
    assert "step_noise" not in hr.judge_along([5, 8], path, start=1, top=[None, None])[0]


class FakeAlong:
    """Stands in for `hf_along`: records the (prompt, ids) paths it was asked for."""

    def __init__(self):
        self.calls = []

    def __call__(self, model_path, paths, *, device, witness):
        self.calls.append([(list(p), list(ids)) for p, ids in paths])
        return [{**along([([t], [1.0], 0.01) for t in ids]), hr.ALONG_KEEPS_SERVED: True}
                for _, ids in paths]


def test_the_cache_holds_hfs_logits_along_served_ids_beside_its_reference(tmp_path, checkpoint,
                                                                         monkeypatch):
    fake_ref, fake_along = FakeHF(), FakeAlong()
    monkeypatch.setattr(hr, "hf_reference", fake_ref)
    monkeypatch.setattr(hr, "hf_along", fake_along)
    cache = tmp_path / "hf-reference.json"
    hr.cached_hf_reference(cache, checkpoint, [[10, 1]], 3)
    paths = [([10, 1], [10, 12, 13]), ([10, 1], [10, 12, 14]), ([10, 1], [10, 12, 13])]
    got = hr.cached_hf_along(cache, checkpoint, paths, witness="bfloat16")
    assert fake_along.calls == [[([10, 1], [10, 12, 13]), ([10, 1], [10, 12, 14])]]  # once each
    assert [[s["top_ids"][0] for s in g["steps"]] for g in got] == [ids for _, ids in paths]

    # Both sections survive each other's writes; a path already there is not computed again.
    hr.cached_hf_reference(cache, checkpoint, [[20, 2]], 3)
    assert len(fake_ref.calls) == 2
    hr.cached_hf_along(cache, checkpoint, paths[:2], compute_missing=False)
    assert hr.cached_hf_reference(cache, checkpoint, [[10, 1], [20, 2]], 3)[0]["cached"]
    with pytest.raises(LookupError, match="along 1 of the 1 served sequences .*not computed"):
        hr.cached_hf_along(cache, checkpoint, [([20, 2], [20, 5, 6])], compute_missing=False)

    # Another witness: neither section is reused.
    hr.cached_hf_along(cache, checkpoint, paths[:1], witness="tf32")
    assert len(fake_along.calls) == 2

    # An entry written before entries kept the served token's logit is computed again.
    doc = json.loads(cache.read_text())
    key = next(iter(doc["along"]))
    del doc["along"][key][hr.ALONG_KEEPS_SERVED]
    cache.write_text(json.dumps(doc))
    hr.cached_hf_along(cache, checkpoint, paths[:1], witness="tf32")
    assert fake_along.calls[-1] == [paths[0]] and len(fake_along.calls) == 3


def test_settle_judges_only_an_undecided_parting_whose_tokens_the_along_entry_kept():
    at = {"top_ids": [2, 7, 8], "top_logits": [5.0, 4.9, 4.0], "noise": 0.5}
    row = {"prompt": 0, "step": 0, "hf_token": 2, "served_token": 8, "verdict": hr.UNDECIDED}
    settled = hr.settle(row, {"steps": [at]})
    assert settled["verdict"] == hr.NEAR_TIE and settled["margin"] == pytest.approx(1.0)
    assert settled["prompt"] == 0 and settled["settled_along"]
    assert hr.settle({**row, "verdict": hr.NEAR_TIE}, {"steps": [at]}) is None
    assert hr.settle({**row, "served_token": 9}, {"steps": [at]}) is None  # not kept: stays
