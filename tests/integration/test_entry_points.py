"""The plugin loaded the way SGLang loads it, in fresh interpreters: entry points, hooks,
dispatch log lines, the ``SGLANG_PLUGINS=__none__`` escape hatch, bad configuration."""

from __future__ import annotations

import json
from importlib.metadata import entry_points

import pytest

from sglang_fl.dispatch.ops import OP_NAMES
from tests.integration.conftest import run_python

pytestmark = pytest.mark.integration

BUILD_LAYERS = r"""
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))
import torch
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm, GemmaRMSNorm
from sglang.srt.layers.rotary_embedding import get_rope
layers = [SiluAndMul(), RMSNorm(32), RMSNorm(32), GemmaRMSNorm(32), get_rope(16, 16, 64, 10000, True, dtype=torch.float32)]
# SGLang 0.5.23 resolves a layer's forward on its first call: ask for it the same way.
out = {type(l).__name__: getattr(l._forward_method or l._resolve_forward_method(), "__module__", "?")
       for l in layers}
x = torch.randn(2, 32)
out["rms_ok"] = bool(torch.allclose(layers[1].forward(x), layers[1].forward_native(x)))
layers[0].forward(torch.randn(2, 64))
layers[3].forward(x)
layers[4].forward(torch.arange(2), torch.randn(2, 32), torch.randn(2, 16))
print("RESULT" + json.dumps(out))
"""


def result_of(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


def test_entry_points_are_declared_as_in_the_contract():
    plugins = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    platforms = {ep.name: ep.value for ep in entry_points(group="sglang.srt.platforms")}
    assert plugins.get("sglang_fl") == "sglang_fl:load_plugin"
    assert platforms.get("sglang_fl") == "sglang_fl:activate_platform"


def test_plugin_routes_layers_and_writes_the_dispatch_log(tmp_path):
    log = tmp_path / "dispatch.log"
    proc = run_python(BUILD_LAYERS, {"SGLANG_FL_DISPATCH_LOG": str(log)})
    res = result_of(proc)
    assert "WARNING" not in proc.stderr  # cpu.yaml prefers reference: nothing was passed over
    for cls in ("SiluAndMul", "RMSNorm", "GemmaRMSNorm", "RotaryEmbedding"):
        assert res[cls] == "sglang_fl.sglang_glue.layer_hook", res
    assert res["rms_ok"]
    assert log.read_text().splitlines() == [  # in the order the layers were first called
        "[OOT-DISPATCH] RMSNorm → reference(reference)",
        "[OOT-DISPATCH] SiluAndMul → reference(reference)",
        "[OOT-DISPATCH] GemmaRMSNorm → reference(reference)",
        "[OOT-DISPATCH] RotaryEmbedding → reference(reference)",
    ]


def test_blacklist_and_oot_disabled_leave_sglang_forward(tmp_path):
    log = tmp_path / "d.log"
    res = result_of(run_python(BUILD_LAYERS, {"SGLANG_FL_DISPATCH_LOG": str(log),
                                              "SGLANG_FL_OOT_BLACKLIST": "RotaryEmbedding,SiluAndMul"}))
    assert res["RotaryEmbedding"].startswith("sglang.srt")
    assert res["SiluAndMul"].startswith("sglang.srt")
    assert res["RMSNorm"] == "sglang_fl.sglang_glue.layer_hook"
    assert "RotaryEmbedding" not in log.read_text()
    res = result_of(run_python(BUILD_LAYERS, {"SGLANG_FL_OOT_ENABLED": "0"}))
    assert all(res[c].startswith("sglang.srt") for c in ("SiluAndMul", "RMSNorm", "RotaryEmbedding"))


def test_sglang_plugins_none_leaves_sglang_untouched(tmp_path):
    # On this "empty" install SGLang itself only imports with the import stand-ins, which the
    # .pth hook leaves off under __none__; activate them by hand to look at SGLang's own path.
    log = tmp_path / "d.log"
    code = "import sglang_fl.compat as c; c.activate()\n" + BUILD_LAYERS
    res = result_of(run_python(code, {"SGLANG_PLUGINS": "__none__",
                                      "SGLANG_FL_DISPATCH_LOG": str(log)}))
    assert all(res[c].startswith("sglang.srt") for c in ("SiluAndMul", "RMSNorm", "RotaryEmbedding"))
    assert not log.exists()


def test_bad_configuration_stops_start_up_with_the_message():
    proc = run_python(BUILD_LAYERS, {"SGLANG_FL_PREFER": "gpu"})
    assert proc.returncode != 0
    assert "SGLANG_FL_PREFER='gpu'" in proc.stderr and "flagos, vendor, reference" in proc.stderr


LOAD_ONLY = r"""
from sglang.srt.plugins import load_plugins
load_plugins()
print("RESULT{}")
"""


def test_strict_with_unavailable_backend_fails_at_plugin_load_naming_every_op():
    proc = run_python(LOAD_ONLY, {"SGLANG_FL_STRICT": "1", "SGLANG_FL_PREFER": "flagos",
                                  "SGLANG_FL_PLATFORM": "cpu"})
    assert proc.returncode != 0 and "RESULT" not in proc.stdout  # before any model is built
    assert ("sglang-fl: No available implementation for ops "
            f"{', '.join(map(repr, OP_NAMES))} (SGLANG_FL_STRICT=1") in proc.stderr
    for op in OP_NAMES:
        assert f"  {op}: accepts flagos (strict); no flagos: flagos: import flag_gems failed" in \
            proc.stderr
        assert "; registered: reference" in proc.stderr
    assert "Traceback" not in proc.stderr  # one message, not a stack from deep in model building


def test_strict_only_checks_the_routed_ops():
    proc = run_python(LOAD_ONLY, {"SGLANG_FL_STRICT": "1", "SGLANG_FL_PREFER": "flagos",
                                  "SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_OOT_WHITELIST": "RMSNorm"})
    assert proc.returncode != 0
    # The whitelist names layer classes; the GDN ops SGLang calls as functions (called_as) are
    # always checked: in empty mode nothing else serves those calls.
    assert ("No available implementation for ops 'rms_norm', 'gdn_gating', 'chunk_gated_delta_rule'"
            in proc.stderr)
    assert "silu_and_mul" not in proc.stderr and "rotary_embedding" not in proc.stderr


def test_preferred_kind_unavailable_is_logged_once_per_op_at_plugin_load():
    proc = run_python(BUILD_LAYERS, {"SGLANG_FL_PREFER": "vendor", "SGLANG_FL_PLATFORM": "cpu"})
    result_of(proc)
    lines = [ln for ln in proc.stderr.splitlines() if "preferred vendor unavailable" in ln]
    assert [ln.split("] ", 1)[1].split(":", 1)[0] for ln in lines] == list(OP_NAMES)  # once each
    for ln in lines:
        assert ln.startswith("[sglang-fl WARNING]")
        assert "vendor.cuda: no CUDA device" in ln and "torch_npu is not installed" in ln
        assert "flagos unavailable (flagos: import flag_gems failed" in ln
        assert ln.endswith("; using reference(reference)")


def test_denying_every_backend_reports_no_available_implementation():
    proc = run_python(BUILD_LAYERS, {"SGLANG_FL_PER_OP": "rms_norm=vendor",
                                     "SGLANG_FL_DENY_VENDORS": "cuda"})
    assert proc.returncode != 0
    assert "No available implementation for op 'rms_norm'" in proc.stderr


PLATFORM_PRELUDE = r"""
from sglang.srt.platforms import current_platform
from sglang_fl.sglang_glue.adapters import get_adapter

def caps():
    adapter, mine = get_adapter(), getattr(current_platform, "capabilities", None)
    from sglang_fl.dispatch.backends import real_module_available
    return {"declared": hasattr(adapter.srt_platform_class(), "capabilities"),  # 0.5.23 on
            "sgl_kernel": real_module_available("sgl_kernel")[0],
            "caps": {f: getattr(mine, f) for f in ("graph_capture", "supports_triton", "supports_pynccl",
                                                   "hicache_device_kernels")} if mine else None}
"""
PLATFORM = PLATFORM_PRELUDE + r"""
print("RESULT" + __import__("json").dumps({"repr": repr(current_platform), "oot": current_platform.is_out_of_tree(),
      "cpu": current_platform.is_cpu(), "dist": current_platform.get_torch_distributed_backend_str(),
      "graphs": current_platform.support_cuda_graph(), "mem": current_platform.get_device_total_memory() > 0,
      "pinned": current_platform.is_pin_memory_available(), **caps()}))
"""
# What a CPU host can ask of a PlatformFL made for another device (no device calls).
PLATFORM_CAPS = PLATFORM_PRELUDE + r"""
print("RESULT" + __import__("json").dumps({"repr": repr(current_platform),
      "pinned": current_platform.is_pin_memory_available(), **caps()}))
"""


def test_platform_entry_point_returns_platform_fl_keeping_sglang_identity():
    res = result_of(run_python(PLATFORM))
    assert res["repr"].startswith("PlatformFL(platform=cpu")
    assert res["cpu"] and not res["oot"] and not res["graphs"] and res["mem"] and not res["pinned"]
    assert res["dist"] == "gloo"
    if res["declared"]:  # SGLang's own CPU platform declares graph capture only
        assert res["caps"] == {"graph_capture": True, "supports_triton": False,
                               "supports_pynccl": False, "hicache_device_kernels": False}


def test_platform_fl_on_cuda_declares_what_sglangs_cuda_platform_can_do():
    """From 0.5.23 SGLang reads the platform's capability declaration before capturing decode
    CUDA graphs, using Triton KV writers or PyNccl (the base class says no to each: seen on the
    H200 as eager decode at 28 tok/s). In empty mode HiCache's sgl_kernel kernels are absent."""
    res = result_of(run_python(PLATFORM_CAPS, {"SGLANG_FL_PLATFORM": "cuda"}))
    assert res["repr"].startswith("PlatformFL(platform=cuda") and res["pinned"]
    if res["declared"]:
        assert res["caps"] == {"graph_capture": True, "supports_triton": True,
                               "supports_pynccl": True, "hicache_device_kernels": res["sgl_kernel"]}


def test_moe_op_left_without_an_implementation_stops_plugin_load():
    """SGLANG_FL_DENY_VENDORS=cuda with SGLANG_FL_STRICT=1 and an MoE op that may only run on a
    vendor (no flagos/reference impl acceptable): the server never starts, with the op named."""
    proc = run_python(LOAD_ONLY, {"SGLANG_FL_PLATFORM": "cpu", "SGLANG_FL_STRICT": "1",
                                  "SGLANG_FL_DENY_VENDORS": "cuda", "SGLANG_FL_PER_OP": "topk=vendor"})
    assert proc.returncode != 0 and "RESULT" not in proc.stdout
    assert "No available implementation for op 'topk': accepts vendor (strict)" in proc.stderr
    assert "vendor 'cuda' in SGLANG_FL_DENY_VENDORS" in proc.stderr or "no CUDA device" in proc.stderr
