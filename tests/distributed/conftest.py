"""Fixtures shared by the server tests of Layer 3 (tensor and pipeline parallelism): one tiny
model, its prompts, and the two references every parallel layout must match -- the
single-process server and HF transformers -- computed once per session."""

from __future__ import annotations

import pytest
from l3_helpers import PROMPTS, hf_greedy, serve_greedy


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("l3") / "tiny-qwen2")


@pytest.fixture(scope="session")
def prompt_ids(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    return [tok(t)["input_ids"] for t in PROMPTS]


@pytest.fixture(scope="session")
def single_process(tiny_model, prompt_ids, tmp_path_factory):
    """(greedy ids, log) of ``--tp-size 1 --pp-size 1``."""
    return serve_greedy(tiny_model, prompt_ids, tmp_path_factory.mktemp("l3") / "server-1.log")


@pytest.fixture(scope="session")
def hf_ids(tiny_model, prompt_ids):
    return hf_greedy(tiny_model, prompt_ids)
