"""The op table and the checks it drives: every shipped backend fits it; a vendor method that
is misspelled or mis-signed, or an impl of an unknown op, is refused at registration with a
message naming the vendor, the method and the expected signature; helpers stay legal; an impl
written to the contract's first ``rms_norm(obj, x, residual=None)`` is adapted; no import cycle."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch

from sglang_fl.dispatch.backends import Backend, register_backend
from sglang_fl.dispatch.backends.flaggems import FlagGemsBackend
from sglang_fl.dispatch.backends.reference import ReferenceBackend
from sglang_fl.dispatch.backends.vendor.ascend.backend import AscendBackend
from sglang_fl.dispatch.backends.vendor.cuda.backend import CudaBackend
from sglang_fl.dispatch.backends.vendor.musa.backend import MusaBackend
from sglang_fl.dispatch.backends.vendor.template.backend import TemplateBackend
from sglang_fl.dispatch.discovery import _register_vendor
from sglang_fl.dispatch.ops import OP_NAMES, OPS, ROUTED_CLASSES, op_spec
from sglang_fl.dispatch.registry import OpRegistry
from sglang_fl.dispatch.types import OpImpl
from sglang_fl.dispatch.verify import InvalidImplError, verify_backend_class

SHIPPED = [ReferenceBackend, FlagGemsBackend, CudaBackend, AscendBackend, MusaBackend,
           TemplateBackend]


# ---------------------------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------------------------


def test_every_entry_is_complete_and_consistent():
    assert len(set(OP_NAMES)) == len(OPS)
    assert len(set(ROUTED_CLASSES)) == len(ROUTED_CLASSES)
    for spec in OPS:
        params = spec.parameters
        assert params[0].name == "obj", spec.name
        assert (spec.serves or spec.called_as) and all(name.isidentifier() for name in spec.serves), spec.name
        assert spec.contract, spec.name
        tail = [p.name for p in params[len(params) - len(spec.optional):]] if spec.optional else []
        assert tail == list(spec.optional), f"{spec.name}: optional parameters must be trailing"
        assert all(p.default is not inspect.Parameter.empty for p in params if p.name in spec.optional)
        assert (spec.adapt_short is None) == (not spec.optional), spec.name
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            assert set(spec.tolerance.for_dtype(dtype)) == {"atol", "rtol"}


def test_the_reference_backend_implements_every_op():
    assert ReferenceBackend().implemented_ops() == OP_NAMES


def test_unknown_op_name_lookup_suggests_the_closest():
    with pytest.raises(KeyError, match="did you mean 'rms_norm'"):
        op_spec("rmsnorm")


@pytest.mark.parametrize("cls", SHIPPED, ids=lambda c: c.__name__)
def test_every_shipped_backend_class_fits_the_table(cls):
    verify_backend_class(cls, cls.__name__)  # checked without its runtime: no instance needed


# ---------------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------------


class _Available(Backend):
    name = "acme"

    def is_available(self):
        return True


def _refusal(backend_cls) -> str:
    with pytest.raises(InvalidImplError) as err:
        register_backend(OpRegistry(), backend_cls())
    return str(err.value)


def test_misspelled_op_method_is_refused_naming_vendor_method_and_expected_signature():
    class Misspelled(_Available):
        def silu_and_mul(self, obj, x):
            return x

        def rmsnorm(self, obj, x, residual=None):
            return x

    msg = _refusal(Misspelled)
    assert msg.startswith("vendor.acme: Misspelled.rmsnorm(obj, x, residual=None) looks like an op")
    assert ("did you mean 'rms_norm'? expected: rms_norm(obj, x, residual=None, "
            "post_residual_addition=None)") in msg
    assert "give a helper method a leading '_'" in msg


@pytest.mark.parametrize("method, why", [
    ("def rms_norm(self, obj, x, eps, residual=None): ...",
     "parameter 3 is 'eps', expected 'residual'"),
    ("def rms_norm(self, obj, x, residual): ...", "'residual' has no default, expected =None"),
    ("def rotary_embedding(self, obj, query, key, cos, sin, position_ids, rotary_interleaved=False,"
     " inplace=False): ...", "'inplace' defaults to False, expected True"),
    ("def silu_and_mul(self, obj, x, out): ...", "extra parameter(s) 'out' without a default"),
    ("def silu_and_mul(self, obj): ...", "missing parameter(s) 'x'"),
    ("def rms_norm(self, obj, x, *, residual=None, post_residual_addition=None): ...",
     "'residual', 'post_residual_addition' must be positional"),
    ("def gemma_rms_norm(self, layer, x, residual=None, post_residual_addition=None): ...",
     "parameter 1 is 'layer', expected 'obj'"),
])
def test_wrong_signature_is_refused_with_the_expected_one(method, why):
    ns: dict = {}
    exec(f"class Wrong(_Available):\n    {method}\n", {"_Available": _Available}, ns)
    msg = _refusal(ns["Wrong"])
    name = method.split("(")[0].removeprefix("def ")
    assert msg.startswith(f"vendor.acme: Wrong.{name}(")
    assert f"does not match the standard signature of op {name!r} ({why}" in msg
    assert msg.endswith(f"expected: {op_spec(name).describe()}")


def test_public_method_taking_obj_first_is_taken_for_an_op():
    class Stray(_Available):
        def fused_add_rmsnorm(self, obj, x, residual):
            return x

    msg = _refusal(Stray)
    assert "Stray.fused_add_rmsnorm(obj, x, residual) looks like an op method" in msg
    assert "no op 'fused_add_rmsnorm'." in msg  # nothing close enough to suggest


def test_helpers_stay_legal():
    class WithHelpers(_Available):
        scale = 2.0

        @property
        def device(self):
            return "cpu"

        def warm_up(self, shapes=()):  # public, not op-like
            return shapes

        @staticmethod
        def pack(x):
            return x

        def _kernel_for(self, obj, x):  # private, may take obj
            return x

        def silu_and_mul(self, obj, x):
            return self.pack(x)

    registry = OpRegistry()
    assert register_backend(registry, WithHelpers())
    assert registry.op_names() == ("silu_and_mul",)


def test_impl_of_unknown_op_is_refused():
    with pytest.raises(InvalidImplError) as err:
        OpRegistry().register(OpImpl("rotary_embeding", "vendor.acme", "vendor", lambda obj, x: x,
                                     vendor="acme"))
    assert str(err.value) == (
        "vendor.acme: registers unknown op 'rotary_embeding' (did you mean 'rotary_embedding'?); "
        f"the op table has: {', '.join(OP_NAMES)}")


def test_directly_registered_bound_method_brings_its_class_into_the_check():
    """The product description's register_ops.py builds OpImpls by hand: the backend class
    behind a bound method is still checked, so its misspelled sibling is found."""

    class Sibling(_Available):
        def silu_and_mul(self, obj, x):
            return x

        def rotary_embeding(self, obj, query, key, cos, sin, position_ids,
                            rotary_interleaved=False, inplace=True):
            return query, key

    impl = OpImpl("silu_and_mul", "vendor.acme", "vendor", Sibling().silu_and_mul, vendor="acme")
    with pytest.raises(InvalidImplError, match="Sibling.rotary_embeding.*did you mean 'rotary_embedding'"):
        OpRegistry().register(impl)


class _Module:
    """A vendor's register_ops module."""

    def __init__(self, backend):
        self.BACKEND = backend

    def register_builtins(self, registry):
        register_backend(registry, self.BACKEND)


def test_discovery_refuses_the_whole_vendor_and_records_why():
    class HalfRight(_Available):
        def silu_and_mul(self, obj, x):
            return x

        def rms_norm(self, obj, x, weight, residual=None):
            return x

    registry = OpRegistry()
    status = _register_vendor(registry, "acme", "test", lambda: _Module(HalfRight()))
    assert not status.available and status.name == "vendor.acme"
    assert status.reason.startswith("refused: vendor.acme: HalfRight.rms_norm(obj, x, weight, ")
    assert registry.op_names() == ()  # silu_and_mul was fine but the vendor is refused whole


def test_discovery_checks_a_vendor_class_even_where_it_is_unavailable():
    class Away(Backend):
        name = "away"

        def is_available(self):
            self.unavailable_reason = "no away device"
            return False

        def silu_mul(self, obj, x):
            return x

    status = _register_vendor(OpRegistry(), "away", "test", lambda: _Module(Away()))
    assert status.reason.startswith("refused: vendor.away: Away.silu_mul(obj, x) looks like an op")
    assert "did you mean 'silu_and_mul'?" in status.reason


def test_upstream_is_available_marker_keeps_only_available_impls():
    def silu_and_mul(obj, x):
        return x

    silu_and_mul._is_available = lambda: False

    class Module:
        BACKEND = None

        @staticmethod
        def register_builtins(registry):
            registry.register_many([OpImpl("silu_and_mul", "vendor.acme", "vendor", silu_and_mul,
                                           vendor="acme")])

    registry = OpRegistry()
    status = _register_vendor(registry, "acme", "test", lambda: Module)
    assert registry.op_names() == () and not status.available
    assert status.reason == "is_available() returned False"


# ---------------------------------------------------------------------------------------------
# An impl written to the contract's first rms_norm(obj, x, residual=None)
# ---------------------------------------------------------------------------------------------


class _Layer:
    """The attributes the rms_norm entry lets an impl read, and nothing else."""

    def __init__(self, hidden, dtype):
        torch.manual_seed(0)
        self.weight = torch.nn.Parameter((1.0 + 0.1 * torch.randn(hidden)).to(dtype))
        self.variance_epsilon = 1e-6


def _two_input_fused_kernel(obj, x, residual=None):
    """What a vendor's fused add-RMSNorm does: both inputs added in fp32, written in place."""
    if residual is None:
        return ReferenceBackend().rms_norm(obj, x)
    s = x.float() + residual.float()
    out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + obj.variance_epsilon) * obj.weight.float()
    x.copy_(out.to(x.dtype))
    residual.copy_(s.to(x.dtype))
    return x, residual


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_short_rms_norm_is_adapted_to_post_residual_addition(dtype):
    registry = OpRegistry()
    registry.register(OpImpl("rms_norm", "vendor.acme", "vendor", _two_input_fused_kernel,
                             vendor="acme"))
    fn = registry.impls("rms_norm")[0].fn
    assert fn is not _two_input_fused_kernel and fn.__wrapped__ is _two_input_fused_kernel
    layer = _Layer(1000, dtype)
    x, res, post = (torch.randn(64, 1000, dtype=dtype) for _ in range(3))
    want = ReferenceBackend().rms_norm(layer, x.clone(), res.clone(), post)
    got = fn(layer, x.clone(), res.clone(), post)
    assert torch.equal(got[1], want[1])  # the residual: the fp32 sum rounded once, to the bit
    torch.testing.assert_close(got[0], want[0], **op_spec("rms_norm").tolerance.for_dtype(dtype))
    torch.testing.assert_close(fn(layer, x.clone(), res.clone())[1], want[1] - post, atol=0.1,
                               rtol=0.05)  # without the addition, it is the plain fused add


# ---------------------------------------------------------------------------------------------
# Layering
# ---------------------------------------------------------------------------------------------


def _imports(path: Path, package_root: Path) -> set[str]:
    """sglang_fl modules ``path`` imports anywhere in it (functions included)."""
    module = ".".join(path.relative_to(package_root.parent).with_suffix("").parts)
    if module.endswith(".__init__"):
        module = module[: -len(".__init__")]
        package = module
    else:
        package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("sglang_fl")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            if base.startswith("sglang_fl"):
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}
    return found


def test_no_import_cycle_between_sglang_fl_modules():
    """Counting imports inside functions too: a cycle hidden behind a lazy import (discovery
    and manager importing each other) is still a cycle."""
    root = Path(__import__("sglang_fl").__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph = {m: {i for i in _imports(p, root) if i in modules and i != m} for m, p in modules.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_vendor_cuda_offers_each_op_where_its_kernel_package_is_real(monkeypatch):
    """An "empty" SGLang install on a GPU has Triton but no sgl_kernel: vendor.cuda still offers
    SGLang's Triton mRoPE and Gated DeltaNet kernels, and says why the rest is missing
    (stand-ins for what is absent)."""
    from sglang_fl.dispatch.backends.vendor.cuda import backend as cuda_backend
    from sglang_fl.dispatch.discovery import _status

    real = {"triton": (True, ""), "sgl_kernel": (False, "sgl_kernel is not installed"),
            "tvm_ffi": (False, "tvm_ffi is an sglang-fl stand-in")}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_backend, "real_module_available", lambda name: real[name])
    backend = CudaBackend()
    assert backend.available() and backend.implemented_ops() == (
        "mrotary_embedding", "gdn_gating", "chunk_gated_delta_rule", "recurrent_gated_delta_rule",
        "packed_recurrent_gated_delta_rule",
        "causal_conv1d", "causal_conv1d_update", "rms_norm_gated")
    status = _status(backend.impl_id(), "vendor", backend, backend.implemented_ops(), "built-in")
    assert status.available and status.missing == (
        "sgl_kernel is not installed; tvm_ffi is an sglang-fl stand-in")
    real["triton"] = (False, "triton is not installed")
    backend = CudaBackend()
    assert not backend.available()
    assert backend.unavailable_reason.startswith("sgl_kernel is not installed")


def test_every_op_has_a_custom_op_schema_torch_accepts():
    """``custom_ops: true`` defines ``torch.ops.sglang_fl.<op>`` from the table: every
    parameter needs a schema type (`OpSpec.arg_types` where the default does not tell) and every
    ``mutates`` / ``size_arg`` name must be a parameter."""
    import torch

    from sglang_fl.dispatch.custom_ops import schema
    from sglang_fl.dispatch.ops import OPS

    for spec in OPS:
        names = [p.name for p in spec.parameters]
        assert set(spec.mutates) <= set(names), spec.name
        assert spec.size_arg is None or spec.size_arg in names, spec.name
        parsed = torch._C.parse_schema(f"sglang_fl_check::{schema(spec)}")
        assert [a.name for a in parsed.arguments] == ["fl_layer", *names[1:]], spec.name
