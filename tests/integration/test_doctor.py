"""``sglang-fl doctor``: its verdict and exit status on a healthy, a warning and a broken install
of this CPU stack, each a fresh ``sglang-fl`` process with real Settings, SGLang adapter, compat
activation, backend discovery and a one-rank gloo group (FlagCX with the C test double:
tests/distributed/test_flagcx_binding.py)."""

from __future__ import annotations

import json
import time

import pytest

from sglang_fl.dispatch.ops import OPS
from tests.integration.test_cli_and_vendors import cli

pytestmark = pytest.mark.integration


def doctor(*args, **env):
    start = time.monotonic()
    proc = cli("doctor", *args, env=env)
    return proc, time.monotonic() - start


def test_healthy_cpu_install_is_ok():
    # (how long it takes is reported in r["seconds"], not asserted: a loaded host is slower)
    proc, _ = doctor("--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    assert (r["verdict"], r["exit_code"], r["findings"]) == ("ok", 0, [])
    assert r["platform"]["name"] == r["platform"]["chip"] == "cpu"
    assert r["platform"]["yaml"].endswith("sglang_fl/config/cpu.yaml")
    assert r["versions"]["sglang"] == r["sglang_adapter"]
    ledger = [p["name"] for p in r["empty_mode"]["ledger"]]
    assert {"standin:sgl_kernel", "standin:flashinfer", "fix:request_state_leak"} <= set(ledger)
    assert "sgl_kernel" in r["empty_mode"]["standins"]
    assert r["layer1"] == {"enabled": False, "reason": "USE_FLAGGEMS=0 (platform cpu.yaml)",
                           "mode": "", "ops": []}
    for spec in OPS:
        assert r["dispatch"]["ops"][spec.name]["routes"] == {
            "decode": "reference(reference)", "prefill": "reference(reference)"}
    assert r["dispatch"]["needed"] == [spec.name for spec in OPS]
    assert r["distributed"]["backend"] == "gloo"
    assert r["distributed"]["check"] == "ok: one-rank gloo group, all_reduce -> [1.0, 1.0]"


def test_text_report_ends_with_the_verdict():
    proc, _ = doctor()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("versions    sglang-fl ")
    assert any(ln.startswith("install     empty mode: stand-ins for sgl_kernel") for ln in lines)
    assert any(ln.startswith("  rms_norm ") and "decode: reference(reference)" in ln for ln in lines)
    assert any(ln.startswith("Layer 3     backend gloo") for ln in lines)
    assert lines[-1].startswith("verdict: ok (exit 0, ")


def test_a_preferred_kind_passed_over_is_a_warning():
    proc, _ = doctor("--json", SGLANG_FL_PER_OP="rms_norm=flagos|reference")
    assert proc.returncode == 1, proc.stdout[-3000:]
    r = json.loads(proc.stdout)
    assert r["verdict"] == "warnings"
    (finding,) = r["findings"]
    assert finding["level"] == "warning"
    assert finding["message"].startswith("rms_norm: preferred flagos unavailable (flagos: import "
                                         "flag_gems failed")
    assert finding["message"].endswith("using reference(reference)")


@pytest.mark.parametrize(("env", "message"), [
    ({"SGLANG_FL_PER_OP": "rms_norm=fast"},
     "invalid configuration: SGLANG_FL_PER_OP[rms_norm]='fast': unknown or missing backend kind "
     "'fast'; accepted kinds: flagos, vendor, reference"),
    ({"SGLANG_FL_PREFER": "flagos", "SGLANG_FL_STRICT": "1"},
     "No available implementation for ops 'silu_and_mul', 'rms_norm'"),
    ({"SGLANG_FL_DIST_BACKEND": "flagcx", "FLAGCX_PATH": "/nonexistent/flagcx"},
     "SGLANG_FL_DIST_BACKEND=flagcx but libflagcx.so was not found under "
     "FLAGCX_PATH='/nonexistent/flagcx'"),
], ids=["bad-value", "no-implementation", "flagcx-missing"])
def test_a_broken_install_cannot_serve(env, message):
    proc, _ = doctor("--json", **env)
    assert proc.returncode == 2, proc.stdout[-3000:]
    r = json.loads(proc.stdout)
    assert r["verdict"] == "cannot serve"
    errors = [f["message"] for f in r["findings"] if f["level"] == "error"]
    assert len(errors) == 1 and errors[0].startswith(message), errors
