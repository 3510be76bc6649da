"""The MTP head of a Qwen3.5/3.6 checkpoint in plain PyTorch: warm start and draft agreement.

SGLang's NEXTN speculative decoding drafts with the checkpoint's ``mtp.*`` layer
(``Qwen3_5ForCausalLMMTP``). A random head's drafts are never accepted, so the accepting path of
speculation would go untested. A random multi-layer main model's next token is a near-chaotic
function of its whole context, which one draft layer cannot learn (a fit of the head to it was
tried and did not generalise: docs/speculative-decoding.md). So the tiny checkpoint makes its
main model near-bigram instead (``layer_output_share`` in `sglang_fl.models.tiny`), and then
`MtpHead.warm_start` alone gives a head whose drafts are mostly the main model's own tokens;
`measure_agreement` says how often.

`MtpHead.forward` is the draft forward as SGLang computes it (models/qwen3_5_mtp.py, 0.5.11 and
0.5.23): at position ``t`` it takes the target's final hidden state ``h_t`` (after the final
norm: what the target's LogitsProcessor hands to the draft) and the embedding of the token
``x_{t+1}`` that ``h_t`` predicted; normalises each with its own zero-centred ``(1 + weight)``
RMSNorm; ``fc`` maps ``[embedding, hidden]`` (that order) back to hidden size; one full-attention
decoder layer (causal over the draft's own earlier positions, rotary at position ``t``) and
``mtp.norm`` follow, and the main model's LM head gives the logits for ``x_{t+2}``. The decoder
layer and norms are transformers' own Qwen3.5 classes, which the main model's greedy ids already
match SGLang with. The layout was read from SGLang's source, not run against it;
``tests/unit/test_mtp_agreement.py`` checks the shift and the ``[embedding, hidden]`` order
indirectly: the warm-started head agrees with a near-bigram main model only if they are right.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

#: Where the tiny model records its head's `Agreement`, beside the checkpoint.
AGREEMENT_REPORT = "sglang_fl_mtp_agreement.json"


class MtpHead(nn.Module):
    """``mtp.fc``, ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.layers.0``, ``mtp.norm``.

    The decoder layer and final norm live in a one-layer, full-attention text model of the main
    config (``layer_model.model``); its vocabulary is cut to one row because the head shares the
    main model's embedding and LM head (two vocab x hidden matrices not built for nothing)."""

    def __init__(self, text_config, dtype: torch.dtype, initializer_range: float):
        from transformers import AutoModelForCausalLM

        super().__init__()
        h = text_config.hidden_size
        layer_config = type(text_config).from_dict({
            **text_config.to_dict(), "num_hidden_layers": 1, "layer_types": ["full_attention"],
            "vocab_size": 1, "pad_token_id": None, "tie_word_embeddings": False})
        self.layer_model = AutoModelForCausalLM.from_config(layer_config).to(dtype)
        self.fc = nn.Linear(2 * h, h, bias=False, dtype=dtype)
        nn.init.normal_(self.fc.weight, 0.0, initializer_range)
        norm = type(self.layer_model.model.norm)  # Qwen3.5's (1 + weight) RMSNorm, zeros
        self.pre_fc_norm_embedding = norm(h, eps=text_config.rms_norm_eps).to(dtype)
        self.pre_fc_norm_hidden = norm(h, eps=text_config.rms_norm_eps).to(dtype)

    def forward(self, target_hidden: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """The head's normed output at each position (batch, seq, hidden); positions from 0."""
        fused = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds),
                                   self.pre_fc_norm_hidden(target_hidden)], dim=-1))
        return self.layer_model.model(inputs_embeds=fused, use_cache=False).last_hidden_state

    @torch.no_grad()
    def warm_start(self, main_text) -> None:
        """Start as the main model's last full-attention layer and final norm run on the next
        token: ``fc`` passes the normed embedding through at the embedding's mean scale and
        ignores the target's hidden state. On a near-bigram main model (every layer's output
        damped) this is the main model's own step from ``x_{t+1}``, with one of its layers'
        view of the context, so its drafts are mostly the tokens the main model then picks."""
        types = main_text.config.layer_types
        last = max(i for i, t in enumerate(types) if t == "full_attention")
        self.layer_model.model.layers[0].load_state_dict(main_text.layers[last].state_dict())
        self.layer_model.model.norm.load_state_dict(main_text.norm.state_dict())
        embed = main_text.get_input_embeddings().weight
        h = embed.shape[1]
        self.fc.weight.zero_()
        self.fc.weight[:, :h] = torch.eye(h) * embed.float().pow(2).mean(-1).sqrt().mean()

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The ``mtp.*`` tensors as a Qwen3.5/3.6 checkpoint names and lays them out (the layer
        saved through transformers, which writes its MoE experts one by one)."""
        import tempfile

        from safetensors.torch import load_file

        out = {"mtp.fc.weight": self.fc.weight,
               "mtp.pre_fc_norm_embedding.weight": self.pre_fc_norm_embedding.weight,
               "mtp.pre_fc_norm_hidden.weight": self.pre_fc_norm_hidden.weight}
        with tempfile.TemporaryDirectory() as tmp:
            self.layer_model.save_pretrained(tmp, safe_serialization=True)
            for name, tensor in load_file(str(Path(tmp) / "model.safetensors")).items():
                for src, dst in (("model.layers.0.", "mtp.layers.0."), ("model.norm.", "mtp.norm.")):
                    if name.startswith(src):
                        out[dst + name[len(src):]] = tensor
        return {k: v.detach().cpu().contiguous() for k, v in out.items()}


@dataclass(frozen=True)
class Agreement:
    """How far the head's drafts are the main model's own tokens, on greedy continuations of
    random prompts (the e2e benchmark's kind of request): ``draft`` is the share of generated
    positions where the head's top-1 draft for ``x_{t+2}`` equals the main model's greedy
    token, what SGLang's NEXTN accepts; ``bigram`` the share where the main model's greedy token
    is that of its embedding alone (no layers), which stays below 1 while every layer counts."""

    draft: float
    bigram: float
    positions: int
    dtype: str
    device: str

    def as_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def measure_agreement(head: MtpHead, model, *, seed: int, vocab_size: int, prompts: int = 16,
                      prompt_len: int = 16, new_tokens: int = 32) -> Agreement:
    """`Agreement` of ``head`` with ``model`` (the main image-text model) in their own dtype,
    on CUDA when there is one (the 27B shape's full forwards are too slow on CPU), where both
    are left: the caller has saved the model and only reads the head's tensors back. Greedy
    steps are full forwards without a cache: short sequences, and no cache semantics to get
    wrong. Seeded."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).eval()
    head.to(device).eval()
    text, lm_head = model.model.language_model, model.lm_head
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (prompts, prompt_len), generator=gen).to(device)
    for _ in range(new_tokens):
        last = text(input_ids=ids, use_cache=False).last_hidden_state[:, -1]
        ids = torch.cat([ids, lm_head(last).argmax(-1, keepdim=True)], dim=1)
    hidden = text(input_ids=ids, use_cache=False).last_hidden_state
    greedy = lm_head(hidden).argmax(-1)  # greedy[:, t] is the main model's x_{t+1}
    embeds = text.get_input_embeddings()(ids)
    bigram = lm_head(text.norm(embeds)).argmax(-1)
    # at t the head sees h_t and x_{t+1}, and drafts x_{t+2} = greedy[:, t + 1]; scored where
    # x_{t+1} was generated, as in decoding
    draft = lm_head(head(hidden[:, :-1], embeds[:, 1:])).argmax(-1)
    scored = slice(prompt_len - 1, None)
    hits = draft[:, scored] == greedy[:, 1:][:, scored]
    result = Agreement(draft=round(hits.float().mean().item(), 4),
                       bigram=round((bigram == greedy)[:, scored].float().mean().item(), 4),
                       positions=hits.numel(), dtype=str(hidden.dtype).removeprefix("torch."),
                       device=device)
    logger.info("MTP head: drafts equal the main model's greedy token at %.3f of %d positions "
                "(the embedding alone gives it at %.3f)", result.draft, result.positions, result.bigram)
    return result
