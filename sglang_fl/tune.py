"""``sglang-fl tune``: measure every op's implementations on this device, per token bucket, on
a model's shapes, and write the per-op, per-bucket order as a config YAML.

For each op of the op table that the model uses, each backend kind with an implementation here
(the one the policy would pick within that kind) is

1. checked against the fp32 reference (the reference backend run on fp32 copies of the same
   rounded inputs) with the op table's tolerance for the dtype tuned: an impl outside it, or one
   that raises, is excluded from every bucket and reported (the accuracy gate). The reference
   itself is held to everything but the tolerance: its error there is the dtype's own rounding
   (its arithmetic follows SGLang's forward_native where SGLang has one), reported as KEPT;
2. timed at every token count of every bucket (``--tokens``, by default `default_tokens`): the
   median over ``--repeats`` of the mean of ``--iters`` back-to-back calls after ``--warmup``
   calls (one call per repeat where a warm-up call after the first took over `SLOW_CALL_US`),
   the device synchronised around each timing. Timings are eager (what prefill pays,
   launch and Python wrappers included) except in the graph buckets (``--graph-buckets``, on
   CUDA by default the first, decode, bucket): there the calls are captured once in a CUDA graph
   and its replays are timed, which is what CUDA-graph decode pays. An impl that cannot be
   captured is left out of the graph buckets' orders and reported (it would break the server's
   graph capture). The GDN prefill ops (`GDN_EXTEND_OPS`), which no decode graph holds, are
   timed eagerly in every bucket.

A bucket's order is its kinds by their summed time over the bucket's token counts, fastest first.
The YAML (``token_buckets`` + ``op_backends``) loads as a user config (``SGLANG_FL_CONFIG``) or
as a platform YAML's dispatch part; its comments record the device, the versions, the date, the
shapes and the measured microseconds. Framework-neutral: layers are stand-ins holding the op's
``layer_attrs``, which is all an implementation may read.
"""

from __future__ import annotations

import datetime
import importlib.metadata as md
import itertools
import json
import platform as host
import statistics
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

from sglang_fl.dispatch.ops import GDN_OPS, OPS, OpSpec
from sglang_fl.dispatch.policy import bucket_of
from sglang_fl.models.config import text_settings

KIND_ORDER = ("flagos", "vendor", "reference")


class TuneError(ValueError):
    """Bad arguments or model config: the message names the argument and the value."""


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShapes:
    """What the op inputs are sized by. Defaults: Qwen2.5-0.5B (no experts, no mRoPE)."""

    hidden: int = 896
    intermediate: int = 4864
    heads: int = 14
    kv_heads: int = 2
    head_dim: int = 64
    rms_eps: float = 1e-6
    max_positions: int = 4096
    rope_theta: float = 1_000_000.0
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    #: Rotated channels per head; 0 means all of ``head_dim`` (Qwen3.5/3.6 rotate a quarter).
    rotary_dim: int = 0
    # Gated DeltaNet layers (Qwen3.5/3.6 hybrids); 0 key heads: the model has none.
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    conv_kernel: int = 0
    source: str = "defaults (Qwen2.5-0.5B shapes)"

    @property
    def rotary(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of a GDN layer's causal conv1d: q, k and v side by side."""
        return 2 * self.linear_key_heads * self.linear_key_dim + self.linear_value_heads * self.linear_value_dim

    @classmethod
    def from_model(cls, path: str | Path) -> ModelShapes:
        """From a Hugging Face ``config.json`` (a model directory or the file itself)."""
        p = Path(path)
        cfg_path = p / "config.json" if p.is_dir() else p
        if not cfg_path.is_file():
            raise TuneError(f"--model {str(path)!r}: no config.json there (give a Hugging Face model "
                            "directory or its config.json)")
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TuneError(f"--model {str(path)!r}: {cfg_path} is not readable JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise TuneError(f"--model {str(path)!r}: {cfg_path} must hold a JSON object")
        cfg = text_settings(cfg)  # multimodal configs nest the LM's

        def need(key):
            if not isinstance(cfg.get(key), (int, float)) or isinstance(cfg.get(key), bool):
                raise TuneError(f"--model {str(path)!r}: config.json has no numeric {key!r} "
                                f"(got {cfg.get(key)!r}); needed for the op shapes")
            return cfg[key]

        hidden, heads = int(need("hidden_size")), int(need("num_attention_heads"))
        # rope_scaling (Qwen2-VL era) or rope_parameters (Qwen3.5/3.6) carry mRoPE and theta
        rope = {**(cfg.get("rope_scaling") if isinstance(cfg.get("rope_scaling"), dict) else {}),
                **(cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {})}
        section = rope.get("mrope_section")
        experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
        # a hybrid MoE's dense MLP is its shared expert; an MoE without one still has silu_and_mul
        dense = next((k for k in ("intermediate_size", "shared_expert_intermediate_size",
                                  "moe_intermediate_size") if cfg.get(k)), "intermediate_size")
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        partial = float(cfg.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0)
        gdn = bool(cfg.get("linear_num_key_heads"))
        return cls(
            hidden=hidden,
            intermediate=int(need(dense)),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            rms_eps=float(cfg.get("rms_norm_eps") or 1e-6),
            max_positions=int(cfg.get("max_position_embeddings") or 4096),
            rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0),
            experts=experts,
            top_k=int(cfg.get("num_experts_per_tok") or 0) if experts else 0,
            moe_intermediate=int(cfg.get("moe_intermediate_size") or cfg.get("intermediate_size"))
            if experts else 0,
            mrope_section=tuple(int(x) for x in section) if section else None,
            mrope_interleaved=bool(rope.get("mrope_interleaved", False)),
            rotary_dim=int(head_dim * partial) if partial != 1.0 else 0,
            linear_key_heads=int(need("linear_num_key_heads")) if gdn else 0,
            linear_value_heads=int(need("linear_num_value_heads")) if gdn else 0,
            linear_key_dim=int(need("linear_key_head_dim")) if gdn else 0,
            linear_value_dim=int(need("linear_value_head_dim")) if gdn else 0,
            conv_kernel=int(cfg.get("linear_conv_kernel_dim") or 4) if gdn else 0,
            source=f"{cfg_path}",
        )

    def describe(self) -> str:
        text = (f"hidden {self.hidden}, intermediate {self.intermediate}, heads {self.heads}/"
                f"{self.kv_heads} x {self.head_dim}")
        if self.experts:
            text += f", {self.experts} experts top-{self.top_k} x {self.moe_intermediate}"
        if self.rotary_dim:
            text += f", rotary {self.rotary_dim} of {self.head_dim}"
        if self.mrope_section:
            text += f", mrope_section {list(self.mrope_section)}"
            text += " interleaved" if self.mrope_interleaved else ""
        if self.linear_key_heads:
            text += (f", GDN heads {self.linear_key_heads}/{self.linear_value_heads} x "
                     f"{self.linear_key_dim}/{self.linear_value_dim}, conv {self.conv_kernel}")
        return text


# ---------------------------------------------------------------------------------------------
# Inputs per op: (layer stand-in, args) per variant; ``canon`` makes outputs comparable
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    variants: list[tuple[object, tuple]]
    canon: object = None  # fn(output) -> tensors to compare, default: the output's tensors
    inplace: tuple[int, ...] = ()  # positions of args the op writes: compared after the call too


def _layer(**attrs):
    return types.SimpleNamespace(**attrs)


def _rope_cache(s: ModelShapes, torch, device):
    """cos/sin halves in fp32: SGLang keeps a RoPE layer's ``cos_sin_cache`` in fp32 on CUDA,
    and its kernel refuses a bf16 one (H100 2026-12-05: the vendor impl was excluded for it)."""
    half = s.rotary // 2
    inv = 1.0 / (s.rope_theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half))
    freqs = torch.outer(torch.arange(s.max_positions, device=device, dtype=torch.float32), inv)
    return freqs.cos(), freqs.sin()


def _topk_canon(out):
    weights, ids = out
    order = ids.argsort(dim=-1)
    return weights.gather(-1, order), ids.gather(-1, order)


def build_case(op: str, s: ModelShapes, tokens: int, dtype, device, seed: int = 0) -> Case | None:
    """Inputs of ``op`` at ``tokens`` tokens, or None if the model does not use the op (`uses`)."""
    import torch

    if not uses(op, s):
        return None

    g = torch.Generator(device="cpu").manual_seed(seed * 1000 + tokens)

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dt)

    if op in ("rms_norm", "gemma_rms_norm"):
        weight = randn(s.hidden, scale=0.1) + (0.0 if op == "gemma_rms_norm" else 1.0)
        layer = _layer(weight=weight, variance_epsilon=s.rms_eps)
        x, res = randn(tokens, s.hidden), randn(tokens, s.hidden)
        return Case([(layer, (x,)), (layer, (x, res))])
    if op == "silu_and_mul":
        return Case([(_layer(), (randn(tokens, 2 * s.intermediate),))])
    if op in ("rotary_embedding", "mrotary_embedding"):
        cos, sin = _rope_cache(s, torch, device)
        layer = _layer(head_size=s.head_dim)
        if op == "rotary_embedding":
            # q and k as Qwen2/Llama-style layers pass them: views of the qkv projection's
            # [tokens, q|k|v] output (Qwen3.5/3.6 norm q and k first, which hands mRoPE new
            # contiguous tensors)
            sizes = [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim]
            q, k, _ = randn(tokens, sum(sizes)).split(sizes, dim=-1)
            pos = (torch.arange(tokens) * 37 % s.max_positions).to(device)
            return Case([(layer, (q, k, cos, sin, pos, False, True))])
        q, k = randn(tokens, s.heads * s.head_dim), randn(tokens, s.kv_heads * s.head_dim)
        pos = (torch.arange(3 * tokens) * 37 % s.max_positions).reshape(3, tokens).to(device)
        return Case([(layer, (q, k, cos, sin, pos, tuple(s.mrope_section), s.mrope_interleaved,
                              False, True))])
    if op == "topk":
        logits = randn(tokens, s.experts)
        hidden = randn(tokens, s.hidden)
        return Case([(_layer(), (hidden, logits, s.top_k, True, "softmax"))], canon=_topk_canon)
    if op == "fused_moe":
        e, h, i = s.experts, s.hidden, s.moe_intermediate
        # One device holds every expert (no expert parallelism), as the layer says it: vendor.cuda
        # then times SGLang's unfiltered kernels, the ones a single-device server runs.
        layer = _layer(w13_weight=randn(e, 2 * i, h, scale=h ** -0.5), w2_weight=randn(e, h, i, scale=i ** -0.5),
                       moe_runner_config=types.SimpleNamespace(num_experts=e, num_local_experts=e))
        logits = torch.randn(tokens, e, generator=g)
        weights, ids = torch.topk(logits.softmax(-1), s.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).float().to(device)
        return Case([(layer, (randn(tokens, h), weights, ids.to(device=device, dtype=torch.int32)))])
    if op in GDN:
        return _gdn_case(op, s, tokens, randn, torch, device, dtype)
    raise KeyError(op)


GDN = tuple(spec.name for spec in GDN_OPS)


#: GDN decode ops run one token per sequence, and SGLang's recurrent kernels (FlagGems' too) put
#: sequences x value heads on the launch grid's 65,535-wide axis: 2,048 sequences of Qwen3.6's 48
#: value heads fail to launch ("invalid argument", H100 2026-12-05). A server decodes far fewer
#: sequences at once, so a larger token count is timed at this many sequences.
MAX_DECODE_SEQUENCES = 512
GDN_DECODE_OPS = ("recurrent_gated_delta_rule", "packed_recurrent_gated_delta_rule", "causal_conv1d_update")
#: GDN ops SGLang calls only in extend (prefill) passes, which it runs eagerly: its decode graph
#: never holds them, so they are timed eagerly in a graph bucket too (there the bucket is a small
#: prefill's). Under a graph they fail to capture (they copy host lengths) and got no order.
GDN_EXTEND_OPS = ("chunk_gated_delta_rule", "causal_conv1d")
#: A prefill batch holds several requests: the GDN prefill ops' tokens are cut into sequences of
#: at most this many, so an impl that loops over sequences on the host (the reference) pays per
#: request as it would in a server. (Until 2026-12-05 one sequence: the H100 tune then put the
#: reference's per-sequence conv1d first in prefill.)
PREFILL_SEQUENCE = 512


def _gdn_case(op: str, s: ModelShapes, tokens: int, randn, torch, device, dtype) -> Case:
    """A GDN layer's op at ``tokens`` tokens as SGLang calls it: prefill ops (chunked rule,
    conv1d) on sequences of at most `PREFILL_SEQUENCE` tokens (each chunked rule from a cached
    state, every other conv1d from a cached window), decode ops (recurrent rule, conv1d update)
    on ``tokens`` sequences of one token each (at most `MAX_DECODE_SEQUENCES`), through a state
    pool. The prefill ops' activations come in the strided layouts SGLang passes: a kernel's
    time depends on them (2026-12-06, causal_conv1d)."""
    h, hv, dk, dv, f32 = s.linear_key_heads, s.linear_value_heads, s.linear_key_dim, s.linear_value_dim, torch.float32
    if op in GDN_DECODE_OPS:
        tokens = min(tokens, MAX_DECODE_SEQUENCES)

    def ints(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    a, b = randn(tokens, hv), randn(tokens, hv)
    a_log, dt_bias = randn(hv, dt=f32).clamp(-1, 1), randn(hv, dt=f32)
    if op == "gdn_gating":
        return Case([(_layer(), (a_log, a, b, dt_bias))])
    if op == "rms_norm_gated":
        layer = _layer(weight=randn(dv, scale=0.1) + 1.0)
        return Case([(layer, (randn(tokens * hv, dv), randn(tokens * hv, dv), s.rms_eps, None, True))])
    if op == "packed_recurrent_gated_delta_rule":  # rows q | k | v, one token per sequence
        pool = randn(tokens + 1, hv, dv, dk, scale=0.1, dt=f32)
        mixed = randn(tokens, 2 * h * dk + hv * dv)
        return Case([(_layer(), (mixed, a, b, a_log, dt_bias, pool,
                                 ints(list(range(1, tokens + 1)))))], inplace=(5,))
    bounds = [*range(0, tokens, PREFILL_SEQUENCE), tokens]  # the prefill ops' sequences
    seqs = len(bounds) - 1
    if op == "chunk_gated_delta_rule":  # g and beta as gdn_gating hands them on
        from sglang_fl.dispatch.backends.reference_gdn import gdn_gating

        # q, k and v as SGLang's GDN backend passes them: views of the conv's [tokens, q|k|v]
        # output, split on its last dim (rows strided by the whole width)
        qkv = randn(tokens, 2 * h * dk + hv * dv).split([h * dk, h * dk, hv * dv], dim=-1)
        q, k, v = (t.view(1, tokens, n, d) for t, n, d in zip(qkv, (h, h, hv), (dk, dk, dv),
                                                               strict=True))
        g, beta = gdn_gating(a_log, a, b, dt_bias)
        state = randn(seqs, hv, dv, dk, scale=0.1, dt=f32)
        return Case([(_layer(), (q, k, v, g, beta, state, ints(bounds)))])
    if op == "recurrent_gated_delta_rule":
        q, k, v = randn(1, tokens, h, dk), randn(1, tokens, h, dk), randn(1, tokens, hv, dv)
        pool = randn(tokens + 1, hv, dv, dk, scale=0.1, dt=f32)
        slots, cu = ints(list(range(1, tokens + 1))), ints(list(range(tokens + 1)))
        return Case([(_layer(), (q, k, v, a, b, a_log, dt_bias, pool, slots, cu))], inplace=(7,))
    dim, width = s.conv_dim, s.conv_kernel
    weight = randn(dim, width, scale=width ** -0.5)
    if op == "causal_conv1d":
        states = randn(seqs + 1, dim, width - 1)
        has = torch.arange(seqs, device=device) % 2 == 0
        lens = [end - start for start, end in zip(bounds, bounds[1:], strict=False)]
        # x as SGLang's GDN backend passes it: a [dim, tokens] view of the layer's [tokens, dim]
        # projection (channel-last), the layout SGLang's kernel is written for. On a contiguous
        # x it took 3.1 ms at 8,192 tokens on the H100 (2026-12-06), the PyTorch reference came
        # first in the chunk bucket, and that order served the 35B-A3B shape's prefill 6 % below
        # SGLang's.
        x = randn(tokens, dim).transpose(0, 1)
        return Case([(_layer(), (x, weight, None, states, ints(bounds),
                                 ints(list(range(1, seqs + 1))), has, "silu", lens))], inplace=(3,))
    if op == "causal_conv1d_update":
        states = randn(tokens + 1, dim, width - 1)
        return Case([(_layer(), (randn(tokens, dim), states, weight, None, "silu",
                                 ints(list(range(1, tokens + 1)))))], inplace=(1,))
    raise KeyError(op)


#: Ops the tuner can build inputs for (an op added to the table needs a branch in build_case).
TUNABLE = ("rms_norm", "gemma_rms_norm", "silu_and_mul", "rotary_embedding", "mrotary_embedding",
           "topk", "fused_moe", *GDN)

#: Why build_case gave no inputs: the model does not use the op.
UNUSED = {"mrotary_embedding": "the model has no mRoPE (no mrope_section)",
          "rotary_embedding": "the model's RoPE layers are mRoPE, timed as mrotary_embedding",
          "topk": "the model has no experts", "fused_moe": "the model has no experts",
          **{op: "the model has no Gated DeltaNet layers" for op in GDN}}


def uses(op: str, s: ModelShapes) -> bool:
    """Whether a model of shapes ``s`` calls ``op`` (`UNUSED` says why not): decided from the
    shapes alone, without building inputs (`build_case` and op_bench's ``--model`` ask it)."""
    if op in ("rotary_embedding", "mrotary_embedding"):
        return (op == "mrotary_embedding") == bool(s.mrope_section)
    if op in ("topk", "fused_moe"):
        return bool(s.experts)
    if op in GDN:
        return bool(s.linear_key_heads)
    return True


def _one_line(text) -> str:
    """An error message as one line: it goes into YAML comments (a CUDA error's text spans
    several lines, and a line without ``#`` broke the written YAML, H100 2026-12-05)."""
    return " ".join(str(text).split())


def _fp32(value, torch):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    return value


def _fp32_layer(layer, torch):
    return types.SimpleNamespace(**{k: _fp32(v, torch) for k, v in vars(layer).items()})


def _clone(value, torch):
    """A copy with the same strides, so that the gate runs each impl on the layout it is timed
    on: ``clone()`` makes a view with gaps (SGLang's split q, k, v) contiguous. An expanded
    (stride 0) tensor cannot be written so, and is cloned as before."""
    if not isinstance(value, torch.Tensor):
        return value
    if 0 in value.stride():
        return value.clone()
    return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype,
                               device=value.device).copy_(value)


def _tensors(out, torch):
    return [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]


# ---------------------------------------------------------------------------------------------
# Gate and timing
# ---------------------------------------------------------------------------------------------


def accuracy_error(spec: OpSpec, fn, reference, case: Case, dtype) -> tuple[str, str]:
    """``(broken, outside)`` for ``fn`` on every variant of ``case`` against the fp32 reference:
    why it cannot stand for the op (it raises, or gives other outputs, shapes or integers, or
    non-finite floats), else ""; and its first output outside the op's tolerance for ``dtype``,
    else "". The gate excludes an impl for either, the reference only for the first: its own
    distance from its fp32 self is the dtype's rounding."""
    import torch

    tol = spec.tolerance.for_dtype(dtype)
    canon = case.canon or (lambda out: out)
    outside = ""
    for n, (layer, args) in enumerate(case.variants):
        got_args = [_clone(a, torch) for a in args]
        want_args = [_fp32(_clone(a, torch), torch) for a in args]
        try:
            got = fn(layer, *got_args)
        except Exception as exc:  # noqa: BLE001 - reported as the reason
            return f"raised {type(exc).__name__}: {_one_line(exc)[:200]}", ""
        want = reference(_fp32_layer(layer, torch), *want_args)
        got_t = _tensors(canon(got), torch) + [got_args[i] for i in case.inplace]
        want_t = _tensors(canon(want), torch) + [want_args[i] for i in case.inplace]
        if len(got_t) != len(want_t):
            return f"variant {n}: {len(got_t)} outputs, the reference gives {len(want_t)}", ""
        for i, (g_, w_) in enumerate(zip(got_t, want_t, strict=True)):
            if g_.shape != w_.shape:
                return f"variant {n} output {i}: shape {tuple(g_.shape)}, expected {tuple(w_.shape)}", ""
            if not g_.is_floating_point():
                if not torch.equal(g_.cpu(), w_.to(g_.dtype).cpu()):
                    return f"variant {n} output {i}: {int((g_.cpu() != w_.to(g_.dtype).cpu()).sum())} values differ", ""
                continue
            g32, w32 = g_.float(), w_.float()
            finite = bool(torch.isfinite(g32).all())
            excess = (g32 - w32).abs() - (tol["atol"] + tol["rtol"] * w32.abs())
            if not finite or float(excess.max()) > 0:
                err = float((g32 - w32).abs().nan_to_num(float("inf")).max())
                why = (f"variant {n} output {i}: max abs error {err:.3g} exceeds atol {tol['atol']:g} "
                       f"+ rtol {tol['rtol']:g} (op table, {str(dtype).removeprefix('torch.')})")
                if not finite:
                    return why, ""
                outside = outside or why
    return "", outside


def _synchronize(device, torch) -> None:
    kind = torch.device(device).type
    if kind == "cpu":
        return
    mod = getattr(torch, kind, None)
    if mod is not None and hasattr(mod, "synchronize"):
        mod.synchronize()


#: A call slower than this (us) is timed one call per repeat: its launch cost is noise, and the
#: PyTorch reference of a GDN decode op (0.34 s a call at 2,048 sequences, H100 2026-12-05) took
#: most of a 300 s tune run at ``iters`` calls per repeat.
SLOW_CALL_US = 10_000.0


def time_case(fn, case: Case, device, iters: int, warmup: int, repeats: int) -> float:
    """Microseconds per call, summed over the case's variants (median of repeats)."""
    import torch

    total = 0.0
    for layer, args in case.variants:
        n = iters
        for i in range(warmup):
            _synchronize(device, torch)
            start = time.perf_counter()
            fn(layer, *args)
            _synchronize(device, torch)
            if i and (time.perf_counter() - start) * 1e6 > SLOW_CALL_US:  # the first may compile
                n = 1
        samples = []
        for _ in range(repeats):
            _synchronize(device, torch)
            start = time.perf_counter()
            for _ in range(n):
                fn(layer, *args)
            _synchronize(device, torch)
            samples.append((time.perf_counter() - start) * 1e6 / n)
        total += statistics.median(samples)
    return total


def time_case_graph(fn, case: Case, device, iters: int, warmup: int, repeats: int) -> float:
    """Microseconds per call under a CUDA graph, summed over the case's variants: ``iters``
    calls captured once (after ``warmup`` calls on a side stream, which also compile), then the
    median over ``repeats`` replays timed with device events. Raises where the impl cannot be
    captured (a host read, a synchronisation, an allocation the graph may not make)."""
    import torch

    if torch.device(device).type != "cuda":
        raise TuneError(f"CUDA graph timing needs a CUDA device, not {device!r}")
    total = 0.0
    for layer, args in case.variants:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(max(warmup, 1)):
                fn(layer, *args)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                fn(layer, *args)
        graph.replay()
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3 / iters)
        total += statistics.median(samples)
        del graph
    return total


TIMERS = {"eager": time_case, "graph": time_case_graph}


def _only_raised(res: OpResult) -> bool:
    """Whether kinds other than the reference have impls here and each was excluded for raising
    (none shown inaccurate; one that cannot be captured must stay out of a graph bucket)."""
    others = [label for kind, label in res.impls.items() if kind != "reference"]
    return bool(others) and all(res.excluded.get(label, "").startswith("raised") for label in others)


def _check_device_after_capture(device, op: str, label: str) -> None:
    """A failed capture can leave the CUDA context unusable (a sticky error): then every later
    timing would fail or lie, so stop with what to do instead."""
    import torch

    if torch.device(device).type != "cuda":
        return
    try:
        torch.cuda.synchronize()
        (torch.ones(1, device=device) + 1).item()
    except Exception as exc:  # noqa: BLE001
        raise TuneError(f"the CUDA context is unusable after {op} {label} failed its graph capture "
                        f"({type(exc).__name__}: {exc}); rerun with --graph-buckets none, or with "
                        f"--ops leaving {op} out") from None


# ---------------------------------------------------------------------------------------------
# The tuner
# ---------------------------------------------------------------------------------------------


#: Why a reference outside the tolerance of its own fp32 result stays in the order.
ROUNDING_NOTE = "the reference's own rounding in the served dtype; kept as the last fallback"


@dataclass
class OpResult:
    op: str
    impls: dict[str, str] = field(default_factory=dict)  # kind -> impl label measured
    excluded: dict[str, str] = field(default_factory=dict)  # impl label -> why
    us: dict[str, dict[int, float]] = field(default_factory=dict)  # kind -> tokens -> us
    orders: dict[str, list[str]] = field(default_factory=dict)  # bucket -> kinds
    not_capturable: dict[str, str] = field(default_factory=dict)  # impl label -> why (graph buckets)
    rounding: dict[str, str] = field(default_factory=dict)  # reference label -> its own rounding error
    skipped: str = ""  # why the op was not tuned

    def fastest_by_tokens(self, counts) -> dict[str, tuple[int, ...]]:
        """kind -> the token counts of ``counts`` where it was the fastest. More than one kind:
        the bucket's order (by summed time) favours its larger counts, and a bucket bound
        between them would give each size its own fastest kind."""
        out: dict[str, list[int]] = {}
        for t in counts:
            timed = {k: v[t] for k, v in self.us.items() if t in v}
            if timed:
                out.setdefault(min(timed, key=lambda k: (timed[k], KIND_ORDER.index(k))), []).append(t)
        return {k: tuple(v) for k, v in out.items()}


@dataclass
class TuneResult:
    buckets: tuple[tuple[str, int | None], ...]
    tokens: dict[str, tuple[int, ...]]
    shapes: tuple[ModelShapes, ...]  # every model timed; an op's time sums over those using it
    dtype: str
    device: str
    settings: dict
    ops: dict[str, OpResult]
    graph_buckets: tuple[str, ...] = ()


#: SGLang's default ``chunked_prefill_size`` on 60-160 GB GPUs (H100, H200): the batch a long
#: prompt's prefill runs at. An unbounded bucket after a bound is timed there too, since an op's
#: order can flip between 2,048 tokens and this (fused_moe on the H100, 2026-12-06).
SERVED_PREFILL_CHUNK = 8192


def default_tokens(buckets) -> dict[str, tuple[int, ...]]:
    """Two token counts per bounded bucket: its smallest and largest. An unbounded bucket after
    a bound: 4x and 32x that bound, and `SERVED_PREFILL_CHUNK` where it falls in the bucket,
    none above the larger of that chunk and 4x the bound (SGLang runs a long prompt's prefill in
    chunks: a count it never runs would only slow the tune, by seconds per call of the
    reference ops at 65,536 tokens); a single unbounded bucket: 1 and 256."""
    out, lo = {}, 0
    for name, hi in buckets:
        if hi is None:
            top = max(SERVED_PREFILL_CHUNK, lo * 4)
            counts = ({c for c in (lo * 4, lo * 32, SERVED_PREFILL_CHUNK) if lo < c <= top}
                      if lo else {1, 256})
            out[name] = tuple(sorted(counts))
        else:
            out[name] = tuple(dict.fromkeys((lo + 1, hi)))
            lo = hi
    return out


def assign_tokens(buckets, tokens) -> dict[str, tuple[int, ...]]:
    """Each token count in its bucket; every bucket must get one."""
    out = {name: [] for name, _ in buckets}
    for t in sorted(set(tokens)):
        if t < 1:
            raise TuneError(f"--tokens: {t} is not a positive token count")
        name = bucket_of(buckets, t)
        if name is not None:
            out[name].append(t)
    empty = [name for name, v in out.items() if not v]
    if empty:
        from sglang_fl.config.settings import format_buckets

        raise TuneError(f"--tokens {','.join(map(str, sorted(set(tokens))))}: no count in bucket(s) "
                        f"{', '.join(empty)} ({format_buckets(buckets)}); give at least one per bucket")
    return {k: tuple(v) for k, v in out.items()}


def pick_per_kind(manager, op: str) -> dict[str, object]:
    """kind -> the impl the policy would pick within that kind here (vendor lists applied)."""
    out = {}
    for impl in sorted(manager.registry.impls(op), key=lambda i: (-i.priority, i.impl_id)):
        kind = impl.kind.value
        if kind in out:
            continue
        if kind == "vendor" and manager.policy.vendor_excluded(impl.vendor):
            continue
        out[kind] = impl
    return out


def tune(manager, shapes, buckets, tokens: dict[str, tuple[int, ...]], dtype, device,
         ops=None, iters: int = 20, warmup: int = 3, repeats: int = 5, progress=None,
         graph_buckets=(), timers=None) -> TuneResult:
    """Gate and time every op (see the module's docstring) on the shapes of one model or of
    several (a `ModelShapes` or a sequence: a platform YAML serves them all, so an op's order
    comes from its time summed over the models that use it); ``graph_buckets`` names the
    buckets timed under a CUDA graph, ``timers`` ({"eager": ..., "graph": ...}) replaces
    `TIMERS`."""
    timers = {**TIMERS, **(timers or {})}
    models = (shapes,) if isinstance(shapes, ModelShapes) else tuple(shapes)
    graph_mode = {t: "graph" if name in graph_buckets else "eager"
                  for name, _ in buckets for t in tokens[name]}

    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    oracle = ReferenceBackend()
    results: dict[str, OpResult] = {}
    for spec in OPS:
        if ops is not None and spec.name not in ops:
            continue
        res = results[spec.name] = OpResult(spec.name)
        if spec.name not in TUNABLE:
            res.skipped = "no inputs to build (add the op to sglang_fl/tune.py build_case)"
            continue
        per_kind = pick_per_kind(manager, spec.name)
        if not per_kind:
            res.skipped = "no implementation registered here"
            continue
        reference = getattr(oracle, spec.name)
        mode = (dict.fromkeys(graph_mode, "eager") if spec.name in GDN_EXTEND_OPS else graph_mode)
        all_tokens = [t for name, _ in buckets for t in tokens[name]]
        cases = {}
        for t in all_tokens:
            # One case over every model that uses the op: its variants side by side, so the
            # gate covers each model's shapes and the time is their sum.
            built = [c for c in (build_case(spec.name, m, t, dtype, device) for m in models) if c]
            if not built:
                res.skipped = UNUSED[spec.name] if len(models) == 1 else (
                    f"none of the {len(models)} models uses it ({UNUSED[spec.name]})")
                break
            cases[t] = Case([v for c in built for v in c.variants], built[0].canon, built[0].inplace)
        if res.skipped:
            continue
        for kind, impl in per_kind.items():
            res.impls[kind] = impl.label
            why = kept = ""
            for t in all_tokens:
                broken, outside = accuracy_error(spec, impl.fn, reference, cases[t], dtype)
                if broken or (outside and kind != "reference"):
                    why = broken or outside
                    break
                # The reference in the served dtype against itself in fp32 measures that dtype's
                # rounding, not a defect: it stays the order's last fallback (H100 2026-12-06:
                # RoPE's at 2,048+ tokens, as SGLang's forward_native rounds).
                kept = kept or outside
            if why:
                res.excluded[impl.label] = why
                continue
            if kept:
                res.rounding[impl.label] = kept
            res.us[kind] = {}
            for t in all_tokens:
                if mode[t] == "graph" and impl.label in res.not_capturable:
                    continue
                try:
                    res.us[kind][t] = timers[mode[t]](impl.fn, cases[t], device, iters, warmup, repeats)
                except Exception as exc:  # noqa: BLE001 - reported, and left out of graph buckets
                    if mode[t] != "graph":
                        raise
                    res.not_capturable[impl.label] = _one_line(f"{type(exc).__name__}: {exc}")[:300]
                    _check_device_after_capture(device, spec.name, impl.label)
                    continue
                if progress:
                    progress(f"{spec.name:<18} {impl.label:<28} {t:>6} tokens: "
                             f"{res.us[kind][t]:10.2f} us ({mode[t]})")
        for name, _ in buckets:
            timed = {k: sum(v[t] for t in tokens[name]) for k, v in res.us.items()
                     if all(t in v for t in tokens[name])}
            res.orders[name] = sorted(timed, key=lambda k: (timed[k], KIND_ORDER.index(k)))
            if res.orders[name] == ["reference"] and _only_raised(res):
                # The faster kinds could not run this case, which shows nothing against them:
                # a reference-only order would make the slowest path the only one.
                res.orders[name] = []
    return TuneResult(tuple(buckets), tokens, models, str(dtype).removeprefix("torch."), str(device),
                      {"iters": iters, "warmup": warmup, "repeats": repeats}, results,
                      tuple(graph_buckets))


# ---------------------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------------------


def _version(pkg: str) -> str:
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return "not installed"


def device_name(device) -> str:
    import torch

    kind = torch.device(device).type
    mod = getattr(torch, kind, None)
    if kind != "cpu" and mod is not None and hasattr(mod, "get_device_name"):
        try:
            return f"{kind}: {mod.get_device_name()}"
        except Exception:  # noqa: BLE001 - a name is provenance, not a requirement
            pass
    return f"{kind}: {host.processor() or host.machine()}"


def to_yaml(result: TuneResult, now: datetime.datetime | None = None) -> str:
    import torch

    from sglang_fl.config.settings import format_buckets

    now = now or datetime.datetime.now(datetime.timezone.utc)
    st = result.settings
    lines = [
        "# Per-op, per-token-bucket backend order written by `sglang-fl tune`; load it with",
        "# SGLANG_FL_CONFIG=<this file> or paste it into a platform YAML (sglang_fl/config/<platform>.yaml).",
        f"# date: {now.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"# device: {device_name(result.device)}",
        f"# versions: torch {torch.__version__}, sglang {_version('sglang')}, flag_gems "
        f"{_version('flag_gems')}, triton {_version('triton')}, sglang-fl {_version('sglang_fl')}",
        *(f"# shapes: {m.describe()} (from {m.source})" for m in result.shapes),
        f"# dtype: {result.dtype}"
        + ("; an op's time is summed over the models that use it" if len(result.shapes) > 1 else ""),
        f"# buckets: {format_buckets(result.buckets)}; token counts timed: "
        + "; ".join(f"{n} {','.join(map(str, ts))}" for n, ts in result.tokens.items()),
        "# timing: us per call (an op's variants summed: rms_norm without and with residual),",
        f"#   median of {st['repeats']} repeats of {st['iters']} calls after {st['warmup']} warm-up calls"
        f" (of 1 call where a call takes over {SLOW_CALL_US / 1000:g} ms);",
        (f"#   under a CUDA graph in {', '.join(result.graph_buckets)} (the calls captured once, the "
         "replays timed: what graph decode pays), eager elsewhere;" if result.graph_buckets
         else "#   eager (launch and Python wrappers included);"),
        "#   a bucket's order is its kinds by their time summed over its token counts, fastest first.",
        *([f"# GDN decode ops ({', '.join(GDN_DECODE_OPS)}): one token per sequence, at most "
           f"{MAX_DECODE_SEQUENCES} sequences timed; GDN prefill ops ({', '.join(GDN_EXTEND_OPS)}): "
           f"sequences of at most {PREFILL_SEQUENCE} tokens, eager in every bucket (SGLang's "
           "decode graph never holds them)"]
          if any(m.linear_key_heads for m in result.shapes) else []),
        f"# accuracy gate: each impl against the fp32 reference, op table tolerance for {result.dtype}.",
    ]
    for r in result.ops.values():
        for label, why in r.excluded.items():
            lines.append(f"# EXCLUDED {r.op} {label}: {why}")  # one line (_one_line)
        for label, why in r.rounding.items():
            lines.append(f"# KEPT {r.op} {label}: {_one_line(why)} ({ROUNDING_NOTE})")
        for label, why in r.not_capturable.items():
            lines.append(f"# NOT CAPTURABLE {r.op} {label} (left out of "
                         f"{', '.join(result.graph_buckets)}): {why}")
    lines += _mixed_lines(result, "# ")
    for r in result.ops.values():
        if r.skipped:
            lines.append(f"# not tuned: {r.op}: {r.skipped}")
        elif not r.orders or not any(r.orders.values()):
            why = ("only the reference passed; the others raised (see EXCLUDED), which shows "
                   "nothing against them: the platform's order applies" if _only_raised(r)
                   else "no implementation could be captured in a graph bucket either"
                   if r.not_capturable else "every implementation failed the accuracy gate")
            lines.append(f"# not tuned: {r.op}: {why}")
    lines.append("token_buckets:")
    lines += [f"  {name}: {'null' if hi is None else hi}" for name, hi in result.buckets]
    lines.append("op_backends:")
    tuned = [r for r in result.ops.values() if not r.skipped and any(r.orders.values())]
    if not tuned:
        lines[-1] = "op_backends: {}"
    for r in tuned:
        orders = [r.orders[name] for name, _ in result.buckets]
        timings = {name: ", ".join(
            f"{k} " + "/".join(f"{r.us[k][t]:.1f}" for t in result.tokens[name]) for k in r.orders[name])
            for name, _ in result.buckets}
        if all(o == orders[0] for o in orders):
            lines.append(f"  {r.op}: [{', '.join(orders[0])}]")
            for name, _ in result.buckets:
                lines.append(f"    # {name} ({','.join(map(str, result.tokens[name]))} tokens) us: {timings[name]}")
            continue
        lines.append(f"  {r.op}:")
        for name, _ in result.buckets:
            if not r.orders[name]:  # an empty order does not load: the platform's order stays
                lines.append(f"    # {name}: no order written: nothing, or only the reference, passed "
                             "and could be timed (see above); the platform's order applies")
                continue
            lines.append(f"    {name}: [{', '.join(r.orders[name])}]"
                         f"  # us at {','.join(map(str, result.tokens[name]))} tokens: {timings[name]}")
    return "\n".join(lines) + "\n"


def _mixed_lines(result: TuneResult, prefix: str) -> list[str]:
    """One line per op and bucket whose fastest kind differs between the bucket's token counts,
    with the ``--buckets`` that would split the bucket where the fastest first changes."""
    lines = []
    for r in result.ops.values():
        for name, _ in result.buckets:
            fastest = r.fastest_by_tokens(result.tokens[name]) if r.orders.get(name) else {}
            if len(fastest) > 1:
                where = "; ".join(f"{k} at {','.join(map(str, ts))}" for k, ts in fastest.items())
                kind_at = {t: k for k, ts in fastest.items() for t in ts}
                counts = sorted(kind_at)
                bound = next(a for a, b in itertools.pairwise(counts) if kind_at[a] != kind_at[b])
                lines.append(f"{prefix}MIXED {r.op} {name}: the fastest differs by token count "
                             f"({where}); its order is by their summed time; to order each "
                             f"size apart, tune with --buckets "
                             f"'{split_bucket(result.buckets, name, bound)}'")
    return lines


def split_bucket(buckets, name: str, bound: int) -> str:
    """``buckets`` as a ``--buckets`` value, with bucket ``name`` ending at ``bound`` tokens and
    the rest of it a new bucket ``<name>_above_<bound>``."""
    parts = []
    for n, hi in buckets:
        if n == name:
            parts.append(f"{n}={bound}")
            n = f"{n}_above_{bound}"
        parts.append(n if hi is None else f"{n}={hi}")
    return ";".join(parts)


def report(result: TuneResult) -> str:
    """What the terminal shows after tuning: per op, the orders and the exclusions."""
    out = []
    for r in result.ops.values():
        if r.skipped:
            out.append(f"{r.op}: not tuned ({r.skipped})")
            continue
        orders = "; ".join(f"{b}: {'>'.join(o) or '-'}" for b, o in r.orders.items())
        out.append(f"{r.op}: {orders}")
        for label, why in r.excluded.items():
            out.append(f"  EXCLUDED {label}: {why}")
        for label, why in r.rounding.items():
            out.append(f"  KEPT {label}: {why} ({ROUNDING_NOTE})")
        for label, why in r.not_capturable.items():
            out.append(f"  NOT CAPTURABLE {label} (left out of {', '.join(result.graph_buckets)}): {why}")
    return "\n".join(out + _mixed_lines(result, ""))


__all__ = ["ModelShapes", "TuneError", "TuneResult", "assign_tokens", "build_case",
           "default_tokens", "to_yaml", "tune"]
