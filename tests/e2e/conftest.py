"""Fixtures of the end-to-end suite: the tiny models (Qwen2, Qwen3-MoE, the Qwen3.5 hybrids),
prompts and HF's greedy ids.

Every test here talks to a real ``python -m sglang.launch_server`` (or the offline Engine) with
sglang-fl installed, on CPU. Servers are shared per configuration (module-scoped fixtures) and
started one at a time: an idle SGLang scheduler busy-polls a core, and CI has two.
Helpers live in e2e_support.py (a unique module name: several test folders have a conftest).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_support import PROMPT_TEXTS, hf_greedy_ids


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


@pytest.fixture(scope="session")
def prompt_ids(tiny_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="session")
def hf_ids(tiny_model, prompt_ids) -> list[list[int]]:
    return hf_greedy_ids(tiny_model, prompt_ids)


@pytest.fixture(scope="session")
def moe_model(tmp_path_factory) -> Path:
    """``make-tiny-model --preset qwen3-moe``: Qwen3-30B-A3B's routing at tiny sizes."""
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen3-moe", preset="qwen3-moe")


@pytest.fixture(scope="session")
def moe_prompt_ids(moe_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(moe_model)
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="session")
def moe_hf_ids(moe_model, moe_prompt_ids) -> list[list[int]]:
    return hf_greedy_ids(moe_model, moe_prompt_ids)


@pytest.fixture(scope="session", params=["qwen3.5", "qwen3.5-moe"])
def hybrid_model(request, tmp_path_factory) -> Path:
    """``make-tiny-model --preset qwen3.5`` / ``qwen3.5-moe``: Gated DeltaNet and gated full
    attention alternating (the MoE one with a shared expert), image-text checkpoints."""
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / f"tiny-{request.param}",
                           preset=request.param)


@pytest.fixture(scope="session")
def hybrid_prompt_ids(hybrid_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hybrid_model)
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="session")
def hybrid_hf_ids(hybrid_model, hybrid_prompt_ids) -> list[list[int]]:
    return hf_greedy_ids(hybrid_model, hybrid_prompt_ids, image_text=True)
