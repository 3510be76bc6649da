"""A random-weight Qwen2 or Qwen3-MoE written to disk, with a tokenizer trained here.

The demo, the end-to-end tests and the GPU benchmarks need a model that SGLang loads like any
checkpoint (``config.json`` + safetensors + tokenizer + chat template) without downloading
anything. The weights are random, so replies are gibberish; what matters is that every layer
SGLang runs for the real architecture runs here too (for ``qwen3_moe``: the router, TopK and
FusedMoE with the real model's expert count and top-k), and that the result is bit-for-bit
reproducible (seeded), so greedy token ids can be compared across backends and against HF
transformers.

The tokenizer is a byte-level BPE trained on a small generated corpus and padded with filler
tokens up to the model's vocabulary size, so every id the model can emit decodes to text.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path

#: Bump when the on-disk layout or the generation procedure changes, so cached dirs rebuild.
FORMAT_VERSION = 2
MANIFEST = "sglang_fl_tiny_model.json"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
DTYPES = ("float32", "bfloat16", "float16")
ARCHITECTURES = ("qwen2", "qwen3_moe", "qwen3_5", "qwen3_5_moe")
#: Hybrid (Gated DeltaNet + gated full attention) architectures, served as image-text models.
HYBRID = ("qwen3_5", "qwen3_5_moe")
#: Above this `TinyModelSpec.layer_output_share` the greedy token is no longer mostly the
#: embedding's own (at 0.05 it still was at 63% of positions on the reduced 27B shape).
MAX_LAYER_OUTPUT_SHARE = 0.1
#: The vision tokens a Qwen3.5/3.6 checkpoint's tokenizer and processor name.
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


@dataclass(frozen=True)
class TinyModelSpec:
    """Dimensions of the generated model; the defaults (a Qwen2) fit 2 CPU cores."""

    architecture: str = "qwen2"
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 352
    vocab_size: int = 1024
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    dtype: str = "float32"
    #: Larger than HF's 0.02 on the tiny model so greedy argmax is far from ties, which keeps
    #: token-id comparisons across numerically different backends stable.
    initializer_range: float = 0.1
    seed: int = 0
    #: Per-head size; 0 means ``hidden_size // num_heads`` (Qwen2 has no other choice; Qwen3
    #: sets it on its own: 128 in Qwen3-30B-A3B, whose hidden 2048 over 32 heads would give 64).
    head_dim: int = 0
    # Mixture of experts (qwen3_moe only): every layer is sparse, as in Qwen3-30B-A3B.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    # Hybrid models (qwen3_5, qwen3_5_moe): every full_attention_interval-th layer is gated full
    # attention, the others Gated DeltaNet; a shared expert beside the routed ones (MoE).
    full_attention_interval: int = 2
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    shared_expert_intermediate_size: int = 0
    #: Hybrid models only: 1 adds the multi-token-prediction head real Qwen3.5/3.6 checkpoints
    #: ship (``mtp.*`` weights, ``mtp_num_hidden_layers`` in text_config), which SGLang's
    #: NEXTN/EAGLE speculative decoding loads as its draft model; 0 (default) leaves it out.
    mtp_num_hidden_layers: int = 0
    #: Hybrid models only: 0 (default) keeps the layers as initialised. A share r > 0 (0.02 is
    #: the documented choice) rescales every layer's output projections (attention o_proj, GDN
    #: out_proj, MLP / routed and shared experts' down_proj) so that each of those blocks adds
    #: r times the token embedding's RMS to the residual stream: the next token is then mostly
    #: a function of the current one (a near-bigram model) while every layer still moves the
    #: logits, and an MTP head is warm-started from the main model so that SGLang's NEXTN
    #: accepts most of its drafts (their agreement goes to sglang_fl_mtp_agreement.json).
    layer_output_share: float = 0.0

    def special_tokens(self) -> tuple[str, ...]:
        return SPECIAL_TOKENS + (VISION_TOKENS if self.architecture in HYBRID else ())

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def validate(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"tiny model architecture={self.architecture!r} is not accepted; "
                             f"accepted: {', '.join(ARCHITECTURES)}")
        ints = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                "vocab_size", "max_position_embeddings")
        moe = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
        if self.architecture in ("qwen3_moe", "qwen3_5_moe"):
            ints += moe
        if self.architecture in HYBRID:
            ints += ("full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                     "linear_key_head_dim", "linear_value_head_dim")
            if self.linear_num_value_heads % self.linear_num_key_heads:
                raise ValueError(f"tiny model linear_num_value_heads={self.linear_num_value_heads} "
                                 f"must be a multiple of linear_num_key_heads={self.linear_num_key_heads}")
        if self.architecture == "qwen2":
            set_moe = [f"{n}={getattr(self, n)}" for n in moe if getattr(self, n)]
            if set_moe or self.head_dim:
                raise ValueError(f"tiny model {', '.join(set_moe or [f'head_dim={self.head_dim}'])} "
                                 f"needs architecture='qwen3_moe' (a Qwen2 is dense, head size "
                                 f"hidden_size // num_heads)")
        for name in ints:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"tiny model {name}={value!r} must be a positive integer")
        if not isinstance(self.head_dim, int) or self.head_dim < 0:
            raise ValueError(f"tiny model head_dim={self.head_dim!r} must be 0 (derived) or a positive integer")
        if not self.head_dim and self.hidden_size % self.num_heads:
            raise ValueError(
                f"tiny model hidden_size={self.hidden_size} must be divisible by num_heads={self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"tiny model num_heads={self.num_heads} must be divisible by num_kv_heads={self.num_kv_heads}"
            )
        if self.head_size % 2:
            raise ValueError(f"tiny model head size {self.head_size} must be even (RoPE)")
        if self.architecture in ("qwen3_moe", "qwen3_5_moe") and self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"tiny model num_experts_per_tok={self.num_experts_per_tok} must be "
                             f"<= num_experts={self.num_experts}")
        if self.vocab_size < 512:
            raise ValueError(f"tiny model vocab_size={self.vocab_size} must be >= 512 (byte alphabet + merges)")
        if self.mtp_num_hidden_layers not in (0, 1):
            raise ValueError(f"tiny model mtp_num_hidden_layers={self.mtp_num_hidden_layers!r} must be "
                             f"0 or 1 (SGLang's Qwen3.5 MTP draft has one layer)")
        if self.mtp_num_hidden_layers and self.architecture not in HYBRID:
            raise ValueError(f"tiny model mtp_num_hidden_layers={self.mtp_num_hidden_layers} needs a "
                             f"hybrid architecture ({', '.join(HYBRID)})")
        share = self.layer_output_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= MAX_LAYER_OUTPUT_SHARE:
            raise ValueError(f"tiny model layer_output_share={share!r} is not accepted; accepted: 0 (layers "
                             f"as initialised) or a share of the embedding's RMS in (0, "
                             f"{MAX_LAYER_OUTPUT_SHARE}] (above it the model is no longer near-bigram)")
        if share and self.architecture not in HYBRID:
            raise ValueError(f"tiny model layer_output_share={share} needs a hybrid architecture "
                             f"({', '.join(HYBRID)}): it serves their MTP head")
        if self.dtype not in DTYPES:
            raise ValueError(f"tiny model dtype={self.dtype!r} is not accepted; accepted: {', '.join(DTYPES)}")


PRESETS: dict[str, TinyModelSpec] = {
    "tiny": TinyModelSpec(),
    # Qwen2.5-0.5B's shapes (random weights): what the GPU performance work uses.
    "qwen2.5-0.5b": TinyModelSpec(
        hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
        vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
        dtype="bfloat16", initializer_range=0.02,
    ),
    # Qwen3-30B-A3B's routing (128 experts, 8 per token, renormalised top-k, every layer sparse,
    # head size decoupled from hidden/heads, q/k norm) at tiny sizes, fp32: fits 2 CPU cores.
    "qwen3-moe": TinyModelSpec(
        architecture="qwen3_moe", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=32, intermediate_size=128, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=32, norm_topk_prob=True,
    ),
    # Qwen3.5/3.6 hybrids (Qwen3.6-27B / -35B-A3B's layout at tiny sizes, fp32): Gated DeltaNet
    # and gated full attention alternating, partial (1/4) interleaved mRoPE, a tiny vision tower
    # and the processor files (SGLang loads them for these image-text models).
    "qwen3.5": TinyModelSpec(
        architecture="qwen3_5", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=32, intermediate_size=128,
    ),
    "qwen3.5-moe": TinyModelSpec(
        architecture="qwen3_5_moe", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=32, intermediate_size=128, num_experts=16, num_experts_per_tok=4,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
    ),
    # Qwen3.6-27B's and Qwen3.6-35B-A3B's real shapes (random weights, bf16) with 8 of their
    # 64 / 40 layers (6 Gated DeltaNet, 2 gated full attention): the GPU hybrid-model work.
    "qwen3.6-27b": TinyModelSpec(
        architecture="qwen3_5", hidden_size=5120, num_layers=8, num_heads=24, num_kv_heads=4,
        head_dim=256, intermediate_size=17408, full_attention_interval=4,
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128,
        linear_value_head_dim=128, vocab_size=248320, max_position_embeddings=32768,
        dtype="bfloat16", initializer_range=0.02,
    ),
    "qwen3.6-35b-a3b": TinyModelSpec(
        architecture="qwen3_5_moe", hidden_size=2048, num_layers=8, num_heads=16,
        num_kv_heads=2, head_dim=256, intermediate_size=512, num_experts=256,
        num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        full_attention_interval=4, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128, vocab_size=248320,
        max_position_embeddings=32768, dtype="bfloat16", initializer_range=0.02,
    ),
    # Qwen3-30B-A3B's real shapes (random weights, bf16) with 8 of its 48 layers: the GPU MoE
    # performance work (the per-layer cost is the real model's; the vocabulary too).
    "qwen3-30b-a3b": TinyModelSpec(
        architecture="qwen3_moe", hidden_size=2048, num_layers=8, num_heads=32, num_kv_heads=4,
        head_dim=128, intermediate_size=6144, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, vocab_size=151936,
        max_position_embeddings=32768, dtype="bfloat16", initializer_range=0.02,
    ),
}


def make_tiny_model(path: str | Path, *, preset: str = "tiny", **overrides) -> Path:
    """Write (or reuse) a random-weight checkpoint at ``path`` and return the path.

    ``overrides`` are `TinyModelSpec` fields (``hidden_size``, ``num_layers``, ``vocab_size``...)
    applied on top of ``preset``. A directory already holding a model built from the same spec
    is reused as is; any other non-empty directory is refused rather than overwritten.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown tiny model preset {preset!r}; accepted: {', '.join(PRESETS)}")
    fields = {f.name for f in dataclasses.fields(TinyModelSpec)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown tiny model option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(fields))}")
    spec = dataclasses.replace(PRESETS[preset], **overrides)
    spec.validate()

    out = Path(path).expanduser().resolve()
    manifest = {"format_version": FORMAT_VERSION, "spec": dataclasses.asdict(spec)}
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        try:
            existing = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            existing = None
        if existing == manifest and (out / "model.safetensors").exists():
            return out
    if out.exists() and any(out.iterdir()) and not manifest_path.exists():
        raise FileExistsError(f"{out} is not empty and holds no sglang-fl tiny model; choose another directory")
    out.mkdir(parents=True, exist_ok=True)
    manifest_path.unlink(missing_ok=True)  # a partial write must not look complete

    _write_tokenizer(out, spec)
    _write_model(out, spec)
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic English-like text: enough structure for BPE merges, no downloads."""
    words = (
        "the a an of to in and is it that for on with as was he she they we you are be this have "
        "from or one had by word but not what all were when your can said there use each which do "
        "how their if will up other about out many then them these so some her would make like "
        "him into time has look two more write go see number no way could people my than first "
        "water been call who oil its now find long down day did get come made may part model "
        "token server request kernel chip layer norm rotary attention cache batch decode prefill "
        "hello world python torch tensor vector matrix plugin backend vendor reference answer "
        "question chat assistant user system please thanks yes sure okay good great small tiny"
    ).split()
    rng = random.Random(seed)
    punct = [".", ".", ".", "?", "!", ","]
    out = []
    for _ in range(lines):
        n = rng.randint(4, 14)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        out.append(sentence[0].upper() + sentence[1:] + rng.choice(punct) + f" {rng.randint(0, 999)}")
    return out


def _write_tokenizer(out: Path, spec: TinyModelSpec) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = spec.special_tokens()
    base_vocab = spec.vocab_size - len(specials)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(base_vocab, 4096),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)

    # Pad with filler tokens (never produced by encoding, decodable) up to the model vocab, so
    # any id a random model emits maps to text; then the specials take the last ids.
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    i = 0
    while len(vocab) < base_vocab:
        name = f"<f{i}>"
        if name not in vocab:
            vocab[name] = len(vocab)
        i += 1
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens(list(specials))
    assert tok.get_vocab_size() == spec.vocab_size, (tok.get_vocab_size(), spec.vocab_size)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    _declare_tokenizer_class(out)
    if spec.architecture in HYBRID:
        _write_processor(out, fast)


#: The transformers class that is this tokenizer: byte-level BPE behind GPT-2's split pattern.
#: (Qwen2Tokenizer would re-split by Qwen's own pattern and encode digits differently.)
TOKENIZER_CLASS = "GPT2Tokenizer"


def _declare_tokenizer_class(out: Path) -> None:
    """Name `TOKENIZER_CLASS` in tokenizer_config.json. transformers 5 saves a generic fast
    tokenizer as ``TokenizersBackend``; SGLang takes that for a failed load and loads it again
    twice more in each of its processes (about 3 s per process at the 248,320-token vocabulary
    of the Qwen3.6 presets, logging "Set --trust-remote-code" each time)."""
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = TOKENIZER_CLASS
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


#: The image and video processor settings of a Qwen3.5/3.6 checkpoint (patch 16, 2x2 merge).
_VISION_PROCESSING = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                      "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                      "do_resize": True, "do_convert_rgb": True,
                      "processor_class": "Qwen3VLProcessor"}


def _write_processor(out: Path, tokenizer) -> None:
    """The processor files a Qwen3.5/3.6 checkpoint ships (preprocessor_config.json,
    video_preprocessor_config.json, beside the tokenizer and chat template): SGLang loads the
    processor of an image-text model at start-up. Written as JSON: transformers' video processor
    class needs torchvision just to be built."""
    image = {**_VISION_PROCESSING, "image_processor_type": "Qwen2VLImageProcessorFast",
             "size": {"shortest_edge": 65536, "longest_edge": 16777216}}
    video = {**_VISION_PROCESSING, "video_processor_type": "Qwen3VLVideoProcessor",
             "size": {"shortest_edge": 4096, "longest_edge": 25165824}, "fps": 2,
             "min_frames": 4, "max_frames": 768, "do_sample_frames": True}
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")


def _hf_config(spec: TinyModelSpec, vocab: dict[str, int]):
    """The transformers config of ``spec`` (its ``architectures`` names the class to build)."""
    common = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=spec.tie_word_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=vocab["<|endoftext|>"],
        eos_token_id=vocab["<|im_end|>"],
        pad_token_id=vocab["<|endoftext|>"],
        use_sliding_window=False,
    )
    if spec.architecture in HYBRID:
        return _hybrid_config(spec, vocab, common)
    if spec.architecture == "qwen3_moe":
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(
            head_dim=spec.head_size, num_experts=spec.num_experts,
            num_experts_per_tok=spec.num_experts_per_tok,
            moe_intermediate_size=spec.moe_intermediate_size, norm_topk_prob=spec.norm_topk_prob,
            decoder_sparse_step=1, mlp_only_layers=[], **common)
    from transformers import Qwen2Config

    return Qwen2Config(**common)


def _hybrid_config(spec: TinyModelSpec, vocab: dict[str, int], common: dict):
    """A Qwen3.5 (or -MoE) image-text config: the text model as the spec says, a one-block
    vision tower whose output width is the text model's."""
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig

    text = {k: v for k, v in common.items() if k not in ("use_sliding_window", "rope_theta")}
    text.update(
        head_dim=spec.head_size,
        layer_types=["full_attention" if (i + 1) % spec.full_attention_interval == 0
                     else "linear_attention" for i in range(spec.num_layers)],
        full_attention_interval=spec.full_attention_interval,  # SGLang reads this one
        linear_conv_kernel_dim=4,
        linear_num_key_heads=spec.linear_num_key_heads,
        linear_num_value_heads=spec.linear_num_value_heads,
        linear_key_head_dim=spec.linear_key_head_dim,
        linear_value_head_dim=spec.linear_value_head_dim,
        # Qwen3.5's rotary: a quarter of each head, interleaved mRoPE over (t, h, w) pairs.
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                         "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                         "mrope_section": _mrope_section(spec.head_size // 4 // 2)},
    )
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=spec.hidden_size,
                  num_position_embeddings=64, initializer_range=spec.initializer_range)
    ids = dict(vision_start_token_id=vocab["<|vision_start|>"],
               vision_end_token_id=vocab["<|vision_end|>"],
               image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
               tie_word_embeddings=spec.tie_word_embeddings)
    if spec.mtp_num_hidden_layers:
        text["mtp_num_hidden_layers"] = spec.mtp_num_hidden_layers
    if spec.architecture == "qwen3_5_moe":
        text.update(num_experts=spec.num_experts, num_experts_per_tok=spec.num_experts_per_tok,
                    moe_intermediate_size=spec.moe_intermediate_size,
                    shared_expert_intermediate_size=spec.shared_expert_intermediate_size)
        return Qwen3_5MoeConfig(text_config=text, vision_config=vision, **ids)
    return Qwen3_5Config(text_config=text, vision_config=vision, **ids)


def _mrope_section(pairs: int) -> list[int]:
    """(t, h, w) pair counts for ``pairs`` rotary pairs, as Qwen3.5/3.6's [11, 11, 10] of 32."""
    t = h = pairs * 11 // 32
    return [t, h, pairs - t - h]


def _write_model(out: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = _hf_config(spec, _token_ids(out))
    dtype = getattr(torch, spec.dtype)
    torch.manual_seed(spec.seed)
    with torch.device("cpu"):
        if spec.architecture in HYBRID:
            from transformers import AutoModelForImageTextToText

            model = AutoModelForImageTextToText.from_config(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    if spec.layer_output_share:
        _damp_layer_outputs(model.model.language_model, spec)
    model.to(dtype)
    model.config.dtype = spec.dtype  # written to config.json: what SGLang's --dtype auto uses
    model.save_pretrained(out, safe_serialization=True)
    text = config.get_text_config()
    if spec.mtp_num_hidden_layers:
        _add_mtp_weights(out, spec, text, model)
    GenerationConfig(
        bos_token_id=text.bos_token_id,
        eos_token_id=[text.eos_token_id, text.pad_token_id],
        pad_token_id=text.pad_token_id,
        do_sample=False,
    ).save_pretrained(out)


def _token_ids(out: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS + VISION_TOKENS
            if tok.token_to_id(t) is not None}


def _damp_layer_outputs(text, spec: TinyModelSpec, rounds: int = 3) -> None:
    """Rescale each attention/GDN and MLP/MoE block's output projections so that the block adds
    ``spec.layer_output_share`` times the token embedding's RMS to the residual stream, measured
    on random tokens in fp32. A block's output is linear in its output projection, but its input
    depends on the blocks before it, so the measure-and-rescale repeats (three rounds land each
    block within 1% of the share). Seeded; the model's other weights are left as they are."""
    import re

    import torch

    out_proj = re.compile(r"(^|\.)(o_proj|out_proj|down_proj)(\.weight)?$")
    blocks = [getattr(layer, name) for layer in text.layers for name in ("self_attn", "linear_attn", "mlp")
              if hasattr(layer, name)]
    gen = torch.Generator().manual_seed(spec.seed + 3)
    ids = torch.randint(0, spec.vocab_size, (4, 64), generator=gen)
    rms: dict[int, float] = {}

    def record(i):
        def hook(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            rms[i] = out.float().pow(2).mean().sqrt().item()
        return hook

    with torch.no_grad():
        embed = text.get_input_embeddings()(ids).float().pow(2).mean().sqrt().item()
        for _ in range(rounds):
            hooks = [block.register_forward_hook(record(i)) for i, block in enumerate(blocks)]
            try:
                text(input_ids=ids, use_cache=False)
            finally:
                for h in hooks:
                    h.remove()
            for i, block in enumerate(blocks):
                for name, param in block.named_parameters():
                    if out_proj.search(name):
                        param.mul_(spec.layer_output_share * embed / rms[i])


def _add_mtp_weights(out: Path, spec: TinyModelSpec, text, model) -> None:
    """Add the MTP head of a Qwen3.5/3.6 checkpoint to ``out/model.safetensors``: ``mtp.fc``,
    the two pre-fc norms, one full-attention decoder layer (``mtp.layers.0.*``, MoE in the MoE
    model) and ``mtp.norm`` (`sglang_fl.models.mtp.MtpHead`); it shares the main model's
    embedding and LM head. transformers builds no MTP module (it ignores ``mtp.*`` on load).
    Seeded apart from the main weights, which stay those of the model without the head. With
    ``layer_output_share`` the head is warm-started from ``model`` and its agreement with it
    recorded (which moves ``model`` to CUDA when there is one)."""
    import torch
    from safetensors.torch import load_file, save_file

    from sglang_fl.models.mtp import AGREEMENT_REPORT, MtpHead, measure_agreement

    torch.manual_seed(spec.seed + 1)
    with torch.device("cpu"):
        head = MtpHead(text, getattr(torch, spec.dtype), spec.initializer_range)
    (out / AGREEMENT_REPORT).unlink(missing_ok=True)
    if spec.layer_output_share:
        head.warm_start(model.model.language_model)
        agreement = measure_agreement(head, model, seed=spec.seed + 2, vocab_size=spec.vocab_size)
        (out / AGREEMENT_REPORT).write_text(json.dumps(agreement.as_dict(), indent=2) + "\n")
    weights = load_file(str(out / "model.safetensors"))
    save_file({**weights, **head.checkpoint_tensors()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
