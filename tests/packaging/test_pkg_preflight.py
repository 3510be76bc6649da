"""sglang_fl.preflight: what the image entrypoint checks before `launch_server`, so that bad
input stops a container in seconds with the reason instead of SGLang hanging or retrying
(`nox -s image-cpu` checks the same three cases in real containers)."""

from __future__ import annotations

import os
import re
import socket
import sys
import time

import pytest
from pkg_helpers import run

from sglang_fl import preflight
from sglang_fl.serving import free_port


def preflight_cli(*args: str, **env: str):
    """The preflight on ``args``; with a free ``--port`` where they name none (the default,
    30000, may be in use on a developer's host)."""
    if "--" in args and not any(a.split("=")[0] == "--port" for a in args):
        args = (*args, "--port", str(free_port()))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_FL_")}
    return run([sys.executable, "-m", "sglang_fl.preflight", *args], env={**clean, **env},
               timeout=60)


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "models" / "tiny"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"x")
    return path


def test_a_good_single_node_passes(model):
    r = preflight_cli("--", "--model-path", str(model), "--tp", "2")
    assert r.returncode == 0, r.stderr
    assert f"ok: platform cpu; model {model}" in r.stderr


def test_missing_model_path_names_the_path_and_the_fix(model):
    absent = model.parent / "Qwen2.5-7B"
    r = preflight_cli("--", "--model-path", str(absent))
    assert r.returncode == 2
    assert f"model path {absent} does not exist; {model.parent} holds: tiny" in r.stderr
    assert "-v HOST_DIR:/models:ro" in r.stderr
    assert "(HF_HUB_OFFLINE unset, downloads on)" in r.stderr
    r = preflight_cli("--")
    assert r.returncode == 2 and "launch_server needs --model-path" in r.stderr


def test_a_folder_without_config_and_a_hub_id(model):
    r = preflight_cli("--", "--model", str(model.parent))
    assert r.returncode == 2 and "is a directory without config.json" in r.stderr
    r = preflight_cli("--", "--model-path", "Qwen/Qwen2.5-0.5B-Instruct")
    assert r.returncode == 0
    assert "not a local path: SGLang fetches it from the Hugging Face Hub" in r.stderr


@pytest.mark.parametrize("path", ["gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "s3://bucket/model",
                                  "dummy"])
def test_what_sglang_reads_itself_passes(path):
    """A one-word Hub id (gpt2) and a remote source are not missing local paths."""
    assert preflight.check_model_path(path).startswith(f"model {path} (")


@pytest.mark.parametrize("path", ["./tiny", "../models/tiny", "/models/tiny", "a/b/c", "~/tiny",
                                  "org--x/name"])
def test_a_path_that_looks_local_and_is_absent_is_refused(path):
    with pytest.raises(preflight.PreflightError, match=f"model path {re.escape(path)} does not "
                       "exist.*A local path is never downloaded, whatever the hub-offline setting"):
        preflight.check_model_path(path)


def test_with_downloads_off_a_hub_id_must_be_in_the_cache(tmp_path):
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--cached" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("0" * 40)
    code = ("import sys; from sglang_fl import preflight as p\n"
            "try: print(p.check_model_path(sys.argv[1]))\n"
            "except p.PreflightError as e: print('error:', e)")
    def check(model, **env):
        clean = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
        return run([sys.executable, "-c", code, model], env={**clean, "HF_HUB_CACHE": str(cache),
                                                             **env}, timeout=60).stdout
    assert "fetches it from the Hugging Face Hub" in check("org/absent")
    out = check("org/absent", HF_HUB_OFFLINE="1")
    assert out.startswith(f"error: model org/absent is neither a local path nor in the Hugging "
                          f"Face cache ({cache}), and HF_HUB_OFFLINE=1, downloads off"), out
    assert "hf download org/absent" in out
    assert "from the Hugging Face cache" in check("org/cached", HF_HUB_OFFLINE="1")
    assert "error: model path /models/x does not exist" in check("/models/x", HF_HUB_OFFLINE="1")
    assert "(HF_HUB_OFFLINE=1, downloads off)" in check("/models/x", HF_HUB_OFFLINE="1")


def test_unreadable_model_files_are_named(model, monkeypatch):
    """(Root reads everything, so the permission is simulated; safetensors writes 0600.)"""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: not str(p).endswith(".safetensors")
                        and real(p, mode))
    with pytest.raises(preflight.PreflightError, match=r"1 file\(s\) of .* cannot be read by "
                       r"uid \d+, e.g. .*model.safetensors: make the model readable"):
        preflight.check_model_path(str(model))


def test_a_wrong_platform_name_is_refused_with_the_accepted_ones(model):
    r = preflight_cli("--", "--model-path", str(model), SGLANG_FL_PLATFORM="nvidia")
    assert r.returncode == 2
    assert "SGLANG_FL_PLATFORM='nvidia' is not accepted" in r.stderr
    assert "cuda, ascend, musa, cpu" in r.stderr


def test_a_worker_that_cannot_reach_its_leader_stops_with_the_address(model):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    r = preflight_cli("--leader-timeout", "2", "--", "--model-path", str(model), "--nnodes", "2",
                      "--node-rank", "1", "--dist-init-addr", f"127.0.0.1:{port}")
    assert r.returncode == 3
    assert time.monotonic() - start < 20
    assert f"node 1 cannot reach the leader (node 0) at 127.0.0.1:{port} after 2 s " \
           "(ConnectionRefusedError" in r.stderr
    r = preflight_cli("--leader-timeout", "1", "--", "--model-path", str(model), "--nnodes", "2",
                      "--node-rank", "1", "--dist-init-addr", "no-such-leader.invalid:50000")
    assert r.returncode == 3 and "no-such-leader.invalid:50000" in r.stderr
    r = preflight_cli("--", "--model-path", str(model), "--nnodes", "2", "--node-rank", "1")
    assert r.returncode == 2 and "node 1 of 2 needs --dist-init-addr" in r.stderr


def test_a_worker_goes_on_once_its_leader_listens_and_the_leader_never_waits(model):
    with socket.socket() as leader:
        leader.bind(("127.0.0.1", 0))
        leader.listen()
        addr = f"127.0.0.1:{leader.getsockname()[1]}"
        r = preflight_cli("--leader-timeout", "5", "--", "--model-path", str(model), "--nnodes",
                          "2", "--node-rank", "1", "--dist-init-addr", addr)
        assert r.returncode == 0, r.stderr
        assert f"leader {addr} reachable" in r.stderr
    r = preflight_cli("--leader-timeout", "1", "--", "--model-path", str(model), "--nnodes", "2",
                      "--node-rank", "0", "--dist-init-addr", "127.0.0.1:1")
    assert r.returncode == 0 and "leader" not in r.stderr
    assert preflight.split_host_port("[fd00::1]:50000") == ("fd00::1", 50000)
    with pytest.raises(preflight.PreflightError, match="is not HOST:PORT"):
        preflight.split_host_port("node0")


def test_a_taken_http_port_is_refused_with_the_address_and_the_fix(model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert preflight.port_in_use("127.0.0.1", port) == \
            f"127.0.0.1:{port}: address already in use"
        assert preflight.port_in_use("0.0.0.0", port) == f"0.0.0.0:{port}: address already in use"
        r = preflight_cli("--", "--model-path", str(model), "--host", "127.0.0.1",
                          f"--port={port}")
        assert r.returncode == 2, r.stderr
        assert (f"sglang-fl preflight: error: --port {port} (--host 127.0.0.1) cannot be served: "
                f"127.0.0.1:{port}: address already in use, by another process. Stop that "
                "process or pass another --port") in r.stderr
    # Free again. A socket bound with SO_REUSEADDR that does not listen (as one in TIME_WAIT)
    # does not stop uvicorn's bind, so it is not "in use"; nor is an address this host lacks
    # (the server reports that itself).
    assert preflight.port_in_use("127.0.0.1", port) is None
    with socket.socket() as bound:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind(("127.0.0.1", port))
        assert preflight.port_in_use("127.0.0.1", port) is None
    assert preflight.port_in_use("no-such-host.invalid", port) is None
    assert preflight.check_http_port(None, port) == f"port 127.0.0.1:{port} free"
