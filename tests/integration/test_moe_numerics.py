"""The MoE ops (``topk``, ``fused_moe``): the reference backend against an fp32 oracle written
here independently of it (every expert computed densely, groups ranked by sorting), across
expert counts (odd ones too), top-k 1/2/4/8, token counts 0/1/odd/large, renormalize on and
off and bf16/fp16/fp32 inputs; then through real SGLang ``TopK`` and ``FusedMoE`` layers with
the plugin's hook, against SGLang's own CPU forward; then the adapters of the backends whose
kernels cannot run here (FlagGems, sgl_kernel) on small test doubles of those kernels.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_fl.dispatch.ops import op_spec

pytestmark = pytest.mark.integration

# (experts, top_k, groups, topk_group): odd expert counts, Qwen1.5/2-MoE (60 experts, top-4),
# Qwen3-30B-A3B (128, top-8), and top-k = experts - 1.
EXPERTS = [(9, 1, 3, 2), (9, 2, 3, 2), (9, 8, 3, 3), (60, 4, 4, 2), (128, 8, 8, 4)]
TOKENS = [0, 1, 7, 2049]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# scoring, correction bias, grouped
ROUTINGS = {
    "softmax": ("softmax", False, False),  # Qwen-MoE, Mixtral
    "sigmoid": ("sigmoid", False, False),
    "sigmoid+bias": ("sigmoid", True, False),
    "softmax+bias": ("softmax", True, False),
    "grouped-softmax": ("softmax", False, True),  # DeepSeek-V2
    "grouped-sigmoid+bias": ("sigmoid", True, True),  # DeepSeek-V3, Kimi-K2, GLM-4.5
}


def _logits(tokens, experts, dtype, seed):
    """Router logits whose experts are well apart in every row (a shuffled ramp plus small
    noise), so the top-k is the same in fp32 and after rounding to bf16."""
    g = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(-3, 3, experts)
    rows = [ramp[torch.randperm(experts, generator=g)] for _ in range(tokens)]
    base = torch.stack(rows) if rows else torch.empty(0, experts)
    return (base + 0.002 * torch.randn(base.shape, generator=g)).to(dtype)


def oracle_topk(logits, top_k, renormalize, scoring, bias, groups, topk_group):
    """Routing in float64, and per row the smallest margin at a decision (k-th vs next expert,
    topk_group-th vs next group): a row with a near-tie may route either way in fp32."""
    s = logits.double()
    scores = s.softmax(-1) if scoring == "softmax" else s.sigmoid()
    choice = scores + (bias.double() if bias is not None else 0)
    t, e = choice.shape
    margin = torch.full((t,), float("inf"), dtype=torch.float64)
    if groups:
        per_group = choice.view(t, groups, e // groups).sort(-1, descending=True).values
        group_score = per_group[..., 0] if bias is None else per_group[..., :2].sum(-1)
        order = group_score.sort(-1, descending=True)
        if topk_group < groups:
            margin = order.values[:, topk_group - 1] - order.values[:, topk_group]
        allowed = torch.zeros(t, groups, dtype=torch.bool)
        allowed.scatter_(1, order.indices[:, :topk_group], True)
        choice = torch.where(allowed.repeat_interleave(e // groups, 1), choice,
                             torch.tensor(float("-inf"), dtype=choice.dtype))
    order = choice.sort(-1, descending=True)
    if top_k < e:  # inf where the next expert lies outside the allowed groups
        margin = torch.minimum(margin, order.values[:, top_k - 1] - order.values[:, top_k])
    ids = order.indices[:, :top_k]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids, margin


def _canonical(weights, ids):
    """Rows sorted by expert id: the op leaves the order of the k choices free."""
    ids, order = ids.long().sort(-1)
    return weights.gather(1, order), ids


def oracle_moe(x, w13, w2, weights, ids):
    """fp32, from the (already rounded) inputs: every expert over every token, masked."""
    x, w13, w2, weights = x.float(), w13.float(), w2.float(), weights.float()
    out = torch.zeros(x.shape[0], w2.shape[1])
    for e in range(w13.shape[0]):
        gate, up = (x @ w13[e].t()).chunk(2, dim=-1)
        y = (F.silu(gate) * up) @ w2[e].t()
        out += (weights * (ids == e)).sum(-1, keepdim=True) * y
    return out


class _Layer:
    """A test double of the layer for the ops' ``obj`` (the reference reads only the
    attributes the op table lists); the real layers are tested further down."""

    def __init__(self, w13=None, w2=None):
        self.w13_weight, self.w2_weight = w13, w2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("experts", EXPERTS, ids=lambda c: f"E{c[0]}-k{c[1]}")
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_topk_matches_fp64_oracle(routing, experts, tokens, renormalize, dtype):
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    scoring, with_bias, grouped = ROUTINGS[routing]
    num_experts, top_k, groups, topk_group = experts
    logits = _logits(tokens, num_experts, dtype, seed=tokens + num_experts)
    bias = (0.05 * torch.randn(num_experts, generator=torch.Generator().manual_seed(1))
            if with_bias else None)
    kwargs = dict(top_k=top_k, renormalize=renormalize, scoring_func=scoring, correction_bias=bias,
                  num_expert_group=groups if grouped else None,
                  topk_group=topk_group if grouped else None)
    hidden = torch.zeros(tokens, 16, dtype=dtype)
    weights, ids = ReferenceBackend().topk(_Layer(), hidden, logits, **kwargs)
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int32)
    assert weights.shape == ids.shape == (tokens, top_k)
    want_w, want_ids, margin = oracle_topk(logits, top_k, renormalize, scoring, bias,
                                           groups if grouped else 0, topk_group)
    clear = margin > 1e-5  # rows without a near-tie (fp32 rounding decides those)
    assert int((~clear).sum()) <= max(1, tokens // 100), "test data with many near-ties"
    got_w, got_ids = _canonical(weights[clear], ids[clear])
    want_w, want_ids = _canonical(want_w[clear], want_ids[clear])
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w.float(), **op_spec("topk").tolerance.for_dtype(dtype))


def _experts(num_experts, hidden, inter, dtype, seed):
    """Weights scaled so that outputs are O(0.3): tolerances are relative to that."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) / inter ** 0.5
    return w13.to(dtype), w2.to(dtype)


# (experts, top_k, hidden, intermediate): tiny odd, Mixtral-like top-2, Qwen3-30B-A3B routing.
MOE_SHAPES = [(9, 1, 64, 32), (9, 2, 64, 32), (9, 8, 96, 48), (128, 8, 128, 64)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [0, 1, 7, 513])
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: f"E{s[0]}-k{s[1]}-h{s[2]}-i{s[3]}")
@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
def test_fused_moe_matches_fp32_oracle(shape, tokens, dtype, renormalize):
    """Routed weights that sum to one (renormalised top-k) and that do not."""
    from sglang_fl.dispatch.backends.reference import ReferenceBackend, select_experts

    num_experts, top_k, hidden, inter = shape
    w13, w2 = _experts(num_experts, hidden, inter, dtype, seed=num_experts + top_k)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    weights, ids = select_experts(_logits(tokens, num_experts, torch.float32, seed=3), top_k,
                                  renormalize=renormalize)
    before = x.clone()
    out = ReferenceBackend().fused_moe(_Layer(w13, w2), x, weights, ids)
    assert torch.equal(x, before), "fused_moe must not modify hidden_states"
    assert out.dtype == dtype and out.shape == (tokens, hidden)
    torch.testing.assert_close(out.float(), oracle_moe(x, w13, w2, weights, ids),
                               **op_spec("fused_moe").tolerance.for_dtype(dtype))


def test_fused_moe_ids_of_other_expert_parallel_ranks_add_nothing():
    """With expert parallelism SGLang maps the experts of other ranks to id -1."""
    from sglang_fl.dispatch.backends.reference import ReferenceBackend

    w13, w2 = _experts(9, 64, 32, torch.float32, seed=0)
    x = torch.randn(5, 64)
    ids = torch.tensor([[0, -1], [-1, -1], [8, 3], [-1, 4], [2, 3]], dtype=torch.int32)
    weights = torch.rand(5, 2)
    out = ReferenceBackend().fused_moe(_Layer(w13, w2), x, weights, ids)
    torch.testing.assert_close(out, oracle_moe(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)
    assert torch.equal(out[1], torch.zeros(64))


# -- real SGLang layers through the plugin's hook (reference backend, strict) -------------------


@pytest.mark.parametrize("renormalize", [True, False], ids=["renorm", "raw"])
@pytest.mark.parametrize(("scoring", "with_bias"),
                         [("softmax", False), ("sigmoid", False), ("sigmoid", True)])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_topk_layer_matches_sglang_forward_native(sglang_with_plugin, scoring, with_bias,
                                                  renormalize, tokens):
    """Ungrouped routing (SGLang's grouped forward_native is torch.compiled, too slow here;
    the oracle test above covers grouped routing)."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput, TopK

    bias = 0.05 * torch.randn(128) if with_bias else None
    layer = TopK(top_k=8, renormalize=renormalize, scoring_func=scoring, correction_bias=bias,
                 layer_id=0)
    logits = _logits(tokens, 128, torch.float32, seed=tokens)
    x = torch.randn(tokens, 64)
    got = layer(x, logits)
    assert isinstance(got, StandardTopKOutput) and got.router_logits is logits
    assert layer._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"
    want = layer.forward_native(x, logits)
    got_w, got_ids = _canonical(got.topk_weights, got.topk_ids)
    want_w, want_ids = _canonical(want.topk_weights, want.topk_ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w.float(), atol=1e-6, rtol=1e-6)
    if not with_bias:  # same operations, same order as fused_topk_torch_native
        assert torch.equal(got.topk_weights, want.topk_weights)


def test_topk_layer_with_fused_shared_experts_keeps_sglang_forward(sglang_with_plugin):
    from sglang.srt.layers.moe.topk import TopK

    layer = TopK(top_k=3, renormalize=True, num_fused_shared_experts=1, layer_id=0)
    logits = _logits(4, 9, torch.float32, seed=0)
    layer(torch.randn(4, 8), logits)
    assert getattr(layer._forward_method, "__self__", None) is layer  # SGLang's own method


@pytest.fixture(scope="module")
def one_rank_parallel_state(sglang_with_plugin):
    """SGLang's parallel groups for one CPU rank (gloo): FusedMoE reads its EP/TP sizes."""
    from sglang.srt.distributed import parallel_state as ps

    from sglang_fl.serving import free_port

    ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                    distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    ps.initialize_model_parallel(tensor_model_parallel_size=1)
    yield ps
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_fused_moe_layer_matches_sglang_forward_native(one_rank_parallel_state, tmp_path,
                                                       tokens, dtype):
    """A real FusedMoE (Qwen3-MoE routing: 128 experts, top-8): its unquantized method is
    routed through ``fused_moe`` and agrees with SGLang's own CPU path (moe_forward_native)."""
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.moe.topk import TopK

    layer = FusedMoE(num_experts=128, hidden_size=64, intermediate_size=32, layer_id=0, top_k=8,
                     params_dtype=dtype)
    w13, w2 = _experts(128, 64, 32, dtype, seed=tokens)
    layer.w13_weight.data.copy_(w13)
    layer.w2_weight.data.copy_(w2)
    assert type(layer.quant_method).__name__ == "UnquantizedFusedMoEMethod"
    topk = TopK(top_k=8, renormalize=True, layer_id=0)
    x = torch.randn(tokens, 64).to(dtype)
    routing = topk(x, _logits(tokens, 128, torch.float32, seed=tokens))
    got = layer(x.clone(), routing)
    assert layer.quant_method._forward_method.__module__ == "sglang_fl.sglang_glue.bridges"
    want = moe_forward_native(layer, x.clone(), routing, layer.moe_runner_config)
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, atol=0, rtol=0)  # same per-expert math, same sums


# -- adapters of kernel backends, on test doubles of their kernels -----------------------------


class _FlagGemsMoE:
    """Test double of FlagGems 5.0.2's MoE kernels, with their documented semantics:
    ``topk_softmax`` fills its outputs in place; ``grouped_topk`` (scoring_func 0: scores as
    given, 1: sigmoid) always ranks a group by the sum of its two best biased scores and
    returns fp32 weights, int32 ids; ``fused_experts_impl`` cannot skip an id."""

    calls: list[str] = []

    @classmethod
    def topk_softmax(cls, weights, ids, rows, logits, renormalize):
        cls.calls.append("topk_softmax")
        w, i, _ = oracle_topk(logits, weights.shape[1], renormalize, "softmax", None, 0, 0)
        weights.copy_(w)
        ids.copy_(i)

    @classmethod
    def grouped_topk(cls, scores, n_group, topk_group, topk, renormalize, scale, bias, scoring):
        cls.calls.append(f"grouped_topk(scoring={scoring}, groups={n_group})")
        s = scores.double().sigmoid() if scoring == 1 else scores.double()
        t, e = s.shape
        choice = s + bias.double()
        pair = choice.view(t, n_group, e // n_group).topk(min(2, e // n_group), -1).values.sum(-1)
        keep = torch.zeros(t, n_group, dtype=torch.bool).scatter_(
            1, pair.topk(topk_group, -1).indices, True).repeat_interleave(e // n_group, 1)
        ids = choice.masked_fill(~keep, float("-inf")).topk(topk, -1).indices
        w = s.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) if renormalize else w
        return (w * scale).float(), ids.int()

    @classmethod
    def fused_experts_impl(cls, x, w1, w2, topk_weights, topk_ids, inplace, activation):
        cls.calls.append("fused_experts_impl")
        assert not inplace and activation == "silu" and x.is_contiguous()
        assert bool(((topk_ids >= 0) & (topk_ids < w1.shape[0])).all()), "an id it cannot take"
        return oracle_moe(x, w1, w2, topk_weights, topk_ids).to(x.dtype)


class _SglKernelMoE:
    """Test double of sgl_kernel's ``topk_softmax`` (as SGLang 0.5.11 calls it) and
    ``topk_sigmoid``; both fill their outputs in place."""

    calls: list[str] = []

    @classmethod
    def topk_softmax(cls, weights, ids, logits, renormalize):
        cls.calls.append("topk_softmax")
        w, i, _ = oracle_topk(logits, weights.shape[1], renormalize, "softmax", None, 0, 0)
        weights.copy_(w)
        ids.copy_(i)

    @classmethod
    def topk_sigmoid(cls, weights, ids, logits, renormalize, bias):
        cls.calls.append("topk_sigmoid")
        w, i, _ = oracle_topk(logits, weights.shape[1], renormalize, "sigmoid", bias, 0, 0)
        weights.copy_(w)
        ids.copy_(i)


@pytest.mark.parametrize("top_k", [8, 6])
@pytest.mark.parametrize("impl_id", ["flagos", "vendor.cuda"])
@pytest.mark.parametrize("routing", list(ROUTINGS))
def test_kernel_backends_topk_adapters(impl_id, routing, top_k):
    """Each routing reaches the kernel that computes it with the right arguments (or the
    reference math on the device where the kernel's semantics differ), with the oracle's
    result. top_k 6: FlagGems' grouped_topk compiles only for a power of two, so every routing
    but plain softmax takes the reference math, which must still apply the bias (an H200 run
    of 2026-12-01 caught it dropped)."""
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
    from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend

    if impl_id == "flagos":
        backend, double = FlagGemsBackend(), _FlagGemsMoE
        backend._gems = double
    else:
        backend, double = CudaBackend(), _SglKernelMoE
        backend._sk = double
    double.calls = []
    scoring, with_bias, grouped = ROUTINGS[routing]
    logits = _logits(33, 128, torch.bfloat16, seed=5)
    bias = 0.05 * torch.randn(128, generator=torch.Generator().manual_seed(2)) if with_bias else None
    weights, ids = backend.topk(_Layer(), torch.zeros(33, 8), logits, top_k, True, scoring, bias,
                                8 if grouped else None, 4 if grouped else None)
    want_w, want_ids, _ = oracle_topk(logits, top_k, True, scoring, bias, 8 if grouped else 0, 4)
    got_w, got_ids = _canonical(weights, ids)
    want_w, want_ids = _canonical(want_w, want_ids)
    assert torch.equal(got_ids, want_ids), double.calls
    torch.testing.assert_close(got_w, want_w.float(), atol=1e-5, rtol=1e-5)
    expected = {
        ("flagos", "softmax"): ["topk_softmax"],
        ("flagos", "sigmoid"): ["grouped_topk(scoring=1, groups=1)"],
        ("flagos", "sigmoid+bias"): ["grouped_topk(scoring=1, groups=1)"],
        ("flagos", "softmax+bias"): ["grouped_topk(scoring=0, groups=1)"],
        ("flagos", "grouped-softmax"): [],  # group scores differ from grouped_topk's: reference
        ("flagos", "grouped-sigmoid+bias"): ["grouped_topk(scoring=1, groups=8)"],
        ("vendor.cuda", "softmax"): ["topk_softmax"],
        ("vendor.cuda", "sigmoid"): ["topk_sigmoid"],
        ("vendor.cuda", "sigmoid+bias"): ["topk_sigmoid"],
    }
    if impl_id == "flagos" and top_k == 6 and routing != "softmax":
        expected = {}
    assert double.calls == expected.get((impl_id, routing), [])


def test_flagos_fused_moe_turns_foreign_ids_into_zero_weight_slots():
    from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend

    backend = FlagGemsBackend()
    backend._gems = _FlagGemsMoE
    w13, w2 = _experts(9, 64, 32, torch.float32, seed=0)
    x = torch.randn(4, 64)
    ids = torch.tensor([[0, -1], [-1, -1], [8, 3], [-1, 4]], dtype=torch.int32)
    weights = torch.rand(4, 2)
    out = backend.fused_moe(_Layer(w13, w2), x, weights, ids)
    torch.testing.assert_close(out, oracle_moe(x, w13, w2, weights, ids), atol=1e-5, rtol=1e-5)
    assert backend.fused_moe(_Layer(w13, w2), x[:0], weights[:0], ids[:0]).shape == (0, 64)
