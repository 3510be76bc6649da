"""Helpers of the end-to-end suite (imported by its tests and its conftest).

The servers run ``--dtype float32``: for a float32 checkpoint SGLang's ``auto`` picks float16,
while the reference ids come from HF transformers in float32; the same precision on both sides
is what makes exact greedy-id equality a fair test.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

from sglang_fl.serving import launched_server

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


def hermetic_env(tmp_path: Path, **overrides) -> dict:
    """Drop every sglang-fl/SGLang plugin variable of the test process, then apply ``overrides``;
    the dispatch log goes to a fresh file."""
    env = {k: None for k in os.environ
           if k.startswith("SGLANG_FL_") or k in ("USE_FLAGGEMS", "SGLANG_PLUGINS", "SGLANG_PLATFORM")}
    env["SGLANG_FL_DISPATCH_LOG"] = str(tmp_path / "dispatch.log")
    env.update(overrides)
    return env


def process_env(tmp_path: Path, **overrides) -> dict:
    """The whole environment for a child process: this one's, made hermetic (`hermetic_env`)."""
    env = dict(os.environ)
    for key, value in hermetic_env(tmp_path, **overrides).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
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


def hf_greedy_ids(model_path, prompt_ids, image_text: bool = False) -> list[list[int]]:
    """Greedy continuations from HF transformers (float32), no EOS stop: the ground truth.
    ``image_text``: the checkpoint is an image-text model (Qwen3.5), prompted with text only."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if image_text else AutoModelForCausalLM
    model = auto.from_pretrained(model_path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            gen = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=MAX_NEW_TOKENS,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(gen[0, len(ids):].tolist())
    return out


def dispatch_lines(tmp_path: Path) -> list[str]:
    path = tmp_path / "dispatch.log"
    return sorted(path.read_text(encoding="utf-8").splitlines()) if path.exists() else []


def standin_calls_in(log_text: str) -> list[str]:
    from sglang_fl.compat import CALL_LOG_PREFIX

    return [line for line in log_text.splitlines() if CALL_LOG_PREFIX in line]


def installed(dist: str) -> bool:
    """Whether the distribution ``dist`` is installed (the real package, not a stand-in)."""
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def near_tie_divergences(model_path, prompt_ids, got, want, device="cpu") -> list[tuple]:
    """Where served greedy ids part from HF's, HF's logit margin between its own token and the
    served one at the first differing step: ``[(prompt index, step, margin)]``.

    Greedy equality is only meaningful away from near-ties: a kernel that rounds differently
    (TF32 GEMMs, another reduction order) may pick the runner-up where the two top logits are
    within its rounding. A caller asserts each margin is below what that rounding can explain.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = None
    out = []
    for i, (ids, g, w) in enumerate(zip(prompt_ids, got, want, strict=True)):
        step = next((j for j, (a, b) in enumerate(zip(g, w, strict=False)) if a != b), None)
        if step is None:
            continue
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(device).eval()
        x = torch.tensor([list(ids) + list(w[:step])], device=device)
        with torch.no_grad():
            logits = model(x).logits[0, -1].float()
        out.append((i, step, float(logits[w[step]] - logits[g[step]])))
    return out
