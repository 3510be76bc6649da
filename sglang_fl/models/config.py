"""Reading a Hugging Face checkpoint's ``config.json`` the one way every sglang-fl tool does.

Multimodal checkpoints (Qwen3.5/3.6 are image-text models) keep the language model's settings
(``vocab_size``, ``hidden_size``, the linear-attention heads) under ``text_config``; a reader of
the top level alone finds none of them.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_config(path) -> dict:
    """The JSON object of ``path`` (a model directory or its config.json); OSError/ValueError
    when it is missing or not a JSON object."""
    p = Path(str(path))
    cfg = json.loads((p / "config.json" if p.is_dir() else p).read_text(encoding="utf-8"))
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: config.json must hold a JSON object")
    return cfg


def text_settings(cfg: dict) -> dict:
    """The language model's settings: the top level with ``text_config`` laid over it."""
    text = cfg.get("text_config")
    return {**cfg, **text} if isinstance(text, dict) else dict(cfg)
