"""Declared input limits (``dispatch/limits.py``): a backend method that declares what its kernel
takes is guarded at registration; a call outside the limits goes to the next implementation in
the op's order (logged once), and the declining impl stays the choice for the inputs it takes.
Real registry, policy, manager and reference backend; the declining backend is a small test
double (a kernel that must never see float32)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from sglang_fl.config import build_settings  # noqa: E402
from sglang_fl.dispatch.backends import Backend  # noqa: E402
from sglang_fl.dispatch.backends.reference import ReferenceBackend  # noqa: E402
from sglang_fl.dispatch.limits import InputsDeclined, accepts  # noqa: E402
from sglang_fl.dispatch.manager import OpManager  # noqa: E402
from sglang_fl.dispatch.policy import SelectionPolicy  # noqa: E402
from sglang_fl.dispatch.registry import OpRegistry  # noqa: E402
from sglang_fl.dispatch.types import BackendImplKind, NoImplementationError  # noqa: E402
from sglang_fl.dispatch.verify import InvalidImplError  # noqa: E402


class HalfOnly(Backend):
    """A 'kernel' that takes half precision only and records what it was called with."""

    name = "halfonly"
    kind = BackendImplKind.FLAGOS

    def __init__(self):
        self.calls = []

    def is_available(self):
        return True

    @accepts(x=("bfloat16", "float16"), why="the kernel has no float32 path")
    def silu_and_mul(self, obj, x):
        assert x.dtype != torch.float32, "the guard let float32 reach the kernel"
        self.calls.append(x.dtype)
        d = x.shape[-1] // 2
        return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


def manager_with(backend, strict=False):
    settings = build_settings(env={"SGLANG_FL_PREFER": "flagos",
                                   **({"SGLANG_FL_STRICT": "1"} if strict else {})},
                              detect_platform=lambda: "cpu")
    registry = OpRegistry()
    registry.register_many(ReferenceBackend().op_impls())
    registry.register_backend(backend)
    return OpManager(registry, SelectionPolicy.from_settings(settings))


def test_a_declined_call_goes_to_the_next_impl_and_the_impl_stays_the_choice(caplog):
    backend = HalfOnly()
    manager = manager_with(backend)
    resolved = manager.resolve("silu_and_mul")
    assert resolved.impl.impl_id == "halfonly"
    x32 = torch.randn(4, 16)
    with caplog.at_level(logging.WARNING, logger="sglang_fl"):
        for _ in range(3):
            out = manager.call("silu_and_mul", None, x32)
    d = 8
    torch.testing.assert_close(out, torch.nn.functional.silu(x32[..., :d]) * x32[..., d:])
    declines = [r for r in caplog.records if "declined the inputs" in r.getMessage()]
    assert len(declines) == 1, [r.getMessage() for r in caplog.records]
    msg = declines[0].getMessage()
    assert "x in bfloat16|float16, not float32" in msg and "goes to reference" in msg
    assert "the kernel has no float32 path" in msg
    # Not dropped: a bf16 call still runs on the declining impl.
    manager.call("silu_and_mul", None, x32.bfloat16())
    assert backend.calls == [torch.bfloat16]
    assert manager.resolve("silu_and_mul").impl.impl_id == "halfonly"


def test_strict_mode_refuses_a_declined_call_naming_the_limit():
    manager = manager_with(HalfOnly(), strict=True)
    with pytest.raises(NoImplementationError, match="accepts these inputs.*STRICT.*not float32"):
        manager.call("silu_and_mul", None, torch.randn(2, 8))


def test_the_guard_keeps_the_op_signature_and_names_the_limit():
    impl = next(i for i in HalfOnly().op_impls() if i.op_name == "silu_and_mul")
    registry = OpRegistry()
    registry.register(impl)
    (registered,) = registry.impls("silu_and_mul")
    assert registered.limits is not None
    assert registered.limits.describe() == "x in bfloat16|float16 (the kernel has no float32 path)"
    with pytest.raises(InputsDeclined, match="takes x in bfloat16|float16, not float32"):
        registered.fn(None, torch.randn(2, 8))


def test_a_limit_on_a_parameter_the_op_lacks_is_refused_at_registration():
    class Misspelled(HalfOnly):
        @accepts(hidden=("bfloat16",))
        def silu_and_mul(self, obj, x):
            return x

    with pytest.raises(InvalidImplError, match="no parameter 'hidden'"):
        OpRegistry().register_many(Misspelled().op_impls())


def test_accepts_refuses_unknown_dtype_names():
    with pytest.raises(ValueError, match="dtype names from"):
        accepts(x=("bf16",))
    with pytest.raises(ValueError, match="tuple of dtype names"):
        accepts(x="bfloat16")


def test_a_shape_limit_declines_through_its_check():
    class SmallHeads(HalfOnly):
        @accepts(check=lambda x: None if x.shape[-1] <= 16 else f"width {x.shape[-1]} > 16",
                 check_doc="x width <= 16")
        def silu_and_mul(self, obj, x):
            assert x.shape[-1] <= 16
            return torch.nn.functional.silu(x[..., :x.shape[-1] // 2]) * x[..., x.shape[-1] // 2:]

    manager = manager_with(SmallHeads())
    out = manager.call("silu_and_mul", None, torch.randn(2, 64))  # declined -> reference
    assert out.shape == (2, 32)
    assert manager.resolve("silu_and_mul").declines
