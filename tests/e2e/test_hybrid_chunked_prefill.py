"""A Qwen3.5 hybrid served with ``--chunked-prefill-size 16`` and a 135-token prompt: the Gated
DeltaNet layers carry their recurrent and conv states from one prefill chunk to the next
through SGLang's state cache and the plugin's chunked-rule / conv ops (with initial states), and
the greedy ids still equal HF transformers' single pass (fp32). Each prompt alone equals the
batch. One server start (the dense hybrid preset).

``--chunked-prefill-size 16`` is what this test checks (states carried across chunks); every
other served check keeps SGLang's default chunk size."""

from __future__ import annotations

import pytest
from e2e_support import PROMPT_TEXTS, SERVER_ARGS, greedy_ids, hf_greedy_ids, serve

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

LONG_PROMPT = " ".join(["the kernel of the layer answered"] * 15)


def test_chunked_prefill_of_a_long_prompt_equals_hf(tmp_path):
    from transformers import AutoTokenizer

    from sglang_fl.models import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny-qwen3.5", preset="qwen3.5")
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(t)["input_ids"] for t in (*PROMPT_TEXTS, LONG_PROMPT)]
    assert len(prompts[-1]) > 8 * 16  # more than eight chunks
    expected = hf_greedy_ids(model, prompts)
    with serve(model, tmp_path, timeout=400,
               args=(*SERVER_ARGS, "--chunked-prefill-size", "16")) as srv:
        together = greedy_ids(srv, prompts)
        alone = [greedy_ids(srv, [p])[0] for p in prompts]
    assert together == expected
    assert alone == together
