"""HF's reference that every served greedy check is judged against (sglang_fl/models/
hf_reference.py), on a real tiny checkpoint: its ids are HF's greedy ids, its per-step logits
are HF's own at that prefix, the witness measures a rounding noise that only a lower precision
has, and a served runner-up is judged by HF's real margin."""

from __future__ import annotations

import pytest

from sglang_fl.models import hf_reference as hr

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reference(tiny_model, prompt_ids):
    return hr.hf_reference(tiny_model, prompt_ids, 6, witness="bfloat16")


def test_reference_holds_hfs_greedy_ids_and_its_logits_at_each_step(tiny_model, prompt_ids,
                                                                      hf_ids, reference):
    assert [r["ids"] for r in reference] == [ids[:6] for ids in hf_ids]
    model = hr.load_hf_model(tiny_model)
    ids, ref, step = prompt_ids[0], reference[0], 2
    with torch.no_grad():
        logits = model(torch.tensor([list(ids) + ref["ids"][:step]])).logits[0, -1]
    at = ref["steps"][step]
    kept = len(at["top_ids"])
    top = logits.topk(kept)
    assert at["top_ids"] == top.indices.tolist() and at["top_ids"][0] == ref["ids"][step]
    assert at["top_logits"] == pytest.approx(top.values.tolist(), abs=1e-4)
    # The top 8 at least, and every token within the near-tie bound of HF's own.
    within = int((logits >= logits.max() - hr.near_tie_bound(at["noise"])).sum())
    assert kept == max(hr.TOP_K, within) and at["complete"]


def test_the_witness_measures_rounding_noise_only_a_lower_precision_has(tiny_model, prompt_ids,
                                                                          reference):
    noise = [s["noise"] for r in reference for s in r["steps"]]
    # bf16 moves the logits, far less than they spread (bf16 keeps ~3 significant digits).
    spread = min(torch.tensor(s["top_logits"]).std().item() for r in reference for s in r["steps"])
    assert all(0 < n < spread for n in noise), (noise, spread)
    exact = hr.hf_reference(tiny_model, prompt_ids[:1], 3, witness=None)
    assert [s["noise"] for s in exact[0]["steps"]] == [0.0] * 3


def test_a_served_runner_up_is_judged_by_hfs_margin(reference):
    ref, step = reference[0], 2
    at = ref["steps"][step]
    got = ref["ids"][:step] + [at["top_ids"][1]] + ref["ids"][step + 1:]
    v = hr.judge(got, ref)
    assert (v["step"], v["served_token"]) == (step, at["top_ids"][1])
    assert v["margin"] == pytest.approx(at["top_logits"][0] - at["top_logits"][1]) == v["gap"]
    assert v["bound"] == pytest.approx(hr.near_tie_bound(at["noise"])) and v["bound"] > 0


def test_hfs_logits_along_a_served_path_that_left_hfs_ids(tiny_model, prompt_ids, reference):
    """`hf_along` on the real checkpoint: along HF's own ids its argmax is HF's next id at every
    step; along ids that took HF's runner-up at step 2, each later step holds HF's own logits
    given that served prefix, which `judge_along` judges against."""
    ref, step = reference[0], 2
    served = ref["ids"][:step] + [ref["steps"][step]["top_ids"][1]]
    own, path = hr.hf_along(tiny_model, [(prompt_ids[0], ref["ids"]),
                                         (prompt_ids[0], served + [0, 0, 0])], witness="bfloat16")
    assert [s["top_ids"][0] for s in own["steps"]] == ref["ids"]
    model = hr.load_hf_model(tiny_model)
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt_ids[0]) + served])).logits[0, -1]
    at = path["steps"][step + 1]
    top = logits.topk(hr.TOP_K)
    assert at["top_ids"][:hr.TOP_K] == top.indices.tolist()
    assert at["top_logits"][:hr.TOP_K] == pytest.approx(top.values.tolist(), abs=1e-4)
    # The served token there (id 0) is kept with its own logit, in HF's top or not.
    kept = dict(zip(at["top_ids"], at["top_logits"], strict=True))
    assert kept[0] == pytest.approx(float(logits[0]), abs=1e-4) and path[hr.ALONG_KEEPS_SERVED]
    assert 0 < at["noise"]
    got = served + [int(logits.argmax())]
    assert hr.judge_along(got, path, start=step + 1) == []
