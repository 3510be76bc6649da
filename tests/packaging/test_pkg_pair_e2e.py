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

import pytest
from pkg_helpers import ROOT
from test_pkg_compose import render

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.distributed]


def _start(command, env, log):
    return subprocess.Popen([str(ROOT / "docker" / "entrypoint.sh"), *command], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _healthy(env) -> bool:
    r = subprocess.run([str(ROOT / "docker" / "entrypoint.sh"), "healthcheck"], env=env,
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0


def test_pair_layout_serves_with_tp2_across_two_nodes(tmp_path):
    from sglang_fl.models import make_tiny_model
    from sglang_fl.serving import free_port

    model = make_tiny_model(tmp_path / "models" / "model")
    master = str(free_port())
    services = render("cpu", {"MASTER_PORT": master})
    ports = {"node0": free_port(), "node1": free_port()}
    procs, logs, envs = [], [], []
    try:
        for name in ("node0", "node1"):
            svc = services[name]
            assert svc["environment"]["SGLANG_FL_DIST_BACKEND"] == "gloo"
            host_side = {"/models/model": str(model), f"node0:{master}": f"127.0.0.1:{master}",
                         "30000": str(ports[name])}
            command = [host_side.get(arg, arg) for arg in svc["command"]]
            env = {**os.environ, **{k: str(v) for k, v in svc["environment"].items()},
                   "SGLANG_FL_PYTHON": sys.executable,
                   "SGLANG_FL_PORT_FILE": str(tmp_path / f"{name}.port"),
                   "SGLANG_FL_PORT": str(ports[name]),
                   "SGLANG_FL_PLATFORM": "cpu",
                   "GLOO_SOCKET_IFNAME": "lo"}
            if (os.cpu_count() or 1) < 2:
                env["SGLANG_CPU_OMP_THREADS_BIND"] = "0|0"
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed in finally
            logs.append(log)
            envs.append(env)
            procs.append(_start(command, env, log))
        deadline = time.monotonic() + 420
        while not all(_healthy(e) for e in envs):
            dead = [p.returncode for p in procs if p.poll() is not None]
            assert not dead, "a node exited: " + (tmp_path / "node0.log").read_text()[-3000:] + \
                (tmp_path / "node1.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "nodes not healthy in 420 s"
            time.sleep(3)

        req = urllib.request.Request(
            f"http://127.0.0.1:{ports['node0']}/generate",
            data=json.dumps({"text": "Hello", "sampling_params": {
                "max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            body = json.loads(resp.read())
        assert body["meta_info"]["completion_tokens"] == 8
        node1 = (tmp_path / "node1.log").read_text(errors="replace")
        assert "rank 1: first all_reduce through CommunicatorFL" in node1
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        for log in logs:
            log.close()
