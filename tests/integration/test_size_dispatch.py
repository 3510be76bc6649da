"""Size-aware dispatch on real SGLang layers: an op's order per token bucket, decided once per
(layer, bucket), logged per bucket, falling back per bucket; one route when buckets agree."""

from __future__ import annotations

import functools

import pytest
import torch
from routing_helpers import make_layer, router_with

pytestmark = pytest.mark.integration


class Counting:
    """A second rms_norm impl (kind flagos) computing what the reference computes, counting its
    calls by token count; ``fail`` makes it raise like a kernel rejecting a shape."""

    def __init__(self, fail=False):
        from sglang_fl.dispatch.backends.reference import ReferenceBackend

        self.reference = ReferenceBackend().rms_norm
        self.tokens = []
        self.fail = fail

    def __call__(self, obj, x, residual=None, post_residual_addition=None):
        self.tokens.append(x.shape[0])
        if self.fail:
            raise RuntimeError("unsupported shape")
        return self.reference(obj, x, residual, post_residual_addition)


BUCKETED = {"SGLANG_FL_TOKEN_BUCKETS": "decode=4;prefill",
            "SGLANG_FL_PER_OP": "rms_norm@decode=flagos|reference;rms_norm@prefill=reference"}


def test_each_bucket_takes_its_own_order_and_logs_it_once(sglang_with_plugin, tmp_path):
    log = tmp_path / "d.log"
    impl = Counting()
    router, manager = router_with({**BUCKETED, "SGLANG_FL_DISPATCH_LOG": str(log)}, impl)
    layer, native = make_layer()
    layer._forward_method = router.bind(layer, native)
    for tokens in (1, 4, 5, 64, 2, 300):
        x, res = torch.randn(tokens, 64), torch.randn(tokens, 64)
        torch.testing.assert_close(layer.forward(x), layer.forward_native(x))
        got = layer.forward(x.clone(), res.clone())
        want = layer.forward_native(x.clone(), res.clone())
        torch.testing.assert_close(got[0], want[0])
        torch.testing.assert_close(got[1], want[1])
    assert impl.tokens == [1, 1, 4, 4, 2, 2]  # only decode-sized calls reach the flagos impl
    assert log.read_text().splitlines() == [
        "[OOT-DISPATCH] RMSNorm → flagos(flagos) [decode: tokens<=4]",
        "[OOT-DISPATCH] RMSNorm → reference(reference) [prefill: tokens>4]",
    ]
    assert manager.resolve("rms_norm", "decode").impl.impl_id == "flagos"
    assert manager.resolve("rms_norm", "prefill").impl.impl_id == "reference"


def test_the_public_call_takes_the_order_of_its_token_bucket(sglang_with_plugin):
    """``call_op`` / ``OpManager.call`` has no layer but the same size argument: each call runs
    on its bucket's impl, as a layer route would (it took the op-wide order until 2026-12-06)."""
    impl = Counting()
    _, manager = router_with(BUCKETED, impl)
    layer, _ = make_layer()
    for tokens in (1, 4, 5, 300, 2):
        x = torch.randn(tokens, 64)
        torch.testing.assert_close(manager.call("rms_norm", layer, x), layer.forward_native(x))
    assert impl.tokens == [1, 4, 2]
    x = torch.randn(3, 64)
    torch.testing.assert_close(manager.call("rms_norm", layer, x=x), layer.forward_native(x))
    assert impl.tokens == [1, 4, 2, 3]  # the size argument given by name
    assert manager.bucket_of("rms_norm", (layer,), {}) is None  # no size argument: op-wide


def test_resolution_runs_once_per_bucket_for_many_layers(sglang_with_plugin, monkeypatch):
    router, manager = router_with(BUCKETED, Counting())
    calls = []
    original = manager._resolve_uncached
    monkeypatch.setattr(manager, "_resolve_uncached",
                        lambda op, bucket=None: calls.append((op, bucket)) or original(op, bucket))
    for _ in range(12):
        layer, native = make_layer()
        layer._forward_method = router.bind(layer, native)
        layer.forward(torch.randn(1, 64))
        layer.forward(torch.randn(9, 64))
    assert sorted(calls, key=str) == [("rms_norm", "decode"), ("rms_norm", "prefill")]


def test_a_failing_impl_falls_back_in_its_bucket_only(sglang_with_plugin, tmp_path):
    log = tmp_path / "d.log"
    impl = Counting(fail=True)
    env = {"SGLANG_FL_TOKEN_BUCKETS": "decode=4;prefill", "SGLANG_FL_DISPATCH_LOG": str(log),
           "SGLANG_FL_PER_OP": "rms_norm@decode=flagos|reference;rms_norm@prefill=reference|flagos"}
    router, manager = router_with(env, impl)
    layer, native = make_layer()
    layer._forward_method = router.bind(layer, native)
    x = torch.randn(2, 64)
    torch.testing.assert_close(layer.forward(x), layer.forward_native(x))
    torch.testing.assert_close(layer.forward(x), layer.forward_native(x))
    assert impl.tokens == [2]  # dropped from the decode bucket after its failure
    assert [i.impl_id for i in manager.resolve("rms_norm", "prefill").candidates] == ["reference", "flagos"]
    # flagos never returned a result: only the route that ran is logged.
    assert log.read_text().splitlines() == [
        "[OOT-DISPATCH] RMSNorm → reference(reference) [decode: tokens<=4]"]


def test_buckets_with_the_same_candidates_bind_one_route_without_a_comparison(sglang_with_plugin,
                                                                                tmp_path):
    log = tmp_path / "d.log"
    env = {"SGLANG_FL_TOKEN_BUCKETS": "decode=4;prefill", "SGLANG_FL_DISPATCH_LOG": str(log),
           # different kind lists, same candidates here: nothing to decide per call
           "SGLANG_FL_PER_OP": "silu_and_mul@decode=reference;silu_and_mul@prefill=reference|vendor",
           "SGLANG_FL_STRICT": "1"}
    router, manager = router_with(env, Counting())
    from sglang.srt.layers.activation import SiluAndMul

    from sglang_fl.sglang_glue.adapters import get_adapter

    layer = SiluAndMul()
    layer._forward_method = router.bind(layer, get_adapter().sglang_forward_choice(layer))
    x = torch.randn(9, 32)
    torch.testing.assert_close(layer.forward(x), layer.forward_native(x))
    bound = layer._forward_method
    assert isinstance(bound, functools.partial) and bound.func is manager.resolve(
        "silu_and_mul", "decode").impl.fn  # the impl itself, no router frame
    assert log.read_text().splitlines() == ["[OOT-DISPATCH] SiluAndMul → reference(reference)"]


def test_a_bucket_without_any_implementation_fails_at_start_up_naming_it(sglang_with_plugin):
    from sglang_fl.dispatch.types import NoImplementationError

    env = {"SGLANG_FL_PER_OP": "silu_and_mul@prefill=vendor", "SGLANG_FL_TOKEN_BUCKETS": "decode=4;prefill"}
    router, manager = router_with(env, Counting())
    with pytest.raises(NoImplementationError, match="op 'silu_and_mul' in token bucket 'prefill'"):
        manager.resolve_all(["silu_and_mul"])


def test_config_and_ops_show_the_buckets():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    env.update(SGLANG_FL_PLATFORM="cpu", SGLANG_FL_TOKEN_BUCKETS="small=16;large",
               SGLANG_FL_PER_OP="silu_and_mul@small=reference|flagos;silu_and_mul@large=reference")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "sglang_fl.cli", *args], env=env,
                              capture_output=True, text=True, timeout=240)

    proc = cli("config")
    assert proc.returncode == 0, proc.stderr
    assert "small<=16; large>16" in proc.stdout and "(env SGLANG_FL_TOKEN_BUCKETS)" in proc.stdout
    assert "silu_and_mul@small=reference|flagos; silu_and_mul@large=reference" in proc.stdout
    proc = cli("ops", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["token_buckets"] == [{"name": "small", "max_tokens": 16}, {"name": "large", "max_tokens": None}]
    buckets = data["ops"]["silu_and_mul"]["buckets"]
    assert buckets["small"]["order"] == ["reference", "flagos"] and buckets["small"]["tokens"] == "tokens<=16"
    assert buckets["large"]["chosen"] == "reference(reference)" and buckets["large"]["tokens"] == "tokens>16"
    assert data["ops"]["rms_norm"]["buckets"] == {}  # no order of its own per bucket
    proc = cli("ops")
    assert "token buckets: small<=16; large>16 (from env SGLANG_FL_TOKEN_BUCKETS)" in proc.stdout
    assert "bucket small (tokens<=16): chosen: reference(reference)   order: reference>flagos" in proc.stdout


def test_three_buckets_route_each_count_to_its_bucket(sglang_with_plugin, tmp_path):
    log = tmp_path / "d.log"
    impl = Counting()
    env = {"SGLANG_FL_TOKEN_BUCKETS": "tiny=1;mid=8;large", "SGLANG_FL_DISPATCH_LOG": str(log),
           "SGLANG_FL_PER_OP": "rms_norm=flagos|reference;rms_norm@mid=reference"}
    router, _ = router_with(env, impl)
    layer, native = make_layer()
    layer._forward_method = router.bind(layer, native)
    for tokens in (1, 2, 8, 9, 100, 1):
        x = torch.randn(tokens, 64)
        torch.testing.assert_close(layer.forward(x), layer.forward_native(x))
    assert impl.tokens == [1, 9, 100, 1]
    assert log.read_text().splitlines() == [
        "[OOT-DISPATCH] RMSNorm → flagos(flagos) [tiny: tokens<=1]",
        "[OOT-DISPATCH] RMSNorm → reference(reference) [mid: 1<tokens<=8]",
        "[OOT-DISPATCH] RMSNorm → flagos(flagos) [large: tokens>8]",
    ]


class _CountingGDN:
    """A stand-in flagos impl of a GDN function op: the reference's result, with the token count
    of each call it takes (``size``: the op's token dimension, read as the dispatch reads it)."""

    def __init__(self, op, size):
        from sglang_fl.dispatch.backends.reference import ReferenceBackend

        self.reference, self.size, self.tokens = getattr(ReferenceBackend(), op), size, []

    def __call__(self, obj, *args):
        self.tokens.append(self.size(args))
        return self.reference(obj, *args)


def _gdn_cases():
    """Per op: (SGLang's entry, token count -> the op's positional arguments after ``obj``,
    those arguments -> their token count)."""
    hv, dim, width = 4, 6, 4

    def gating(tokens):
        g = torch.Generator().manual_seed(tokens)
        return (torch.randn(hv, generator=g), torch.randn(tokens, hv, generator=g),
                torch.randn(tokens, hv, generator=g), torch.randn(hv, generator=g))

    def conv(tokens):
        g = torch.Generator().manual_seed(tokens)
        cu = torch.tensor([0, tokens], dtype=torch.int32)
        return (torch.randn(dim, tokens, generator=g), torch.randn(dim, width, generator=g), None,
                torch.randn(3, dim, width - 1, generator=g), cu, torch.tensor([1]),
                torch.tensor([True]), "silu", [tokens])

    return {"gdn_gating": ("gdn_backend.fused_gdn_gating", gating, lambda a: a[1].shape[0]),
            "causal_conv1d": ("gdn_backend.causal_conv1d_fn", conv, lambda a: a[0].shape[1])}


@pytest.mark.parametrize("op", ["gdn_gating", "causal_conv1d"])
def test_gdn_entries_take_each_buckets_order_by_their_token_count(sglang_with_plugin, tmp_path, op):
    """SGLang's GDN kernel entries (``sglang_glue/gdn.py``) route per token bucket as layers do:
    cuda.yaml's ``decode:`` / ``prefill:`` orders of the delta rule are served, not the op-wide
    order (until 2026-12-06 they were not: the platform's ``prefer`` kind came first)."""
    from sglang_fl.config import build_settings
    from sglang_fl.dispatch.backends.reference import ReferenceBackend
    from sglang_fl.dispatch.manager import OpManager
    from sglang_fl.dispatch.policy import SelectionPolicy
    from sglang_fl.dispatch.registry import OpRegistry
    from sglang_fl.dispatch.types import OpImpl
    from sglang_fl.sglang_glue import gdn

    entry, make_args, size = _gdn_cases()[op]
    log = tmp_path / "d.log"
    settings = build_settings(env={"SGLANG_FL_TOKEN_BUCKETS": "decode=4;prefill",
                                   "SGLANG_FL_PER_OP": f"{op}@decode=flagos|reference;"
                                                       f"{op}@prefill=reference|flagos"},
                              detect_platform=lambda: "cpu")
    registry = OpRegistry()
    registry.register_many(ReferenceBackend().op_impls())
    impl = _CountingGDN(op, size)
    registry.register(OpImpl(op, "flagos", "flagos", impl))
    slot = gdn.make_slot(OpManager(registry, SelectionPolicy.from_settings(settings)), op, entry,
                         str(log))
    reference = getattr(ReferenceBackend(), op)
    for tokens in (1, 4, 5, 64, 3):
        args = make_args(tokens)  # each side its own copy: the conv writes its states
        got = slot.fn(None, *make_args(tokens))
        want = reference(None, *args)
        for g, w in zip(got if isinstance(got, tuple) else (got,),
                        want if isinstance(want, tuple) else (want,), strict=True):
            torch.testing.assert_close(g, w)
    assert impl.tokens == [1, 4, 3]  # only decode-sized calls reach the decode bucket's flagos
    assert [i.impl_id for i in slot.bucket_impls] == ["flagos", "reference"]
    assert log.read_text().splitlines() == [
        f"[OOT-DISPATCH] {entry} → flagos(flagos) [decode: tokens<=4]",
        f"[OOT-DISPATCH] {entry} → reference(reference) [prefill: tokens>4]",
    ]
