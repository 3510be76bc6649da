"""Shared pieces of the end-to-end suite: the tiny model, HF's greedy ids, a hermetic launcher.

Every test here talks to a real ``python -m sglang.launch_server`` (or the offline Engine) with
sglang-fl installed, on CPU. Servers are shared per configuration (module-scoped fixtures) and
started one at a time: an idle SGLang scheduler busy-polls a core, and CI has two.

The servers run ``--dtype float32``: for a float32 checkpoint SGLang's ``auto`` picks float16,
while the reference ids come from HF transformers in float32; the same precision on both sides
is what makes exact greedy-id equality a fair test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_fl.serving import launched_server

pytest.importorskip("sglang")

MAX_NEW_TOKENS = 12
PROMPT_TEXTS = (
    "The server answered the question about the kernel.",
    "Hello world, please write a small model",
    "Yes",
)
SERVER_ARGS = ("--dtype", "float32")
EXPECTED_DISPATCH = {
    "RMSNorm": "[OOT-DISPATCH] RMSNorm → reference(reference)",
    "SiluAndMul": "[OOT-DISPATCH] SiluAndMul → reference(reference)",
    "RotaryEmbedding": "[OOT-DISPATCH] RotaryEmbedding → reference(reference)",
}


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/e2e/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.e2e)


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
    """Greedy continuations from HF transformers (float32), no EOS stop: the ground truth."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(gen[0, len(ids):].tolist())
    return out


def hermetic_env(tmp_path: Path, **overrides) -> dict:
    """Drop every sglang-fl/SGLang plugin variable of the test process, then apply ``overrides``;
    the dispatch log goes to a fresh file."""
    env = {k: None for k in os.environ
           if k.startswith("SGLANG_FL_") or k in ("USE_FLAGGEMS", "SGLANG_PLUGINS", "SGLANG_PLATFORM")}
    env["SGLANG_FL_DISPATCH_LOG"] = str(tmp_path / "dispatch.log")
    env.update(overrides)
    return env


def serve(model, tmp_path: Path, timeout: float = 240, **env_overrides):
    return launched_server(model, SERVER_ARGS, hermetic_env(tmp_path, **env_overrides),
                           log_path=tmp_path / "server.log", timeout=timeout)


def greedy_ids(server, prompt_ids, max_new_tokens: int = MAX_NEW_TOKENS) -> list[list[int]]:
    body = server.post_json("/generate", {
        "input_ids": prompt_ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
    })
    return [item["output_ids"] for item in body]


def dispatch_lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "dispatch.log"
    return sorted(path.read_text(encoding="utf-8").splitlines()) if path.exists() else []


def standin_calls_in(log_text: str) -> list[str]:
    from sglang_fl.compat import CALL_LOG_PREFIX

    return [line for line in log_text.splitlines() if CALL_LOG_PREFIX in line]
