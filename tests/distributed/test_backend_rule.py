"""When Layer 3 takes over, which backend string PlatformFL reports, and the registration itself.

``register_hooks`` is only called for real in subprocesses: registering in the pytest process
would leave hooks in SGLang's process-wide HookRegistry for every later test.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from l3_helpers import clean_env

from sglang_fl.config import build_settings
from sglang_fl.distributed import (
    DistBackendError,
    dist_backend_string,
    engine_kind,
    register_hooks,
    resolve_backend,
)

pytestmark = pytest.mark.distributed


def settings(platform: str, **env: str):
    return build_settings(env={"SGLANG_FL_PLATFORM": platform, **env})


@pytest.mark.parametrize("platform, env, backend, engine, torch_backend", [
    ("cpu", {}, "gloo", "torch", "gloo"),
    ("cuda", {}, "nccl", None, "nccl"),
    ("ascend", {}, "hccl", None, "hccl"),
    ("musa", {}, "flagcx", "flagcx", "mccl"),
    ("cuda", {"SGLANG_FL_DIST_BACKEND": "flagcx"}, "flagcx", "flagcx", "nccl"),
    ("ascend", {"SGLANG_FL_DIST_BACKEND": "flagcx"}, "flagcx", "flagcx", "hccl"),
    # FLAGCX_PATH beats a platform YAML's default ...
    ("cuda", {"FLAGCX_PATH": "/opt/flagcx"}, "flagcx", "flagcx", "nccl"),
    ("musa", {"FLAGCX_PATH": "/opt/flagcx"}, "flagcx", "flagcx", "mccl"),
    # (on a CPU host too; a multi-rank CPU group then refuses FlagCX, see test_flagcx_binding)
    ("cpu", {"FLAGCX_PATH": "/opt/flagcx"}, "flagcx", "flagcx", "gloo"),
    # ... but not the user's explicit choice
    ("cuda", {"FLAGCX_PATH": "/opt/flagcx", "SGLANG_FL_DIST_BACKEND": "nccl"}, "nccl", None, "nccl"),
    ("cpu", {"SGLANG_FL_DIST_BACKEND": "gloo", "FLAGCX_PATH": "/x"}, "gloo", "torch", "gloo"),
])
def test_rule(platform, env, backend, engine, torch_backend):
    s = settings(platform, **env)
    assert resolve_backend(s) == backend
    assert engine_kind(s) == engine
    assert dist_backend_string(s) == torch_backend


def test_unknown_backend_is_a_clear_error():
    s = dataclasses.replace(settings("cpu"), dist_backend="mpi")
    with pytest.raises(DistBackendError) as err:
        resolve_backend(s)
    assert "SGLANG_FL_DIST_BACKEND='mpi'" in str(err.value)
    assert "nccl, hccl, flagcx, gloo" in str(err.value)


@pytest.mark.parametrize("platform", ["cuda", "ascend"])
def test_native_backends_register_nothing(platform):
    from sglang.srt.plugins.hook_registry import HookRegistry

    before = {k: list(v) for k, v in HookRegistry._hooks.items()}
    assert register_hooks(settings(platform)) is False
    assert {k: list(v) for k, v in HookRegistry._hooks.items()} == before


REGISTER_SCRIPT = r"""
import json, sys
from sglang_fl.config import get_settings
from sglang_fl.distributed import register_hooks
from sglang.srt.plugins.hook_registry import HookRegistry
settings = get_settings()
before = set(sys.modules)
did = register_hooks(settings)
added = set(sys.modules) - before
targets = sorted(t.rsplit(".", 1)[1] for t, hooks in HookRegistry._hooks.items()
                 if ".GroupCoordinator." in t)
heavy = sorted(m for m in added if m.startswith(("torch", "sglang.srt.distributed")))
print(json.dumps({"did": did, "targets": targets, "heavy": heavy}))
"""


def run_register(**env):
    proc = subprocess.run([sys.executable, "-c", REGISTER_SCRIPT], env=clean_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


ALL_TARGETS = sorted([
    "__init__", "destroy", "all_reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "reduce_scatter", "all_gatherv", "reduce_scatterv", "broadcast",
    "send", "recv", "broadcast_tensor_dict", "send_tensor_dict", "recv_tensor_dict"])


def test_gloo_registers_every_hook_cheaply():
    """Registration imports neither torch nor SGLang's parallel_state (SGLang does, later)."""
    out, _ = run_register(SGLANG_FL_PLATFORM="cpu")
    assert out == {"did": True, "targets": ALL_TARGETS, "heavy": []}


def test_nccl_registers_nothing_in_a_fresh_process():
    out, _ = run_register(SGLANG_FL_PLATFORM="cuda")
    assert out == {"did": False, "targets": [], "heavy": []}


def test_flagcx_without_library_registers_and_reports(tmp_path):
    """Start-up goes on (a one-rank server needs no library); the log names what is missing."""
    out, err = run_register(SGLANG_FL_PLATFORM="cuda", SGLANG_FL_DIST_BACKEND="flagcx",
                            FLAGCX_PATH=str(tmp_path))
    assert out["did"] is True and out["targets"] == ALL_TARGETS
    assert "FLAGCX_PATH" in err and str(tmp_path / "build" / "lib" / "libflagcx.so") in err
