"""The compose ``pair`` layout for real, without Docker: both rendered node commands run
through the image entrypoint on this host (CPU, tiny model), node 0 answers /generate, node 1
answers /health, and the TP=2 collectives cross the two "nodes" through sglang-fl's Layer 3.

Deviations from a container run, each forced by the host: the model path's ``/models`` prefix is
mapped to a temp dir (the volume), the ports are free ones (host networking on a shared CI
host), Layer 3 uses gloo (no FlagCX CPU adaptor), and SGLang's CPU worker needs a core per rank
(``SGLANG_CPU_OMP_THREADS_BIND``)."""

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
    ports = {"PORT": str(free_port()), "PAIR_PORT1": str(free_port()),
             "MASTER_PORT": str(free_port())}
    services = render("cuda", ports)  # the layout is vendor-independent; cuda is the default
    procs, logs, envs = [], [], []
    try:
        for name in ("node0", "node1"):
            svc = services[name]
            command = [str(model) if arg == "/models/model" else arg for arg in svc["command"]]
            env = {**os.environ, **{k: str(v) for k, v in svc["environment"].items()},
                   "SGLANG_FL_PYTHON": sys.executable,
                   "SGLANG_FL_PORT_FILE": str(tmp_path / f"{name}.port"),
                   "SGLANG_FL_DIST_BACKEND": "gloo",
                   "SGLANG_FL_PLATFORM": "cpu",
                   "SGLANG_USE_CPU_ENGINE": "1",
                   "SGLANG_CPU_OMP_THREADS_BIND": "0|1" if (os.cpu_count() or 1) > 1 else "0|0"}
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
            f"http://127.0.0.1:{ports['PORT']}/generate",
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
