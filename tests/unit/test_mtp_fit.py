"""``mtp_fit_steps``: the MTP head warm-started from and fitted to the main model.

The check that the head's forward is SGLang's draft forward (token x_{t+1} beside the target's
normed h_t, [embedding, hidden] into fc, position t): on a main model of one full-attention
layer the warm-started head is that model shifted by one position, so its drafts agree with
the main model's greedy tokens only if the shift, order and norms are right; a random head's
do not."""

from __future__ import annotations

import json

import pytest

from sglang_fl.models import make_tiny_model
from sglang_fl.models.mtp import FIT_REPORT

ONE_FULL_ATTENTION_LAYER = ["--preset", "qwen3.5", "--num-layers", "1",
                            "--full-attention-interval", "1", "--mtp-num-hidden-layers", "1"]


def test_cli_fits_the_head_and_records_the_agreement(tmp_path, capsys):
    from safetensors.torch import load_file

    from sglang_fl.cli import main

    assert main(["make-tiny-model", str(tmp_path / "fit"), *ONE_FULL_ATTENTION_LAYER,
                 "--mtp-fit-steps", "20"]) == 0
    report = json.loads((tmp_path / "fit" / FIT_REPORT).read_text())
    assert report["steps"] == 20 and report["heldout_positions"] >= 256
    assert report["agreement_before"] <= 0.05  # a random head's drafts: not accepted
    assert report["agreement_warm_start"] >= 0.6 and report["agreement_after"] >= 0.6
    random_head = make_tiny_model(tmp_path / "random", preset="qwen3.5", num_layers=1,
                                  full_attention_interval=1, mtp_num_hidden_layers=1)
    assert not (random_head / FIT_REPORT).exists()
    fitted = load_file(str(tmp_path / "fit" / "model.safetensors"))
    plain = load_file(str(random_head / "model.safetensors"))
    assert fitted.keys() == plain.keys()
    assert all(fitted[k].equal(plain[k]) for k in plain if not k.startswith("mtp."))
    assert not fitted["mtp.fc.weight"].equal(plain["mtp.fc.weight"])


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"preset": "qwen3.5", "mtp_num_hidden_layers": 1, "mtp_fit_steps": -1},
     r"mtp_fit_steps=-1 is not accepted; accepted: 0 \(a random MTP head\) or a positive"),
    ({"preset": "qwen3.5", "mtp_fit_steps": 10}, "needs an MTP head to fit: set mtp_num_hidden_layers=1"),
])
def test_bad_fit_options_name_what_is_accepted(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_tiny_model(tmp_path / "bad", **kwargs)
