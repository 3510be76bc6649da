"""Models sglang-fl ships so that no hub access is ever needed (tests, demo, benchmarks)."""

from sglang_fl.models.tiny import PRESETS, TinyModelSpec, make_tiny_model

__all__ = ["PRESETS", "TinyModelSpec", "make_tiny_model"]
