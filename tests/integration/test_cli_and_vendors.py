"""``sglang-fl config`` / ``ops`` outputs, and a vendor backend shipped as its own package and
found through the ``sglang_fl.vendors`` entry-point group."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_fl.dispatch.ops import OP_NAMES, OPS
from tests.integration.vendor_package import write_vendor_package

pytestmark = pytest.mark.integration


def cli(*args, env=None, extra_path=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    full.update(env or {})
    if extra_path:
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), full.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "sglang_fl.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120)


def test_config_json_shows_values_and_origins(tmp_path):
    cfg = tmp_path / "my.yaml"
    cfg.write_text("prefer: vendor\noot_blacklist: [RotaryEmbedding]\n")
    proc = cli("config", "--json", env={"SGLANG_FL_CONFIG": str(cfg), "SGLANG_FL_STRICT": "1",
                                        "SGLANG_FL_PLATFORM": "cpu"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["prefer"] == {"value": "vendor", "origin": f"yaml {cfg}"}
    assert data["strict"] == {"value": True, "origin": "env SGLANG_FL_STRICT"}
    assert data["use_flaggems"] == {"value": False, "origin": "platform cpu.yaml"}
    assert data["oot_blacklist"]["value"] == ["RotaryEmbedding"]
    assert data["log_level"] == {"value": "INFO", "origin": "default"}


def test_the_template_vendor_loads_only_when_enabled_by_name():
    proc = cli("ops", "--json", env={"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_ENABLE_VENDORS": "template"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["vendor.template"]["detail"].startswith("template backend")
    # no ops, but its example attention backend, which needs nothing but SGLang
    assert backends["vendor.template"]["attention_backends"] == ["template_native"]
    assert data["attention_backends"] == [
        {"name": "template_native", "vendor": "vendor.template", "excluded": ""}]
    proc = cli("ops", env={"SGLANG_FL_ENABLE_VENDORS": "cuda"})
    assert proc.returncode == 2
    assert "SGLANG_FL_ENABLE_VENDORS has unknown name(s) 'cuda'; accepted: template" in proc.stderr


def test_config_text_and_bad_value():
    proc = cli("config", env={"SGLANG_FL_PLATFORM": "cpu"})
    assert proc.returncode == 0 and "prefer" in proc.stdout and "(platform cpu.yaml)" in proc.stdout
    proc = cli("config", env={"SGLANG_FL_PER_OP": "rms_norm=fast"})
    assert proc.returncode == 2
    assert "SGLANG_FL_PER_OP[rms_norm]" in proc.stderr and "flagos, vendor, reference" in proc.stderr


def test_ops_json_on_this_cpu_explains_every_choice():
    proc = cli("ops", "--json", env={"SGLANG_FL_PLATFORM": "cpu"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    backends = {b["name"]: b for b in data["backends"]}
    assert backends["reference"]["available"]
    assert not backends["flagos"]["available"] and "flag_gems" in backends["flagos"]["detail"]
    # the copy-source template registers nothing unless enabled by name
    assert backends["vendor.template"]["detail"] == (
        "opt-in, not enabled (SGLANG_FL_ENABLE_VENDORS=template enables it)")
    assert backends["vendor.template"]["attention_backends"] == []
    assert data["attention_backends"] == []
    assert data["attention_backend_default"] is None
    assert list(data["ops"]) == list(OP_NAMES)  # every op of the table
    for spec in OPS:
        entry = data["ops"][spec.name]
        assert entry["chosen"] == "reference(reference)"
        assert entry["order_from"] == "prefer (platform cpu.yaml)"
        assert entry["signature"] == spec.describe()
        assert entry["serves"] == entry["routed"] == list(spec.class_names)


def test_ops_lists_the_moe_ops_with_the_impl_chosen_and_why():
    proc = cli("ops", env={"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_PREFER": "flagos"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for op in ("topk", "fused_moe"):
        start = next(i for i, ln in enumerate(lines) if ln.startswith(f"  {op} "))
        end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("   ")),
                   len(lines))
        block = [ln.strip() for ln in lines[start:end]]
        assert block[0].startswith(f"{op}") and "chosen: reference(reference)" in block[0]
        assert "order: flagos>vendor>reference" in block[0]
        assert any(ln.startswith("skipped flagos: import flag_gems failed") for ln in block), block
        assert "skipped vendor.cuda: no CUDA device" in block, block


def test_moe_op_whose_only_kind_is_a_denied_vendor_has_no_implementation():
    """SGLANG_FL_DENY_VENDORS=cuda, strict, and fused_moe allowed only on a vendor: no flagos or
    reference impl may serve it."""
    env = {"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_STRICT": "1", "SGLANG_FL_DENY_VENDORS": "cuda",
           "SGLANG_FL_PER_OP": "fused_moe=vendor"}
    proc = cli("ops", env=env)
    assert proc.returncode == 1
    assert "No available implementation for op 'fused_moe': accepts vendor (strict)" in proc.stdout
    assert "topk" in proc.stdout and "No available implementation for op 'topk'" not in proc.stdout


def test_ops_says_per_op_why_the_preferred_kind_was_not_used():
    proc = cli("ops", "--json", env={"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_PREFER": "vendor"})
    assert proc.returncode == 0, proc.stderr
    for op, entry in json.loads(proc.stdout)["ops"].items():
        assert entry["chosen"] == "reference(reference)"
        skipped = {s["impl"]: s["why"] for s in entry["skipped"]}
        assert skipped["vendor.cuda"] == "no CUDA device", op
        assert skipped["vendor.ascend"] == "torch_npu is not installed"
        assert skipped["flagos"].startswith("import flag_gems failed")
        assert [p["kind"] for p in entry["preferred_unavailable"]] == ["vendor", "flagos"]
        assert "vendor.cuda: no CUDA device" in entry["preferred_unavailable"][0]["why"]
    text = cli("ops", env={"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_PREFER": "vendor"}).stdout
    assert "skipped vendor.cuda: no CUDA device" in text
    assert "NOTE: no vendor, flagos impl here (see skipped): using reference(reference)" in text


@pytest.mark.parametrize("args", [("config", "--json"), ("ops",)])
def test_closed_stdout_pipe_ends_quietly(args):
    """``sglang-fl config --json | head -1``: the reader goes away before we write. Closing our
    end of a real pipe before the child prints makes that deterministic."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    env["SGLANG_FL_PLATFORM"] = "cpu"
    proc = subprocess.Popen([sys.executable, "-m", "sglang_fl.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, stderr  # 128 + SIGPIPE, as `yes | head -1` gives
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception" not in stderr


def test_closed_stdout_pipe_through_a_shell_pipeline():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    proc = subprocess.run(f"'{sys.executable}' -m sglang_fl.cli config --json | head -1",
                          shell=True, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "{\n"
    assert proc.stderr == ""


def test_ops_reports_no_available_implementation_and_fails():
    proc = cli("ops", env={"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_PREFER": "flagos",
                           "SGLANG_FL_STRICT": "1"})
    assert proc.returncode == 1
    assert "No available implementation for op 'rms_norm'" in proc.stdout
    assert "skipped reference: strict" in proc.stdout


def test_ops_text_says_where_the_order_came_from_and_what_is_not_routed():
    proc = cli("ops", env={"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_PER_OP": "rms_norm=reference",
                           "SGLANG_FL_OOT_BLACKLIST": "MRotaryEmbedding"})
    assert proc.returncode == 0, proc.stderr
    assert ("rms_norm          chosen: reference(reference)   order: reference "
            "(from op_backends (env SGLANG_FL_PER_OP))") in proc.stdout
    assert ("serves: MRotaryEmbedding (not routed: MRotaryEmbedding); signature: "
            "mrotary_embedding(obj, query, key, ") in proc.stdout


@pytest.fixture
def acme_vendor_package(tmp_path):
    """A vendor backend shipped as its own installed distribution, found through the entry
    point group; its one op is a correct silu_and_mul."""
    return write_vendor_package(tmp_path, "acme", imports="import torch.nn.functional as F\n", methods="""
        def silu_and_mul(self, obj, x):
            d = x.shape[-1] // 2
            return F.silu(x[..., :d]) * x[..., d:]
        # (a test may add a method here)
        """)


def test_vendor_package_found_through_entry_point_group(acme_vendor_package):
    env = {"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_PREFER": "vendor"}
    proc = cli("ops", "--json", env=env, extra_path=acme_vendor_package)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    acme = {b["name"]: b for b in data["backends"]}["vendor.acme"]
    assert acme["available"] and acme["ops"] == ["silu_and_mul"]
    assert acme["detail"] == "entry point acme_fl_vendor.register_ops"
    assert data["ops"]["silu_and_mul"]["chosen"] == "vendor(vendor.acme)"
    assert data["ops"]["rms_norm"]["chosen"] == "reference(reference)"  # acme lacks it
    env["SGLANG_FL_DENY_VENDORS"] = "acme"
    data = json.loads(cli("ops", "--json", env=env, extra_path=acme_vendor_package).stdout)
    assert data["ops"]["silu_and_mul"]["chosen"] == "reference(reference)"
    assert {"impl": "vendor.acme", "why": "vendor 'acme' in SGLANG_FL_DENY_VENDORS"} in \
        data["ops"]["silu_and_mul"]["skipped"]


def test_vendor_package_with_a_misspelled_method_is_refused_and_ops_names_it(acme_vendor_package):
    module = acme_vendor_package / "acme_fl_vendor" / "register_ops.py"
    module.write_text(module.read_text().replace(
        "# (a test may add a method here)",
        "def rmsnorm(self, obj, x, residual=None):\n        return x"))
    env = {"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_PREFER": "vendor"}
    data = json.loads(cli("ops", "--json", env=env, extra_path=acme_vendor_package).stdout)
    acme = {b["name"]: b for b in data["backends"]}["vendor.acme"]
    assert not acme["available"]
    assert acme["detail"] == (
        "refused: vendor.acme: AcmeBackend.rmsnorm(obj, x, residual=None) looks like an op "
        "method, but the op table has no op 'rmsnorm' (did you mean 'rms_norm'? expected: "
        "rms_norm(obj, x, residual=None, post_residual_addition=None)). Op methods are named "
        f"after the table's ops ({', '.join(OP_NAMES)}); give a helper method a leading '_'")
    assert data["ops"]["silu_and_mul"]["chosen"] == "reference(reference)"  # refused whole
    proc = cli("ops", env=env, extra_path=acme_vendor_package)
    assert "vendor.acme      vendor    unavailable: refused: vendor.acme: AcmeBackend.rmsnorm" in \
        proc.stdout
    assert "vendor backend 'acme' refused" in proc.stderr
