"""The embedded model: loadable by HF, deterministic, reusable, and refuses bad input."""

from __future__ import annotations

import hashlib
import json

import pytest

from sglang_fl.models import PRESETS, make_tiny_model
from sglang_fl.models.tiny import MANIFEST

SMALL = dict(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=128,
             vocab_size=600)


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", **SMALL)


def test_checkpoint_loads_in_transformers_and_chats(small_model):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(small_model)
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == ("qwen2", 64, 1, 600)
    tok = AutoTokenizer.from_pretrained(small_model)
    assert len(tok) == 600  # every id the model can emit decodes
    text = tok.apply_chat_template([{"role": "user", "content": "hello world"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    ids = tok("The server answered the question.")["input_ids"]
    assert tok.decode(ids) == "The server answered the question."
    assert tok.eos_token_id == cfg.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(small_model)
    out = model.generate(**tok("hello", return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape[1] == len(tok("hello")["input_ids"]) + 4 or cfg.eos_token_id in out[0].tolist()


TEXTS = ["The server answered the question.", "  two spaces,\nnewlines\tand tabs",
         "digits 1234567 and 3.14", "caf\u00e9 \u6570\u5b57 \U0001f642", "don't won't I'm",
         "<|im_start|>user\nhi<|im_end|>", "a" * 60 + " " + "ab" * 30]


def test_the_declared_tokenizer_class_is_the_trained_tokenizer(small_model, caplog):
    """tokenizer_config.json names GPT2Tokenizer, which encodes and decodes exactly as the
    trained tokenizer.json, and SGLang loads the checkpoint's tokenizer in one go, without its
    TokenizersBackend retries. (Some transformers releases, 5.19 among them, map model type
    qwen2 to Qwen2Tokenizer whatever the file declares; SGLang and HF then share that class.)"""
    import logging

    from tokenizers import Tokenizer
    from transformers import GPT2Tokenizer

    from sglang_fl.models.tiny import TOKENIZER_CLASS

    config = json.loads((small_model / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == TOKENIZER_CLASS == "GPT2Tokenizer"
    raw = Tokenizer.from_file(str(small_model / "tokenizer.json"))
    tok = GPT2Tokenizer.from_pretrained(small_model)
    for text in TEXTS:
        ids = raw.encode(text).ids
        assert tok(text)["input_ids"] == ids, text
        assert tok.decode(ids) == raw.decode(ids, skip_special_tokens=False), text
    sglang_tokenizer = pytest.importorskip("sglang.srt.utils.hf_transformers.tokenizer")
    with caplog.at_level(logging.INFO):
        loaded = sglang_tokenizer.get_tokenizer(str(small_model))
    assert type(loaded).__name__ in ("GPT2Tokenizer", "Qwen2Tokenizer")
    assert "TokenizersBackend" not in caplog.text


def test_same_spec_reuses_the_directory(small_model):
    stamp = (small_model / "model.safetensors").stat().st_mtime_ns
    assert make_tiny_model(small_model, **SMALL) == small_model
    assert (small_model / "model.safetensors").stat().st_mtime_ns == stamp


def test_deterministic_across_directories(small_model, tmp_path):
    again = make_tiny_model(tmp_path / "again", **SMALL)
    assert _digest(again) == _digest(small_model)
    assert (again / "tokenizer.json").read_text() == (small_model / "tokenizer.json").read_text()
    other_seed = make_tiny_model(tmp_path / "seed1", seed=1, **SMALL)
    assert _digest(other_seed) != _digest(small_model)


def test_changed_spec_rebuilds(tmp_path):
    path = make_tiny_model(tmp_path / "m", **SMALL)
    make_tiny_model(path, **{**SMALL, "num_layers": 2})
    assert json.loads((path / MANIFEST).read_text())["spec"]["num_layers"] == 2
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"preset": "llama"}, "unknown tiny model preset 'llama'; accepted: tiny, qwen2.5-0.5b, qwen3-moe"),
        ({"hidden_sise": 64}, "unknown tiny model option"),
        ({"hidden_size": 100, "num_heads": 3}, "divisible by num_heads"),
        ({"num_layers": 0}, "num_layers=0 must be a positive integer"),
        ({"dtype": "int8"}, "accepted: float32, bfloat16, float16"),
        ({"vocab_size": 100}, "vocab_size=100 must be >= 512"),
        ({"architecture": "llama"}, "accepted: qwen2, qwen3_moe"),
        ({"num_experts": 8}, "num_experts=8 needs architecture='qwen3_moe'"),
        ({"preset": "qwen3-moe", "num_experts_per_tok": 129}, "must be <= num_experts=128"),
        ({"preset": "qwen3-moe", "num_experts": 0}, "num_experts=0 must be a positive integer"),
        ({"preset": "qwen3-moe", "head_dim": 15}, "head size 15 must be even"),
    ],
)
def test_bad_input_names_the_option(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_tiny_model(tmp_path / "bad", **kwargs)


def test_refuses_a_foreign_non_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no sglang-fl tiny model"):
        make_tiny_model(tmp_path, **SMALL)


def test_qwen_preset_has_qwen2_5_0_5b_shapes():
    spec = PRESETS["qwen2.5-0.5b"]
    spec.validate()
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads,
            spec.intermediate_size, spec.vocab_size, spec.tie_word_embeddings, spec.dtype) == (
        24, 896, 14, 2, 4864, 151936, True, "bfloat16")


def test_cli_make_tiny_model_writes_and_reports_bad_input(tmp_path, capsys):
    from sglang_fl.cli import main

    args = ["make-tiny-model", str(tmp_path / "cli"), "--hidden-size", "64", "--num-layers", "1",
            "--num-heads", "2", "--num-kv-heads", "1", "--intermediate-size", "128",
            "--vocab-size", "600"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == str((tmp_path / "cli").resolve())
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["hidden_size"] == 64
    assert main(["make-tiny-model", str(tmp_path / "bad"), "--num-heads", "5"]) == 2
    assert "divisible by num_heads=5" in capsys.readouterr().err


def test_demo_dispatch_summary_parses_the_contract_line_format():
    from sglang_fl.cli_serving import parse_dispatch_log

    text = ("[OOT-DISPATCH] RMSNorm → flagos(flagos)\n"
            "noise\n[sglang-fl INFO] [OOT-DISPATCH] RMSNorm → vendor(vendor.nvidia)\n"
            "[OOT-DISPATCH] SiluAndMul → reference(reference)\n")
    assert parse_dispatch_log(text) == {"RMSNorm": {"flagos(flagos)", "vendor(vendor.nvidia)"},
                                        "SiluAndMul": {"reference(reference)"}}


def test_qwen3_moe_preset_routes_like_qwen3_30b_a3b_at_tiny_sizes(tmp_path):
    """128 experts, 8 per token, renormalised, every layer sparse, head size not hidden/heads;
    written in the per-expert checkpoint layout SGLang's Qwen3-MoE loader reads."""
    from safetensors import safe_open
    from transformers import AutoConfig

    spec = PRESETS["qwen3-moe"]
    path = make_tiny_model(tmp_path / "moe", preset="qwen3-moe", num_layers=1, vocab_size=600)
    cfg = AutoConfig.from_pretrained(path)
    assert cfg.model_type == "qwen3_moe" and cfg.architectures == ["Qwen3MoeForCausalLM"]
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.norm_topk_prob) == (128, 8, True)
    assert (cfg.decoder_sparse_step, cfg.mlp_only_layers) == (1, [])
    assert cfg.head_dim * cfg.num_attention_heads != cfg.hidden_size == spec.hidden_size
    with safe_open(path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert tuple(f.get_slice("model.layers.0.mlp.experts.127.down_proj.weight").get_shape()) == (
            spec.hidden_size, spec.moe_intermediate_size)
    assert {"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.0.gate_proj.weight",
            "model.layers.0.mlp.experts.0.up_proj.weight", "model.layers.0.self_attn.q_norm.weight"} <= keys


@pytest.mark.parametrize("preset", ["qwen3.5", "qwen3.5-moe"])
def test_hybrid_mtp_head_is_a_qwen3_5_checkpoint_head(tmp_path, preset):
    """``--mtp-num-hidden-layers 1``: the ``mtp.*`` tensors of a Qwen3.5/3.6 checkpoint (fc over
    [embedding, hidden], two pre-fc norms, one full-attention layer named and shaped like the
    main model's full-attention layers, final norm), the config key, and main weights
    untouched (HF's greedy ids of the preset stay the reference)."""
    from safetensors.torch import load_file

    spec = PRESETS[preset]
    plain = load_file(str(make_tiny_model(tmp_path / "plain", preset=preset) / "model.safetensors"))
    path = make_tiny_model(tmp_path / "mtp", preset=preset, mtp_num_hidden_layers=1)
    weights = load_file(str(path / "model.safetensors"))

    mtp = {k: v for k, v in weights.items() if k.startswith("mtp.")}
    main = {k: v for k, v in weights.items() if not k.startswith("mtp.")}
    assert main.keys() == plain.keys()
    assert all(main[k].equal(plain[k]) for k in plain)

    full = f"model.language_model.layers.{spec.full_attention_interval - 1}."
    want_layer = {"mtp.layers.0." + k[len(full):]: v.shape for k, v in plain.items() if k.startswith(full)}
    assert "mtp.layers.0.self_attn.q_proj.weight" in want_layer
    got_layer = {k: v.shape for k, v in mtp.items() if k.startswith("mtp.layers.0.")}
    assert got_layer == want_layer
    h = spec.hidden_size
    assert {k: tuple(v.shape) for k, v in mtp.items() if not k.startswith("mtp.layers.")} == {
        "mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
        "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,)}
    assert mtp["mtp.fc.weight"].std() > 0 and mtp["mtp.layers.0.self_attn.q_proj.weight"].std() > 0
    assert json.loads((path / "config.json").read_text())["text_config"]["mtp_num_hidden_layers"] == 1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"mtp_num_hidden_layers": 1}, "mtp_num_hidden_layers=1 needs a hybrid architecture"),
    ({"preset": "qwen3.5", "mtp_num_hidden_layers": 2}, "must be 0 or 1"),
])
def test_mtp_head_bad_input_names_the_option(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_tiny_model(tmp_path / "bad", **kwargs)


@pytest.mark.parametrize("preset, expected", [
    ("qwen3.6-27b", dict(hidden_size=5120, num_attention_heads=24, num_key_value_heads=4,
                         head_dim=256, intermediate_size=17408, linear_num_key_heads=16,
                         linear_num_value_heads=48, vocab_size=248320)),
    ("qwen3.6-35b-a3b", dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=2,
                             head_dim=256, num_experts=256, num_experts_per_tok=8,
                             moe_intermediate_size=512, shared_expert_intermediate_size=512,
                             linear_num_key_heads=16, linear_num_value_heads=32,
                             vocab_size=248320)),
])
def test_qwen3_6_presets_have_the_real_models_layer_shapes(preset, expected):
    """8 of the real layers (6 Gated DeltaNet, then gated full attention every 4th), the real
    widths and Qwen3.6's interleaved mRoPE sections over a quarter of each 256-wide head."""
    from sglang_fl.models.tiny import VISION_TOKENS, _hf_config

    spec = PRESETS[preset]
    spec.validate()
    vocab = {tok: i for i, tok in enumerate(("<|endoftext|>", "<|im_end|>", *VISION_TOKENS))}
    text = _hf_config(spec, vocab).get_text_config()
    assert {k: getattr(text, k) for k in expected} == expected
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    assert text.rope_parameters["mrope_section"] == [11, 11, 10]
    assert text.rope_parameters["partial_rotary_factor"] == 0.25
