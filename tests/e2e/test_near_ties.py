"""The near-tie rule the GPU end-to-end tests use when kernels round differently from HF: it must
report nothing for equal ids and, where ids part, HF's real logit margin at that step."""

from __future__ import annotations

import pytest
from e2e_support import near_tie_divergences

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.e2e


def test_margin_is_hf_top1_minus_the_served_token(tiny_model, prompt_ids, hf_ids):
    from transformers import AutoModelForCausalLM

    assert near_tie_divergences(tiny_model, prompt_ids, hf_ids, hf_ids) == []
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    ids, want, step = prompt_ids[0], hf_ids[0], 2
    with torch.no_grad():
        logits = model(torch.tensor([list(ids) + want[:step]])).logits[0, -1]
    runner_up = int(logits.topk(2).indices[1])
    got = [want[:step] + [runner_up] + want[step + 1:]] + hf_ids[1:]
    [(prompt, at, margin)] = near_tie_divergences(tiny_model, prompt_ids, got, hf_ids)
    assert (prompt, at) == (0, step)
    assert margin == pytest.approx(float(logits[want[step]] - logits[runner_up]), abs=1e-5)
    assert margin > 0
