"""What is installed beside sglang-fl, read from package metadata only (no import, no device):
shared by ``sglang-fl doctor`` and the ``sglang_fl_info`` metric."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

#: Report key -> distribution name of the packages an operator asks about.
DISTRIBUTIONS = {
    "sglang_fl": "sglang_fl",
    "sglang": "sglang",
    "torch": "torch",
    "triton": "triton",
    "flag_gems": "flag_gems",
    "sglang_kernel": "sglang-kernel",
}

NOT_INSTALLED = "absent"


def installed_versions() -> dict[str, str]:
    """Version of each of `DISTRIBUTIONS`, or ``absent``."""
    out = {}
    for key, dist in DISTRIBUTIONS.items():
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = NOT_INSTALLED
    return out
