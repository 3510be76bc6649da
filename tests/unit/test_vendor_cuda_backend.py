"""The vendor.cuda backend calls SGLang's kernels as SGLang does, without per-call overhead:
``fused_moe`` filters the -1 ids of other expert-parallel ranks' experts only where the layer
has them, and each kernel is resolved once."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from sglang_fl.dispatch.backends.vendor.cuda import backend as cuda_backend  # noqa: E402


def _layer(num_experts, num_local_experts):
    cfg = None if num_experts == "absent" else SimpleNamespace(
        num_experts=num_experts, num_local_experts=num_local_experts)
    layer = SimpleNamespace(w13_weight=torch.zeros(1), w2_weight=torch.zeros(1))
    if cfg is not None:
        layer.moe_runner_config = cfg
    return layer


@pytest.mark.parametrize(("experts", "local", "filtered"), [
    (256, 256, False),      # one rank holds every expert: SGLang runs the unfiltered kernels
    (256, 64, True),        # expert parallel, 4 ranks: other ranks' experts come as -1
    (None, 256, True),      # SGLang's own rule: an unknown expert count is filtered
    ("absent", None, True),  # a layer without a runner config: filtering is always correct
])
def test_fused_moe_filters_experts_only_under_expert_parallelism(monkeypatch, experts, local,
                                                                 filtered):
    calls = []

    def fake_experts(hidden, w13, w2, weights, ids, filter_expert):
        calls.append(filter_expert)
        return hidden

    monkeypatch.setattr(cuda_backend, "_sglang_kernel", lambda name: fake_experts)
    hidden = torch.ones(2, 4)
    out = cuda_backend.CudaBackend().fused_moe(_layer(experts, local), hidden,
                                               torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.int32))
    assert out is hidden
    assert calls == [filtered]


def test_real_fused_moe_layers_say_their_expert_counts():
    """The attribute path read above is the one SGLang's FusedMoE layer has."""
    layer_mod = pytest.importorskip("sglang.srt.layers.moe.fused_moe_triton.layer")
    import inspect

    src = inspect.getsource(layer_mod.FusedMoE.__init__)
    assert "self.moe_runner_config = MoeRunnerConfig(" in src
    runner = pytest.importorskip("sglang.srt.layers.moe.moe_runner")
    fields = set(inspect.signature(runner.MoeRunnerConfig).parameters)
    assert {"num_experts", "num_local_experts"} <= fields


def test_sglangs_kernels_are_resolved_once_per_backend_not_per_call(monkeypatch):
    """Resolving a kernel's dotted path costs microseconds: an eager prefill would pay it per
    layer and op. The backend resolves each kernel on first use and keeps it."""
    resolved = []

    def resolve(name):
        resolved.append(name)
        return lambda hidden, *args, **kwargs: hidden

    monkeypatch.setattr(cuda_backend, "_sglang_kernel", resolve)
    backend = cuda_backend.CudaBackend()
    layer = _layer(8, 8)
    hidden = torch.ones(2, 4)
    for _ in range(3):
        backend.fused_moe(layer, hidden, torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.int32))
    assert resolved == ["outplace_fused_experts"]
