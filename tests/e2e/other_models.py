"""Tiny random checkpoints of architectures other than the Qwen presets, for the e2e suite.

Built from transformers' own config classes (random weights, fp32, the tiny preset's tokenizer),
so SGLang loads each through its model class for that architecture: the plugin's routes meet the
layer subclasses those models build (Llama 3 and YaRN RoPE scaling, Gemma 2's norms, Qwen2-MoE's
unnormalised top-k and shared expert) and the classes it does not route (Gemma 3's norms, the Gemmas' GeLU)."""

from __future__ import annotations

from pathlib import Path

#: name -> (transformers config class, its arguments beyond the common tiny sizes)
ARCHITECTURES = {
    # Llama 3.x: RoPE with the llama3 frequency rescaling (SGLang's Llama3RotaryEmbedding)
    "llama3": ("LlamaConfig", {"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 256}}),
    # YaRN context extension (SGLang's YaRNScalingRotaryEmbedding: cos/sin carry an mscale)
    "llama-yarn": ("LlamaConfig", {"rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}}),
    # Qwen2-MoE: top-k without renormalisation (norm_topk_prob false) and a sigmoid-gated shared
    # expert (a Triton kernel in SGLang 0.5.23: ledger swap:fused_gate_sigmoid_mul on CPU)
    "qwen2-moe": ("Qwen2MoeConfig", {"num_experts": 8, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 32, "norm_topk_prob": False,
                                     "shared_expert_intermediate_size": 64}),
    # Gemma 2: GemmaRMSNorm (routed), GeLU MLP, attention and final-logit soft-capping (the
    # latter a Triton kernel in SGLang: ledger swap:fused_softcap on CPU). transformers 5 writes
    # no ``hidden_act``, which SGLang's Gemma2 reads; the published checkpoints carry it.
    "gemma2": ("Gemma2Config", {"head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64,
                                "hidden_act": "gelu_pytorch_tanh"}),
    # Gemma 3: its own RMSNorm (1 + weight) and GeLU MLP, RoPE applied by a plain function
    "gemma3": ("Gemma3TextConfig", {"head_dim": 16, "query_pre_attn_scalar": 16,
                                    "sliding_window": 64}),
}


def make_other_model(name: str, path: Path, tokenizer_dir: Path) -> Path:
    """Write the ``name`` checkpoint (ARCHITECTURES) at ``path`` with ``tokenizer_dir``'s
    tokenizer; deterministic (seed 0)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    config_class, extra = ARCHITECTURES[name]
    config = getattr(transformers, config_class)(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    with torch.no_grad():  # larger than the default init: clear top-1 margins
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
