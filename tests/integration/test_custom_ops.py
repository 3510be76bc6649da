"""Routed ops as torch custom ops (``custom_ops: true``): every op's schema and fake kernel
checked by ``torch.library.opcheck`` on real inputs, fake tensors giving the real shapes, and a
block of real SGLang layers routed through the plugin compiling with ``fullgraph=True`` (no graph
break) to the same outputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sglang_fl.config import build_settings
from sglang_fl.dispatch import custom_ops
from sglang_fl.dispatch.backends.reference import ReferenceBackend
from sglang_fl.dispatch.manager import OpManager
from sglang_fl.dispatch.ops import OPS_BY_NAME
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.tune import TUNABLE, ModelShapes, build_case

pytestmark = pytest.mark.integration

SHAPES = ModelShapes(hidden=64, intermediate=96, heads=4, kv_heads=2, head_dim=16, max_positions=256,
                     experts=8, top_k=2, moe_intermediate=32, mrope_section=(2, 3, 3),
                     linear_key_heads=2, linear_value_heads=4, linear_key_dim=16,
                     linear_value_dim=16, conv_kernel=4)
#: A model has plain RoPE or mRoPE, not both: tune builds a case only for the one it uses.
PLAIN_ROPE_SHAPES = dataclasses.replace(SHAPES, mrope_section=None)


def case_for(op_name, tokens, dtype):
    return build_case(op_name, PLAIN_ROPE_SHAPES if op_name == "rotary_embedding" else SHAPES,
                      tokens, dtype, "cpu")


#: The ops a layer bridge calls (so through ``torch.ops.sglang_fl`` with ``custom_ops``); the
#: other GDN ops are reached as SGLang's ``sgl_kernel`` names, which are torch ops already.
LAYER_OPS = tuple(op for op in TUNABLE if OPS_BY_NAME[op].serves)


def reference_manager(env=None):
    """The reference backend, and its rms_norm kernel once more as a vendor impl (so that
    token buckets can have different candidates)."""
    from sglang_fl.dispatch.types import OpImpl

    settings = build_settings(env={"SGLANG_FL_PREFER": "reference", **(env or {})},
                              detect_platform=lambda: "cpu")
    registry = OpRegistry()
    registry.register_many(ReferenceBackend().op_impls())
    ref = next(i.fn for i in registry.impls("rms_norm"))
    registry.register(OpImpl("rms_norm", "vendor.bench", "vendor", ref, vendor="bench"))
    return settings, OpManager(registry, SelectionPolicy.from_settings(settings))


def keyed_op(op_name, layer):
    """``torch.ops.sglang_fl.<op>`` and a key that routes it to the reference on ``layer``."""
    from sglang_fl.sglang_glue.bridges import ImplSlot

    _, manager = reference_manager()
    resolved = manager.resolve(op_name)
    op = custom_ops.define(OPS_BY_NAME[op_name], resolved.impl.fn)
    return op, custom_ops.register(layer, ImplSlot(resolved, "Test", None))


def _outs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


@pytest.mark.parametrize("op_name", LAYER_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_each_op_passes_opcheck_and_matches_its_impl(sglang_with_plugin, op_name, dtype):
    case = case_for(op_name, 5, dtype)
    reference = getattr(ReferenceBackend(), op_name)
    for layer, args in case.variants:
        op, key = keyed_op(op_name, layer)
        clones = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        got = op(key, *clones)
        want = _outs(reference(layer, *[a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
        for a, c in zip(args, clones, strict=True):  # functional: the inputs are left as they were
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(c, a, rtol=0, atol=0)
        torch.library.opcheck(op, (key, *[a.clone() if isinstance(a, torch.Tensor) else a for a in args]))


@pytest.mark.parametrize("op_name", LAYER_OPS)
def test_fake_tensors_give_the_real_shapes_and_dtypes(sglang_with_plugin, op_name):
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = case_for(op_name, 7, torch.bfloat16)
    for layer, args in case.variants:
        op, key = keyed_op(op_name, layer)
        real = op(key, *[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(key, *fake_args)
        assert [(f.shape, f.dtype) for f in fake] == [(r.shape, r.dtype) for r in real]
        assert all(type(f).__name__ == "FakeTensor" for f in fake)


def routed_block(env):
    """RMSNorm (with and without residual), SiluAndMul and RoPE, bound by the plugin's router
    under ``env``; and the same block on SGLang's forward_native."""
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import get_rope

    from sglang_fl.sglang_glue.adapters import get_adapter
    from sglang_fl.sglang_glue.layer_hook import LayerRouter

    settings, manager = reference_manager(env)
    router = LayerRouter(settings, manager)
    torch.manual_seed(0)
    norm, act = RMSNorm(64), SiluAndMul()
    norm.weight.data.normal_(1.0, 0.1)
    rope = get_rope(16, 16, 256, 10000, True, dtype=torch.float32)
    for layer in (norm, act, rope):
        layer._forward_method = router.bind(layer, get_adapter().sglang_forward_choice(layer))

    class Block(torch.nn.Module):
        def __init__(self, native=False):
            super().__init__()
            self.native = native
            self.norm, self.act, self.rope = norm, act, rope

        def forward(self, positions, x, residual):
            call = (lambda m, *a: m.forward_native(*a)) if self.native else (lambda m, *a: m(*a))
            h, residual = call(self.norm, x, residual)
            q, k = call(self.rope, positions, h[:, :64], h[:, :32])
            g = call(self.act, torch.cat([q, k, k], dim=-1))
            return call(self.norm, g[:, :64]), residual

    return Block(), Block(native=True), settings


def inputs(tokens):
    g = torch.Generator().manual_seed(tokens)
    return (torch.randint(0, 256, (tokens,), generator=g), torch.randn(tokens, 64, generator=g),
            torch.randn(tokens, 64, generator=g))


@pytest.mark.parametrize("env", [
    {"SGLANG_FL_CUSTOM_OPS": "1"},
    # token buckets inside the op: the size decision is taken when the op runs, not traced
    {"SGLANG_FL_CUSTOM_OPS": "1", "SGLANG_FL_TOKEN_BUCKETS": "decode=4;prefill",
     "SGLANG_FL_PER_OP": "rms_norm@decode=vendor;rms_norm@prefill=reference"},
], ids=["plain", "buckets"])
def test_routed_layers_compile_fullgraph_without_breaks(sglang_with_plugin, env):
    block, native, settings = routed_block(env)
    assert settings.custom_ops
    block(*inputs(3))  # each layer's first call builds its bridge (SGLang's warm-up pass does)
    buckets = "SGLANG_FL_TOKEN_BUCKETS" in env
    slot = next(c.cell_contents for c in block.norm._forward_method.__closure__
                if type(c.cell_contents).__name__ == "CustomOpSlot")
    assert type(slot.inner).__name__ == ("SizeRoutedSlot" if buckets else "ImplSlot")
    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(*inputs(5))
    assert explained.graph_break_count == 0, explained.break_reasons
    ops = {str(n.target) for g in explained.graphs for n in g.graph.nodes if n.op == "call_function"}
    assert {"sglang_fl.rms_norm.default", "sglang_fl.silu_and_mul.default",
            "sglang_fl.rotary_embedding.default"} <= ops, ops
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager", dynamic=True)
    for tokens in (2, 5, 9, 2):
        want = native(*inputs(tokens))
        got = compiled(*inputs(tokens))
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])


def test_a_first_call_under_torch_compile_binds_then_compiles_to_the_same_outputs(sglang_with_plugin):
    """A layer's first call builds its bridge, which dynamo does not trace (it graph-breaks
    there once); the next trace is whole."""
    block, native, _ = routed_block({"SGLANG_FL_CUSTOM_OPS": "1"})
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="aot_eager", dynamic=True)
    for tokens in (2, 5, 9):
        want = native(*inputs(tokens))
        got = compiled(*inputs(tokens))
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
    torch._dynamo.reset()
    assert torch._dynamo.explain(block)(*inputs(4)).graph_break_count == 0


def test_custom_op_rope_keeps_the_inplace_contract(sglang_with_plugin):
    """RoPE with inplace writes into query and key (SGLang's CUDA kernel does; the numerics
    tests rely on it): the custom op is functional, its caller writes the outputs back."""
    block, native, _ = routed_block({"SGLANG_FL_CUSTOM_OPS": "1"})
    positions, q, k = torch.arange(4), torch.randn(4, 64), torch.randn(4, 32)
    want_q, want_k = block.rope.forward_native(positions, q.clone(), k.clone())
    got_q, got_k = block.rope(positions, q, k)
    assert got_q is q and got_k is k
    torch.testing.assert_close(q, want_q)
    torch.testing.assert_close(k, want_k)


def test_custom_ops_are_off_by_default_and_leave_the_direct_binding():
    import functools

    settings, _ = reference_manager()
    assert settings.custom_ops is False
    from sglang.srt.layers.activation import SiluAndMul

    from sglang_fl.sglang_glue.adapters import get_adapter
    from sglang_fl.sglang_glue.layer_hook import LayerRouter

    settings, manager = reference_manager({"SGLANG_FL_STRICT": "1"})
    layer = SiluAndMul()
    layer._forward_method = LayerRouter(settings, manager).bind(layer, get_adapter().sglang_forward_choice(layer))
    layer(torch.randn(2, 8))
    assert isinstance(layer._forward_method, functools.partial)
    assert layer._forward_method.func is manager.resolve("silu_and_mul").impl.fn


def test_an_eager_call_skips_the_op_and_its_copies(sglang_with_plugin):
    """Outside torch.compile the routed layers call their impls directly: no
    ``torch.ops.sglang_fl`` op and no copy of a written input is dispatched (the copies made
    decode under a CUDA graph 0.73x on the H100), and the outputs are those of the plain
    binding (the block's q and k overlap, so in-place RoPE differs from forward_native there);
    a traced call still goes through the op (`test_routed_layers_compile_fullgraph_without_breaks`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    block, _, _ = routed_block({"SGLANG_FL_CUSTOM_OPS": "1"})
    block(*inputs(3))  # binds each layer
    with Seen() as seen:
        got = block(*inputs(4))
    assert not [op for op in seen.ops if op.startswith("sglang_fl.")], seen.ops
    assert not [op for op in seen.ops if "clone" in op], seen.ops
    plain, _, settings = routed_block({})
    assert not settings.custom_ops
    want = plain(*inputs(4))
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
