"""The MoE ops on the GPU: each non-reference backend (FlagGems ``flagos``, SGLang's own kernels
``vendor.cuda``) against the pure-PyTorch reference on the device, on the routings and shapes
MoE models use (Qwen3-30B-A3B, Mixtral-8x7B, DeepSeek-V2-Lite/V3, an odd expert count), tokens
0..8192, bf16/fp16.

Backends are instantiated directly, so a test can only pass on the backend it names. The ops
read only ``obj.w13_weight`` / ``obj.w2_weight`` (the op table's layer attributes), so the
expert weights sit on a small holder: a real FusedMoE needs SGLang's parallel groups, and is
covered on CPU (tests/integration/test_moe_numerics.py) and served end to end
(tests/e2e/test_gpu_empty_mode.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device (none here; CI has none) -- see docs/air-gapped-install.md",
                allow_module_level=True)

from gpu_support import DTYPES, grid, sglang_ready, skip_unless_implemented  # noqa: E402

from sglang_fl.dispatch.ops import op_spec  # noqa: E402

pytestmark = pytest.mark.gpu

TOKENS = (0, 1, 7, 128, 1024, 8192)
# scoring, correction bias, grouped
ROUTINGS = {
    "softmax": ("softmax", False, False),
    "sigmoid": ("sigmoid", False, False),
    "sigmoid+bias": ("sigmoid", True, False),
    "softmax+bias": ("softmax", True, False),
    "grouped-softmax": ("softmax", False, True),
    "grouped-sigmoid+bias": ("sigmoid", True, True),
}
# (experts, top_k, groups, topk_group): odd, Mixtral, DeepSeek-V2-Lite, Qwen3-30B-A3B, DeepSeek-V3
ROUTING_SHAPES = [(9, 2, 3, 2), (8, 2, 2, 1), (64, 6, 8, 4), (128, 8, 8, 4), (256, 8, 8, 4)]
# (experts, top_k, hidden, intermediate): odd, Mixtral-8x7B, DeepSeek-V2-Lite, Qwen3-30B-A3B
MOE_SHAPES = [(9, 2, 512, 256), (8, 2, 4096, 14336), (64, 6, 2048, 1408), (128, 8, 2048, 768)]


class ExpertWeights:
    """What the ``fused_moe`` op reads of its layer."""

    def __init__(self, w13, w2):
        self.w13_weight, self.w2_weight = w13, w2


def _gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def _logits(tokens, experts, dtype, seed):
    """Experts well apart in every row (a shuffled ramp plus small noise): no near-ties."""
    ramp = torch.linspace(-3, 3, experts, device="cuda")
    keys = torch.rand(tokens, experts, device="cuda", generator=_gen(seed))
    base = ramp[keys.argsort(dim=-1)]
    noise = 0.002 * torch.randn(tokens, experts, device="cuda", generator=_gen(seed + 1))
    return (base + noise).to(dtype)


def _canonical(weights, ids):
    ids, order = ids.long().sort(-1)
    return weights.gather(1, order), ids


def _routing_margin(logits, top_k, scoring, bias, groups, topk_group):
    """Per row, the float64 gap at the k-th expert (and at the topk_group-th group): a row
    with a near-tie may route either way in fp32."""
    s = logits.double()
    scores = s.softmax(-1) if scoring == "softmax" else s.sigmoid()
    choice = scores + (bias.double() if bias is not None else 0)
    t, e = choice.shape
    margin = torch.full((t,), float("inf"), dtype=torch.float64, device="cuda")
    if groups:
        per_group = choice.view(t, groups, e // groups).sort(-1, descending=True).values
        group_score = per_group[..., 0] if bias is None else per_group[..., :2].sum(-1)
        order = group_score.sort(-1, descending=True)
        if topk_group < groups:
            margin = order.values[:, topk_group - 1] - order.values[:, topk_group]
        allowed = torch.zeros(t, groups, dtype=torch.bool, device="cuda")
        allowed.scatter_(1, order.indices[:, :topk_group], True)
        choice = choice.masked_fill(~allowed.repeat_interleave(e // groups, 1), float("-inf"))
    ordered = choice.sort(-1, descending=True).values
    if top_k < e:  # inf where the next expert lies outside the allowed groups
        margin = torch.minimum(margin, ordered[:, top_k - 1] - ordered[:, top_k])
    return margin


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", grid(TOKENS, (0, 1, 1024)))
@pytest.mark.parametrize("shape", grid(ROUTING_SHAPES, ROUTING_SHAPES[::2]),
                         ids=lambda c: f"E{c[0]}-k{c[1]}")
@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_topk(backend, reference, routing, renormalize, shape, tokens, dtype):
    skip_unless_implemented(backend, "topk")
    scoring, with_bias, grouped = ROUTINGS[routing]
    experts, top_k, groups, topk_group = shape
    logits = _logits(tokens, experts, dtype, seed=tokens + experts)
    bias = 0.05 * torch.randn(experts, device="cuda", generator=_gen(1)) if with_bias else None
    args = (top_k, renormalize, scoring, bias, groups if grouped else None,
            topk_group if grouped else None)
    hidden = torch.zeros(tokens, 64, device="cuda", dtype=dtype)
    weights, ids = backend.topk(None, hidden, logits, *args)
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int32)
    assert weights.shape == ids.shape == (tokens, top_k)
    want_w, want_ids = reference.topk(None, hidden, logits, *args)
    clear = _routing_margin(logits, top_k, scoring, bias, groups if grouped else 0,
                            topk_group) > 1e-5
    # fp16 logits are coarse: a sum of two biased sigmoid scores may tie another group's
    # (seen on the H200: 2 rows of 128). Rows with a near-tie are left out below.
    assert int((~clear).sum()) <= max(2, tokens // 50), "test data with many near-ties"
    got_w, got_ids = _canonical(weights[clear], ids[clear])
    want_w, want_ids = _canonical(want_w[clear], want_ids[clear])
    assert torch.equal(got_ids, want_ids), f"{routing}: expert ids differ"
    torch.testing.assert_close(got_w, want_w, **op_spec("topk").tolerance.for_dtype(dtype))


def _experts(experts, hidden, inter, dtype, seed):
    """Weights scaled so that outputs are O(0.3): the op table's tolerances are relative to it."""
    w13 = torch.randn(experts, 2 * inter, hidden, device="cuda", generator=_gen(seed)) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, device="cuda", generator=_gen(seed + 1)) / inter ** 0.5
    return w13.to(dtype), w2.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", grid(TOKENS, (0, 1, 7, 1024)))
@pytest.mark.parametrize("shape", grid(MOE_SHAPES, (MOE_SHAPES[0], MOE_SHAPES[3])), ids=lambda s: f"E{s[0]}-k{s[1]}-h{s[2]}-i{s[3]}")
@pytest.mark.parametrize("foreign", [False, True], ids=["local", "ep-ids"])
def test_fused_moe(backend, reference, shape, tokens, dtype, foreign):
    """Against the reference's arithmetic in fp32 (the oracle), as test_ops.py does for RoPE:
    the reference in bf16 rounds each expert's intermediate as the kernels do, but not at the
    same points. ``ep-ids``: a quarter of the slots hold -1 (an expert of another rank)."""
    skip_unless_implemented(backend, "fused_moe")
    sglang_ready()
    experts, top_k, hidden, inter = shape
    w13, w2 = _experts(experts, hidden, inter, dtype, seed=experts)
    x = torch.randn(tokens, hidden, device="cuda", generator=_gen(tokens)).to(dtype)
    weights, ids = reference.topk(None, x, _logits(tokens, experts, torch.float32, seed=3), top_k)
    if foreign:
        drop = torch.rand(ids.shape, device="cuda", generator=_gen(5)) < 0.25
        ids = ids.masked_fill(drop, -1)
    before = x.clone()
    got = backend.fused_moe(ExpertWeights(w13, w2), x, weights, ids)
    torch.cuda.synchronize()
    assert torch.equal(x, before), "fused_moe must not modify hidden_states"
    assert got.dtype == dtype and got.shape == (tokens, hidden)
    want = reference.fused_moe(ExpertWeights(w13.float(), w2.float()), x.float(), weights, ids)
    torch.testing.assert_close(got.float(), want, **op_spec("fused_moe").tolerance.for_dtype(dtype))


@pytest.mark.parametrize("tokens", (1, 7, 1024))
def test_fused_moe_without_expert_parallelism_is_exact_on_the_unfiltered_kernels(
        backend, reference, tokens):
    """A FusedMoE layer that holds every expert says so (its ``moe_runner_config``); vendor.cuda
    then runs SGLang's unfiltered kernels, as SGLang's own runner does there."""
    from types import SimpleNamespace

    skip_unless_implemented(backend, "fused_moe")
    sglang_ready()
    dtype = torch.bfloat16
    experts, top_k, hidden, inter = MOE_SHAPES[3]
    w13, w2 = _experts(experts, hidden, inter, dtype, seed=experts)
    layer = ExpertWeights(w13, w2)
    layer.moe_runner_config = SimpleNamespace(num_experts=experts, num_local_experts=experts)
    x = torch.randn(tokens, hidden, device="cuda", generator=_gen(tokens)).to(dtype)
    weights, ids = reference.topk(None, x, _logits(tokens, experts, torch.float32, seed=3), top_k)
    got = backend.fused_moe(layer, x, weights, ids)
    want = reference.fused_moe(ExpertWeights(w13.float(), w2.float()), x.float(), weights, ids)
    torch.testing.assert_close(got.float(), want, **op_spec("fused_moe").tolerance.for_dtype(dtype))


def test_strict_selection_resolves_the_moe_ops_to_flagos(monkeypatch):
    """Through the manager: pinned + strict resolves both MoE ops to FlagGems, no fallback."""
    from sglang_fl.config import reset_settings
    from sglang_fl.dispatch import reset_manager, resolve_op

    monkeypatch.setenv("SGLANG_FL_PER_OP", "topk=flagos;fused_moe=flagos")
    monkeypatch.setenv("SGLANG_FL_STRICT", "1")
    reset_settings()
    reset_manager()
    try:
        for op in ("topk", "fused_moe"):
            resolved = resolve_op(op)
            assert [c.impl_id for c in resolved.candidates] == ["flagos"], op
            assert resolved.strict
    finally:
        monkeypatch.undo()
        reset_settings()
        reset_manager()
