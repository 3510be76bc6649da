"""The smoke suite that ships in every image (``python -m sglang_fl.smoke``), run on this CPU
host the way ``nox -s smoke-cpu`` and ``docker run IMAGE smoke`` run it: each layer in a fresh
process. On CPU Layer 1 must *report* itself disabled; a broken routing must fail the suite.
(The served check, ``--layers all``, runs in test_pkg_install_stack's fresh-venv test.)"""

from __future__ import annotations

import json
import os
import sys

import pytest
from pkg_helpers import run

pytestmark = [pytest.mark.integration, pytest.mark.distributed]


def smoke(tmp_path, *args, **env):
    out = tmp_path / "results.json"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    result = run([sys.executable, "-m", "sglang_fl.smoke", "--workdir", str(tmp_path),
                  "--json", str(out), *args], env={**clean, **env}, timeout=600)
    results = {r["layer"]: r for r in json.loads(out.read_text())} if out.exists() else {}
    return result, results


def test_layers_1_2_3_on_cpu(tmp_path):
    """(.ci/run leaves it to `nox -s image-cpu` when that runs too: the image's `smoke --no-skip`
    runs these layers and more, each of which fails the suite unless sglang-fl serves it.)"""
    if os.environ.get("SGLANG_FL_TEST_IMAGE_CPU_RUNS") == "1":
        pytest.skip("nox -s image-cpu runs the smoke suite's every layer in this CI run "
                    "(SGLANG_FL_TEST_IMAGE_CPU_RUNS=1)")
    result, results = smoke(tmp_path, "--layers", "1,2,3", "--no-skip")
    assert result.returncode == 0, result.stdout + result.stderr
    assert results["1"]["status"] == "disabled"
    assert "flag_gems cannot run here" in results["1"]["detail"]
    assert results["1"]["env"]["USE_FLAGGEMS"] == "1"
    assert results["2"]["status"] == "passed"
    assert "RMSNorm → reference(reference)" in results["2"]["detail"]
    assert results["3"]["status"] == "passed"
    assert "via CommunicatorFL" in results["3"]["detail"]


def test_a_layer_that_is_not_routed_fails_the_suite(tmp_path):
    result, results = smoke(tmp_path, "--layers", "2", SGLANG_FL_OOT_BLACKLIST="SiluAndMul")
    assert result.returncode == 1
    assert results["2"]["status"] == "failed"
    assert "SiluAndMul is not routed through sglang-fl" in results["2"]["detail"]


def test_layer_3_with_sglangs_own_backend_is_not_a_pass(tmp_path):
    result, results = smoke(tmp_path, "--layers", "3", SGLANG_FL_DIST_BACKEND="nccl")
    assert result.returncode == 1
    assert "Layer 3 is not sglang-fl's with backend 'nccl'" in results["3"]["detail"]


def test_bad_layer_names_are_refused(tmp_path):
    result, _ = smoke(tmp_path, "--layers", "1,4")
    assert result.returncode == 2
    assert "unknown ['4']" in result.stderr


def test_doctor_check_passes_on_this_cpu_and_keeps_its_report(tmp_path):
    result, results = smoke(tmp_path, "--layers", "doctor", "--no-skip")
    assert result.returncode == 0, result.stdout + result.stderr
    assert results["doctor"]["status"] == "passed"
    assert results["doctor"]["detail"].startswith("verdict ok in ")
    assert json.loads((tmp_path / "doctor.json").read_text())["verdict"] == "ok"


def test_doctor_check_fails_an_install_that_cannot_serve(tmp_path):
    result, results = smoke(tmp_path, "--layers", "doctor", SGLANG_FL_PREFER="flagos",
                            SGLANG_FL_STRICT="1")
    assert result.returncode == 1
    assert results["doctor"]["status"] == "failed"
    assert "sglang-fl doctor: cannot serve: error [dispatch] No available implementation" in \
        results["doctor"]["detail"]
