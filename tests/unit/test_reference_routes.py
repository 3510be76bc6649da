"""``doctor.reference_routes``: on an accelerator, which calls of a resolved op would run on the
pure-PyTorch reference (a served fp32 hybrid's GDN prefill once went there unnoticed)."""

from __future__ import annotations

from sglang_fl.dispatch.limits import InputLimits
from sglang_fl.dispatch.manager import ResolvedOp
from sglang_fl.dispatch.types import BackendImplKind, OpImpl
from sglang_fl.doctor import left_out_by_empty_mode, reference_routes


def _impl(kind, limits=None, vendor=None):
    return OpImpl("chunk_gated_delta_rule", kind.value if vendor is None else f"vendor.{vendor}",
                  kind, lambda obj, *a: None, vendor=vendor, limits=limits)


BF16_ONLY = InputLimits(dtypes=(("q", ("bfloat16", "float16")),))


def _resolved(*impls):
    return ResolvedOp("chunk_gated_delta_rule", list(impls), (), False)


def test_a_reference_choice_is_named():
    assert reference_routes(_resolved(_impl(BackendImplKind.REFERENCE))) == "all its calls"


def test_dtypes_every_kernel_declines_are_named():
    r = _resolved(_impl(BackendImplKind.FLAGOS, BF16_ONLY),
                  _impl(BackendImplKind.VENDOR, BF16_ONLY, vendor="cuda"),
                  _impl(BackendImplKind.REFERENCE))
    assert reference_routes(r) == "float32 inputs"


def test_no_finding_when_a_kernel_takes_every_dtype():
    r = _resolved(_impl(BackendImplKind.FLAGOS),
                  _impl(BackendImplKind.VENDOR, BF16_ONLY, vendor="cuda"),
                  _impl(BackendImplKind.REFERENCE))
    assert reference_routes(r) is None
    r = _resolved(_impl(BackendImplKind.VENDOR, BF16_ONLY, vendor="cuda"),
                  _impl(BackendImplKind.FLAGOS), _impl(BackendImplKind.REFERENCE))
    assert reference_routes(r) is None


def test_a_kind_absent_only_because_of_empty_mode_is_a_note():
    stand_in = ("vendor", "vendor.cuda: implements no rms_norm here (sgl_kernel is an sglang-fl "
                          "stand-in (the real package is not installed))")
    refused = ("vendor", "vendor.cuda: refused: torch.cuda is unavailable")
    r = _resolved(_impl(BackendImplKind.FLAGOS))
    r.passed_over = (stand_in,)
    assert left_out_by_empty_mode(r, ("sgl_kernel",))
    assert not left_out_by_empty_mode(r, ())  # not an empty-mode install: a warning
    r.passed_over = (stand_in, refused)
    assert not left_out_by_empty_mode(r, ("sgl_kernel",))
