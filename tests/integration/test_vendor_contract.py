"""The vendor contract on real SGLang layers: the vendor-guide example of the product
description, copied verbatim into a vendor folder, is discovered, checked against the op table
and serves SGLang's RMSNorm, SiluAndMul and RotaryEmbedding; the ``[OOT-DISPATCH]`` line is
written when a route is taken, and a layer or call the bridge hands back says "left to SGLang"."""

from __future__ import annotations

import importlib
import logging
import sys
import textwrap

import pytest
import torch

from sglang_fl.config import build_settings
from sglang_fl.dispatch.manager import OpManager
from sglang_fl.dispatch.ops import op_spec
from sglang_fl.dispatch.policy import SelectionPolicy
from sglang_fl.dispatch.registry import OpRegistry

pytestmark = pytest.mark.integration

# The two files of the product description's vendor guide ("厂商接入"), verbatim.
SPEC_BACKEND = '''
from sglang_fl.dispatch.backends import Backend


class MyChipBackend(Backend):
    _available = None

    @property
    def name(self) -> str:
        return "my_chip"

    def is_available(self) -> bool:
        if MyChipBackend._available is None:
            try:
                import my_chip_sdk
                MyChipBackend._available = my_chip_sdk.device_count() > 0
            except ImportError:
                MyChipBackend._available = False
        return MyChipBackend._available

    def silu_and_mul(self, obj, x):
        from .impl.activation import silu_and_mul_my_chip
        return silu_and_mul_my_chip(obj, x)

    def rms_norm(self, obj, x, residual=None):
        from .impl.normalization import rms_norm_my_chip
        return rms_norm_my_chip(obj, x, residual)

    def rotary_embedding(self, obj, query, key, cos, sin, position_ids,
                         rotary_interleaved=False, inplace=True):
        from .impl.rotary import rotary_embedding_my_chip
        return rotary_embedding_my_chip(
            obj, query, key, cos, sin, position_ids, rotary_interleaved, inplace
        )
'''

SPEC_REGISTER_OPS = '''
import functools
from sglang_fl.dispatch.types import OpImpl, BackendImplKind, BackendPriority


def _bind_is_available(fn, is_available_fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    wrapper._is_available = is_available_fn
    return wrapper


def register_builtins(registry) -> None:
    from .my_chip import MyChipBackend

    backend = MyChipBackend()
    is_avail = backend.is_available

    impls = [
        OpImpl(
            op_name="silu_and_mul",
            impl_id="vendor.my_chip",
            kind=BackendImplKind.VENDOR,
            fn=_bind_is_available(backend.silu_and_mul, is_avail),
            vendor="my_chip",
            priority=BackendPriority.VENDOR,
        ),
        OpImpl(
            op_name="rms_norm",
            impl_id="vendor.my_chip",
            kind=BackendImplKind.VENDOR,
            fn=_bind_is_available(backend.rms_norm, is_avail),
            vendor="my_chip",
            priority=BackendPriority.VENDOR,
        ),
        OpImpl(
            op_name="rotary_embedding",
            impl_id="vendor.my_chip",
            kind=BackendImplKind.VENDOR,
            fn=_bind_is_available(backend.rotary_embedding, is_avail),
            vendor="my_chip",
            priority=BackendPriority.VENDOR,
        ),
    ]
    registry.register_many(impls)
'''

# The chip's kernels, which the guide leaves to the vendor: here plain torch, with the shape of
# a fused add-RMSNorm kernel (two inputs added in fp32, written in place).
SPEC_IMPLS = {
    "activation.py": '''
        import torch.nn.functional as F

        def silu_and_mul_my_chip(obj, x):
            d = x.shape[-1] // 2
            return F.silu(x[..., :d]) * x[..., d:]
    ''',
    "normalization.py": '''
        import torch

        def rms_norm_my_chip(obj, x, residual=None):
            s = x.float() if residual is None else x.float() + residual.float()
            out = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + obj.variance_epsilon)
            out = (out * obj.weight.float()).to(x.dtype)
            if residual is None:
                return out
            residual.copy_(s.to(x.dtype))
            return out, residual
    ''',
    "rotary.py": '''
        from sglang_fl.dispatch.backends.reference import ReferenceBackend

        def rotary_embedding_my_chip(obj, query, key, cos, sin, position_ids, interleaved, inplace):
            return ReferenceBackend().rotary_embedding(obj, query, key, cos, sin, position_ids,
                                                       interleaved, inplace)
    ''',
}


@pytest.fixture
def my_chip_folder(tmp_path, monkeypatch):
    """``vendor/my_chip/`` as the guide lays it out, plus a ``my_chip_sdk`` double reporting one
    device; the folder joins the vendor package's search path, where discovery scans."""
    from sglang_fl.dispatch.backends import vendor

    folder = tmp_path / "vendors" / "my_chip"
    (folder / "impl").mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "impl" / "__init__.py").write_text("")
    (folder / "my_chip.py").write_text(SPEC_BACKEND)
    (folder / "register_ops.py").write_text(SPEC_REGISTER_OPS)
    for name, text in SPEC_IMPLS.items():
        (folder / "impl" / name).write_text(textwrap.dedent(text))
    sdk = tmp_path / "sdk"
    sdk.mkdir()
    (sdk / "my_chip_sdk.py").write_text("def device_count():\n    return 1\n")
    monkeypatch.syspath_prepend(str(sdk))
    monkeypatch.setattr(vendor, "__path__", [*vendor.__path__, str(folder.parent)])
    yield folder
    for mod in [m for m in sys.modules if m.startswith(f"{vendor.__name__}.my_chip") or m == "my_chip_sdk"]:
        del sys.modules[mod]
    importlib.invalidate_caches()


def _router(env, log_path=None):
    from sglang_fl.dispatch.discovery import discover_backends
    from sglang_fl.sglang_glue.layer_hook import LayerRouter

    if log_path:
        env = {**env, "SGLANG_FL_DISPATCH_LOG": str(log_path)}
    settings = build_settings(env=env, detect_platform=lambda: "cpu")
    registry = OpRegistry()
    statuses = {s.name: s for s in discover_backends(registry)}
    manager = OpManager(registry, SelectionPolicy.from_settings(settings))
    for s in statuses.values():
        manager.record_backend(s)
    return LayerRouter(settings, manager), statuses


def _bound(router, layer):
    from sglang_fl.sglang_glue.adapters import get_adapter

    native = get_adapter().sglang_forward_choice(layer)
    layer._forward_method = router.bind(layer, native)
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_vendor_guide_example_works_verbatim(sglang_with_plugin, my_chip_folder, tmp_path, dtype):
    from sglang.srt.layers.activation import SiluAndMul
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.layers.rotary_embedding import get_rope

    log = tmp_path / "dispatch.log"
    router, statuses = _router({"SGLANG_FL_PREFER": "vendor", "SGLANG_FL_STRICT": "1"}, log)
    assert statuses["vendor.my_chip"].available
    assert statuses["vendor.my_chip"].ops == ("rms_norm", "rotary_embedding", "silu_and_mul")
    assert statuses["vendor.my_chip"].reason.endswith("vendor.my_chip.register_ops")

    tol = op_spec("rms_norm").tolerance.for_dtype(dtype)
    norm = _bound(router, RMSNorm(1000).to(dtype))
    norm.weight.data.normal_(1.0, 0.1)
    x, res, post = (torch.randn(16, 1000, dtype=dtype) for _ in range(3))
    torch.testing.assert_close(norm.forward(x.clone()), norm.forward_native(x.clone()), **tol)
    for extra in ((), (post,)):  # the guide's rms_norm has no post_residual_addition: adapted
        got = norm.forward(x.clone(), res.clone(), *extra)
        want = norm.forward_native(x.clone(), res.clone(), *extra)
        assert torch.equal(got[1], want[1])
        torch.testing.assert_close(got[0], want[0], **tol)

    act = _bound(router, SiluAndMul())
    y = torch.randn(5, 256, dtype=dtype)
    torch.testing.assert_close(act.forward(y), act.forward_native(y),
                               **op_spec("silu_and_mul").tolerance.for_dtype(dtype))

    rope = _bound(router, get_rope(64, 64, 2048, 10000, True, dtype=dtype))
    pos = torch.randint(0, 2000, (7,))
    q, k = torch.randn(7, 4 * 64, dtype=dtype), torch.randn(7, 2 * 64, dtype=dtype)
    want = rope.forward_native(pos, q.clone(), k.clone())
    got = rope.forward(pos, q.clone(), k.clone())
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **op_spec("rotary_embedding").tolerance.for_dtype(dtype))

    assert log.read_text().splitlines() == [
        "[OOT-DISPATCH] RMSNorm → vendor(vendor.my_chip)",
        "[OOT-DISPATCH] SiluAndMul → vendor(vendor.my_chip)",
        "[OOT-DISPATCH] RotaryEmbedding → vendor(vendor.my_chip)",
    ]


def test_vendor_guide_example_without_its_chip_registers_nothing(sglang_with_plugin, my_chip_folder,
                                                                  monkeypatch):
    (my_chip_folder.parent.parent / "sdk" / "my_chip_sdk.py").write_text(
        "def device_count():\n    return 0\n")
    _, statuses = _router({"SGLANG_FL_PREFER": "vendor"})
    assert not statuses["vendor.my_chip"].available
    assert statuses["vendor.my_chip"].reason == "is_available() returned False"


def test_vendor_folder_with_a_misspelled_method_is_refused_by_name(sglang_with_plugin, my_chip_folder,
                                                                   caplog):
    path = my_chip_folder / "my_chip.py"
    path.write_text(path.read_text().replace("def rms_norm(self", "def rmsnorm(self"))
    with caplog.at_level(logging.ERROR, logger="sglang_fl"):
        _, statuses = _router({"SGLANG_FL_PREFER": "vendor"})
    status = statuses["vendor.my_chip"]
    assert not status.available
    assert status.reason.startswith("refused: vendor.my_chip: MyChipBackend.rmsnorm(obj, x, "
                                    "residual=None) looks like an op method")
    assert "did you mean 'rms_norm'?" in status.reason
    assert any("vendor backend 'my_chip' refused" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# The dispatch log says what ran
# ---------------------------------------------------------------------------------------------


def test_routed_line_is_written_when_the_route_is_taken(sglang_with_plugin, tmp_path):
    from sglang.srt.layers.layernorm import RMSNorm

    log = tmp_path / "d.log"
    router, _ = _router({"SGLANG_FL_PREFER": "reference"}, log)
    norm = _bound(router, RMSNorm(64))
    assert not log.exists()  # built, not yet called
    norm.forward(torch.randn(2, 64))
    assert log.read_text().splitlines() == ["[OOT-DISPATCH] RMSNorm → reference(reference)"]


def test_layer_the_bridge_hands_back_is_logged_as_left_to_sglang(sglang_with_plugin, tmp_path):
    from sglang.srt.layers.layernorm import RMSNorm

    log = tmp_path / "d.log"
    router, _ = _router({"SGLANG_FL_PREFER": "reference"}, log)
    norm = _bound(router, RMSNorm(64, fp32_residual=True))
    x, res = torch.randn(3, 64), torch.randn(3, 64)
    want = norm.forward_native(x.clone(), res.clone())
    got = norm.forward(x.clone(), res.clone())
    torch.testing.assert_close(got, want)
    assert getattr(norm._forward_method, "__self__", None) is norm  # SGLang's own method
    assert log.read_text().splitlines() == [
        "[OOT-DISPATCH] RMSNorm → left to SGLang (fp32_residual)"]


def test_rope_call_with_fused_kv_buffer_is_left_to_sglang_and_logged_so(sglang_with_plugin, tmp_path):
    """A call carrying a fused KV-buffer argument goes to SGLang's own path (its kernel also
    stores K/V); only the first call that takes the route writes the routed line."""
    from sglang.srt.layers.rotary_embedding import get_rope

    log = tmp_path / "d.log"
    router, _ = _router({"SGLANG_FL_PREFER": "reference"}, log)
    rope = get_rope(64, 64, 2048, 10000, True, dtype=torch.float32)
    sglang_calls = []

    def sglang_forward(positions, query, key, offsets=None, fused_set_kv_buffer_arg=None):
        """SGLang's CUDA forward would store K/V as well; it cannot run on this CPU."""
        sglang_calls.append(fused_set_kv_buffer_arg)
        return query, key

    rope._forward_method = router.bind(rope, sglang_forward)
    pos, q, k = torch.arange(3), torch.randn(3, 128), torch.randn(3, 64)
    rope.forward(pos, q, k, fused_set_kv_buffer_arg="kv-store")
    rope.forward(pos, q, k, fused_set_kv_buffer_arg="kv-store")
    assert sglang_calls == ["kv-store", "kv-store"]
    assert log.read_text().splitlines() == [
        "[OOT-DISPATCH] RotaryEmbedding → left to SGLang (calls with fused_set_kv_buffer_arg)"]
    want = rope.forward_native(pos, q.clone(), k.clone())
    got = rope.forward(pos, q.clone(), k.clone())
    torch.testing.assert_close(got, want)
    assert log.read_text().splitlines()[1:] == ["[OOT-DISPATCH] RotaryEmbedding → reference(reference)"]
