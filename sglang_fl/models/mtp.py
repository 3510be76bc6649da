"""The MTP head of a Qwen3.5/3.6 checkpoint in plain PyTorch, and its fit to the main model.

SGLang's NEXTN speculative decoding drafts with the checkpoint's ``mtp.*`` layer
(``Qwen3_5ForCausalLMMTP``). A random head's drafts are never accepted, so the accepting path of
speculation would go untested; `fit_mtp_head` warm-starts the head of a tiny checkpoint from the
main model and fits it to predict the main model's next hidden state (and so its greedy token).
On random multi-layer main models this has not reached useful agreement (measurements in
docs/speculative-decoding.md).

`MtpHead.forward` is the draft forward as SGLang computes it (models/qwen3_5_mtp.py, 0.5.11 and
0.5.23): at position ``t`` it takes the target's final hidden state ``h_t`` (after the final
norm: what the target's LogitsProcessor hands to the draft) and the embedding of the token
``x_{t+1}`` that ``h_t`` predicted; normalises each with its own zero-centred ``(1 + weight)``
RMSNorm; ``fc`` maps ``[embedding, hidden]`` (that order) back to hidden size; one full-attention
decoder layer (causal over the draft's own earlier positions, rotary at position ``t``) and
``mtp.norm`` follow, and the main model's LM head gives the logits for ``x_{t+2}``. The decoder
layer and norms are transformers' own Qwen3.5 classes, which the main model's greedy ids already
match SGLang with. The layout was read from SGLang's source, not run against it;
``tests/unit/test_mtp_fit.py`` checks the shift, order and norms indirectly (a warm-started head
on a one-full-attention-layer main model agrees with it only if they are right).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

#: Where `fit_mtp_head` records what it achieved, beside the checkpoint.
FIT_REPORT = "sglang_fl_mtp_fit.json"


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
        token: ``fc`` passes the normed embedding through at the embedding's mean scale. On a
        main model of one full-attention layer this is that model shifted by one position,
        which is why its drafts agree when the forward is SGLang's."""
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
class FitReport:
    """What a fit achieved: the share of held-out greedy continuation tokens the head's top-1
    draft equals the main model's next greedy token: random, warm-started, fitted."""

    steps: int
    device: str
    train_positions: int
    heldout_positions: int
    agreement_before: float  # the random head
    agreement_warm_start: float
    agreement_after: float
    seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Batch:
    hidden: torch.Tensor  # (n, L-1, h): h_t, the target's normed final hidden state
    next_hidden: torch.Tensor  # (n, L-1, h): h_{t+1}
    next_embeds: torch.Tensor  # (n, L-1, h): embedding of x_{t+1}
    targets: torch.Tensor  # (n, L-1): the main model's greedy token after x_{t+1}
    scored: slice  # positions t whose x_{t+1} the main model generated


class _Main:
    """The main (target) model of a Qwen3.5/3.6 image-text checkpoint, text path only."""

    def __init__(self, model):
        self.text = model.model.language_model
        self.lm_head = model.lm_head
        self.embed = self.text.get_input_embeddings()

    @torch.no_grad()
    def greedy(self, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Prompts followed by the main model's greedy continuation (full forwards, no cache:
        the sequences are short and this path has no cache semantics to get wrong)."""
        ids = prompts
        for _ in range(new_tokens):
            hidden = self.text(input_ids=ids, use_cache=False).last_hidden_state[:, -1]
            ids = torch.cat([ids, self.lm_head(hidden).argmax(-1, keepdim=True)], dim=1)
        return ids

    @torch.no_grad()
    def batch(self, ids: torch.Tensor, prompt_len: int) -> _Batch:
        hidden = self.text(input_ids=ids, use_cache=False).last_hidden_state
        greedy = self.lm_head(hidden).argmax(-1)  # greedy[:, t] is the main model's x_{t+1}
        return _Batch(hidden=hidden[:, :-1], next_hidden=hidden[:, 1:], next_embeds=self.embed(ids[:, 1:]),
                      targets=greedy[:, 1:], scored=slice(prompt_len - 1, None))


def _agreement(head: MtpHead, main: _Main, data: _Batch, chunk: int = 8) -> tuple[float, int]:
    hits = total = 0
    with torch.no_grad():
        for i in range(0, data.hidden.shape[0], chunk):
            out = head(data.hidden[i:i + chunk], data.next_embeds[i:i + chunk])[:, data.scored]
            draft = main.lm_head(out).argmax(-1)
            hits += (draft == data.targets[i:i + chunk, data.scored]).sum().item()
            total += draft.numel()
    return hits / max(total, 1), total


def fit_mtp_head(head: MtpHead, model, *, steps: int, seed: int, vocab_size: int,
                 prompt_len: int = 16, new_tokens: int = 32, train_seqs: int = 64,
                 heldout_seqs: int = 16, batch_seqs: int = 16, lr: float = 3e-5,
                 device: str | None = None) -> FitReport:
    """Warm-start ``head`` from the main model, then fit it (in place) for ``steps`` AdamW
    steps so that its output at ``t`` is the main model's normed hidden state at ``t + 1``:
    then its draft is the main model's next greedy token, and the draft's next step (which
    SGLang feeds the head's own output as the hidden state) sees what the target would give.
    Data: greedy continuations of random prompts, as the e2e benchmark's requests are. Only
    the head changes; ``model`` (the main image-text model) is read in fp32 on CUDA when there
    is one, and left there (the caller is done with it). Seeded."""
    t0 = time.monotonic()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    (head_dtype,) = {p.dtype for p in head.parameters()}
    model.float().to(device).eval().requires_grad_(False)
    head.float().to(device)
    main = _Main(model)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab_size, (train_seqs + heldout_seqs, prompt_len), generator=gen)
    ids = main.greedy(prompts.to(device), new_tokens)
    train = main.batch(ids[:train_seqs], prompt_len)
    heldout = main.batch(ids[train_seqs:], prompt_len)
    before, heldout_positions = _agreement(head, main, heldout)
    head.warm_start(main.text)
    warm, _ = _agreement(head, main, heldout)

    torch.manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    head.train()
    for _ in range(steps):
        rows = torch.randint(0, train_seqs, (batch_seqs,), generator=gen).to(device)
        out = head(train.hidden[rows], train.next_embeds[rows])
        want = train.next_hidden[rows]
        loss = (out - want).pow(2).mean() / want.pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    head.eval()
    after, _ = _agreement(head, main, heldout)
    head.to("cpu", head_dtype)
    report = FitReport(steps=steps, device=device, train_positions=train.targets.numel(),
                       heldout_positions=heldout_positions, agreement_before=round(before, 4),
                       agreement_warm_start=round(warm, 4),
                       agreement_after=round(after, 4), seconds=round(time.monotonic() - t0, 1))
    logger.info("MTP head fitted: draft agreement on held-out greedy continuations %.3f random, "
                "%.3f warm start, %.3f fitted (%d positions, %d steps on %s, %.0f s)", before, warm, after, heldout_positions, steps,
                device, report.seconds)
    return report
