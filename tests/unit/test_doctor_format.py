"""The text form of ``sglang-fl doctor`` for what this CPU cannot produce: Layer 1 on (FlagGems
needs a device), in each of its modes, and a report cut short by a bad configuration."""

from __future__ import annotations

from sglang_fl.cli_doctor import format_report

VERSIONS = {"sglang_fl": "0.1.0", "sglang": "0.5.23", "torch": "2.10.0", "triton": "3.5.0",
            "flag_gems": "5.0.2", "sglang_kernel": "0.4.10"}


def _report(**parts):
    return {"versions": VERSIONS, "findings": [], "verdict": "ok", "exit_code": 0,
            "seconds": 1.5, **parts}


def test_layer1_on_names_the_exceptions_or_the_only_ops():
    enable = _report(layer1={"enabled": True, "reason": "all ops except ['mul']", "mode": "enable",
                             "ops": ["mul", "pow_scalar"]})
    assert "Layer 1     on (enable): every FlagGems ATen op except mul, pow_scalar" in \
        format_report(enable).splitlines()
    only = _report(layer1={"enabled": True, "reason": "only 1 whitelisted ops",
                           "mode": "only_enable", "ops": ["embedding"]})
    assert "Layer 1     on (only_enable): only embedding" in format_report(only).splitlines()


def test_a_report_stopped_by_bad_configuration_still_shows_versions_and_the_verdict():
    text = format_report(_report(findings=[{"level": "error", "area": "config",
                                            "message": "invalid configuration: X"}],
                                 verdict="cannot serve", exit_code=2))
    assert text.splitlines() == [
        "versions    sglang-fl 0.1.0, SGLang 0.5.23, torch 2.10.0, triton 3.5.0, FlagGems 5.0.2, "
        "sglang-kernel 0.4.10",
        "findings:",
        "  ERROR [config] invalid configuration: X",
        "verdict: cannot serve (exit 2, 1.5 s)",
    ]
