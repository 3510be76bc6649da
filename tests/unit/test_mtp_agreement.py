"""``layer_output_share``: a near-bigram main model whose warm-started MTP head drafts its tokens.

The draft agreement is what SGLang's NEXTN accept length follows, so it is checked on the
checkpoint as written (the main model and the ``mtp.*`` tensors read back from disk), against
the same head on an undamped main model (where it must fail). That the layers still count is
checked too: each one moves the logits, and the greedy ids are not the embedding's alone."""

from __future__ import annotations

import json
import re

import pytest

from sglang_fl.models import make_tiny_model
from sglang_fl.models.mtp import AGREEMENT_REPORT, MtpHead, measure_agreement

#: Qwen3.6-27B's layer mix (6 Gated DeltaNet + 2 full attention, bf16, init 0.02) at widths and a
#: vocabulary that 2 CPU cores build and run in seconds.
REDUCED_27B = dict(hidden_size=512, num_heads=4, num_kv_heads=2, head_dim=128,
                   intermediate_size=1536, linear_num_key_heads=4, linear_num_value_heads=12,
                   linear_key_head_dim=64, linear_value_head_dim=64, vocab_size=32768)
OUT_PROJ = re.compile(r"(^|\.)(o_proj|out_proj|down_proj)(\.weight)?$")


def _load(path):
    """The main model and its MTP head as the checkpoint at ``path`` holds them."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    text = model.model.language_model
    head = MtpHead(text.config, model.dtype, 0.02)
    names = {"mtp.layers.0.": "layer_model.model.layers.0.", "mtp.norm.": "layer_model.model.norm.",
             "mtp.": ""}
    state = {}
    for key, tensor in load_file(str(path / "model.safetensors")).items():
        prefix = next((p for p in names if key.startswith(p)), None)
        if prefix:
            state[names[prefix] + key[len(prefix):]] = tensor
    missing, unexpected = head.load_state_dict(state, strict=False)
    assert not unexpected and all("embed_tokens" in k or "lm_head" in k for k in missing)
    return model, head.eval()


def test_cli_builds_a_head_that_drafts_the_main_models_tokens(tmp_path):
    from sglang_fl.cli import main

    assert main(["make-tiny-model", str(tmp_path / "near"), "--preset", "qwen3.5",
                 "--mtp-num-hidden-layers", "1", "--layer-output-share", "0.02"]) == 0
    report = json.loads((tmp_path / "near" / AGREEMENT_REPORT).read_text())
    assert report["positions"] >= 512 and report["draft"] >= 0.8
    model, head = _load(tmp_path / "near")
    assert measure_agreement(head, model, seed=2, vocab_size=1024).as_dict() == report

    # the same warm start on the preset's undamped main model: its drafts are not accepted
    plain = make_tiny_model(tmp_path / "plain", preset="qwen3.5", mtp_num_hidden_layers=1)
    assert not (plain / AGREEMENT_REPORT).exists()
    model, head = _load(plain)
    head.warm_start(model.model.language_model)
    assert measure_agreement(head, model, seed=2, vocab_size=1024).draft < 0.1


def test_every_layer_still_moves_the_logits(tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    path = make_tiny_model(tmp_path / "near", preset="qwen3.5", layer_output_share=0.02)
    model = AutoModelForImageTextToText.from_pretrained(path).eval()
    text, lm_head = model.model.language_model, model.lm_head
    ids = torch.randint(0, 1024, (4, 48), generator=torch.Generator().manual_seed(0))

    def logits():
        with torch.no_grad():
            return lm_head(text(input_ids=ids, use_cache=False).last_hidden_state)

    full = logits()
    with torch.no_grad():
        bigram = lm_head(text.norm(text.get_input_embeddings()(ids)))
    assert (full - bigram).abs().mean() > 0.01  # fp32 rounding is ~1e-6
    assert 0.03 < (full.argmax(-1) != bigram.argmax(-1)).float().mean() < 0.3
    for i, layer in enumerate(text.layers):
        outs = [p for n, p in layer.named_parameters() if OUT_PROJ.search(n)]
        saved = [p.detach().clone() for p in outs]
        with torch.no_grad():
            for p in outs:
                p.zero_()
        without = logits()
        with torch.no_grad():
            for p, s in zip(outs, saved, strict=True):
                p.copy_(s)
        assert (full - without).abs().max() > 0.01, f"layer {i} does not move the logits"


@pytest.mark.slow
def test_reduced_27b_shape_agrees_in_bf16(tmp_path, monkeypatch):
    # 4 prompts x 32 steps (128 positions) rather than 16: bf16 matmuls on a CPU without bf16
    # units took 2 minutes of CI for the default sample
    from functools import partial

    from sglang_fl.models import mtp

    monkeypatch.setattr(mtp, "measure_agreement", partial(mtp.measure_agreement, prompts=4))
    path = make_tiny_model(tmp_path / "r27", preset="qwen3.6-27b", mtp_num_hidden_layers=1,
                           layer_output_share=0.02, **REDUCED_27B)
    report = json.loads((path / AGREEMENT_REPORT).read_text())
    assert report["dtype"] == "bfloat16" and report["positions"] == 4 * 32
    assert report["draft"] >= 0.8, report


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"preset": "qwen3.5", "layer_output_share": -0.01}, r"layer_output_share=-0.01 is not accepted; accepted: 0"),
    ({"preset": "qwen3.5", "layer_output_share": 0.5}, r"in \(0, 0.1\]"),
    ({"preset": "qwen3.5", "layer_output_share": True}, "layer_output_share=True is not accepted"),
    ({"preset": "tiny", "layer_output_share": 0.02}, "needs a hybrid architecture"),
])
def test_bad_layer_output_share_names_what_is_accepted(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_tiny_model(tmp_path / "bad", **kwargs)
