"""The compose ``pair`` layout without Docker: both rendered node commands (compose.yaml +
compose.cpu.yaml, Compose v2) run through the image entrypoint on this host (CPU, tiny model),
node 0 answers /generate, node 1 answers /health, and the TP=2 collectives cross the two
"nodes" through sglang-fl's Layer 3. `nox -s compose-cpu` runs the same layout in containers.

Deviations from a container run, each forced by running both nodes in one network namespace:
the model path's ``/models`` prefix is mapped to a temp dir (the volume), the leader's address
``node0`` (its name on the pair's network) is 127.0.0.1, each node gets its own free port
instead of 30000 in its own container, and the collectives use ``lo`` instead of ``eth0``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pkg_helpers import ROOT
from test_pkg_compose import render

from sglang_fl.serving import PORT_ATTEMPTS, log_tail, lost_a_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.distributed]


def _healthy(env) -> bool:
    r = subprocess.run([str(ROOT / "docker" / "entrypoint.sh"), "healthcheck"], env=env,
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def _tails(logs: dict[str, Path]) -> str:
    return "".join(f"\n--- {name} log (last lines) ---\n{log_tail(path, 60)}"
                   for name, path in logs.items())


def _start_pair(tmp_path, model, attempt: int):
    """Both nodes' processes, on fresh ports; (processes, environments, log paths)."""
    from sglang_fl.serving import free_port

    master = str(free_port())
    services = render("cpu", {"MASTER_PORT": master})
    procs, envs, logs = [], [], {}
    for name in ("node0", "node1"):
        svc = services[name]
        assert svc["environment"]["SGLANG_FL_DIST_BACKEND"] == "gloo"
        port = free_port()
        host_side = {"/models/model": str(model), f"node0:{master}": f"127.0.0.1:{master}",
                     "30000": str(port)}
        command = [host_side.get(arg, arg) for arg in svc["command"]]
        env = {**os.environ, **{k: str(v) for k, v in svc["environment"].items()},
               "SGLANG_FL_PYTHON": sys.executable,
               "SGLANG_FL_PORT_FILE": str(tmp_path / f"{name}-{attempt}.port"),
               "SGLANG_FL_PORT": str(port),
               "SGLANG_FL_PLATFORM": "cpu",
               "GLOO_SOCKET_IFNAME": "lo"}
        if (os.cpu_count() or 1) < 2:
            env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|0"
        logs[name] = tmp_path / f"{name}-{attempt}.log"
        with open(logs[name], "wb") as log:
            procs.append(subprocess.Popen(
                [str(ROOT / "docker" / "entrypoint.sh"), *command], env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))
        envs.append(env)
    return procs, envs, logs


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, 15)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait(timeout=30)


def test_pair_layout_serves_with_tp2_across_two_nodes(tmp_path):
    """The ports come from `free_port`; one taken by another process (the SGLang 0.5.23 suite
    runs beside this one in CI) before a node binds it stops that node (preflight, or compat
    fix:http_port_in_use), and the pair is started again on fresh ports, as `launched_server`
    does for one server. (.ci/run leaves it to `nox -s compose-cpu` when that runs too: the same
    rendered layout in two containers, whose TP=2 ids must equal TP=1's and whose node 1 must
    log its all_reduce through CommunicatorFL.)"""
    if os.environ.get("SGLANG_FL_TEST_IMAGE_CPU_RUNS") == "1":
        pytest.skip("nox -s compose-cpu runs the pair layout in containers in this CI run "
                    "(SGLANG_FL_TEST_IMAGE_CPU_RUNS=1)")
    from sglang_fl.models import make_tiny_model

    model = make_tiny_model(tmp_path / "models" / "model")
    procs: list = []
    try:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            procs, envs, logs = _start_pair(tmp_path, model, attempt)
            deadline = time.monotonic() + 420
            while not all(_healthy(e) for e in envs):
                if any(lost_a_port(path) for path in logs.values()):
                    break
                dead = [p.returncode for p in procs if p.poll() is not None]
                assert not dead, f"a node exited (status {dead}):" + _tails(logs)
                assert time.monotonic() < deadline, "nodes not healthy in 420 s:" + _tails(logs)
                time.sleep(3)
            else:
                break
            assert attempt < PORT_ATTEMPTS, f"ports lost {attempt} times:" + _tails(logs)
            _stop(procs)

        port0 = envs[0]["SGLANG_FL_PORT"]
        req = urllib.request.Request(
            f"http://127.0.0.1:{port0}/generate",
            data=json.dumps({"text": "Hello", "sampling_params": {
                "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            body = json.loads(resp.read())
        assert body["meta_info"]["completion_tokens"] == 8
        node1 = logs["node1"].read_text(errors="replace")
        assert "rank 1: first all_reduce through CommunicatorFL" in node1
    finally:
        _stop(procs)
