"""compose.yaml + the override files (three vendors and CPU): valid against the official
compose-spec schema, and rendered by Compose v2 into the commands each layout must run:
(a) two nodes on one host as two containers on the layout's own bridge network (profile
``pair``), (b) one node per host on host networking (profile ``node``) with NODE_RANK /
MASTER_ADDR from the environment. The rendered commands go through the image's entrypoint and
SGLang 0.5.11's own argument parser. (`nox -s compose-cpu` runs the pair for real.)"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from pkg_helpers import PLATFORMS, ROOT, compose_command, run, tool

COMPOSE_FILES = ["compose.yaml", *(f"compose.{v}.yaml" for v in PLATFORMS)]
LAYOUT_VARS = ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "TP", "NNODES", "PORT", "MODEL_NAME",
               "MODEL_DIR", "SOCKET_IFNAME", "SGLANG_FL_IMAGE", "PAIR_DEVICE0", "PAIR_DEVICE1",
               "SGLANG_FL_DIST_BACKEND", "PUBLISH_ADDR", "SERVER_ARGS", "HEALTH_INTERVAL",
               "LEADER_TIMEOUT", "CPU_OMP_THREADS_BIND", "SHM_SIZE", "COMPOSE_PROFILES", "COMPOSE_FILE",
               "COMPOSE_PROJECT_NAME")


def render(vendor: str, env: dict[str, str] | None = None) -> dict:
    """`compose config` for one vendor; no .env file, only the variables given here."""
    return _render(vendor, tuple(sorted((env or {}).items())))


@functools.cache
def _render(vendor: str, env_items: tuple) -> dict:
    return render_all(vendor, env_items)["services"]


def render_all(vendor: str, env_items: tuple = ()) -> dict:
    """The whole rendered project, both profiles (Compose v2 leaves a profiled service out of
    `config` unless its profile is named)."""
    env = dict(env_items)
    empty_env_file = Path(tempfile.gettempdir()) / "sglang-fl-empty.env"
    empty_env_file.write_text("")
    clean = {k: v for k, v in os.environ.items() if k not in LAYOUT_VARS}
    result = run([*compose_command(), "--project-directory", str(ROOT),
                  "-f", str(ROOT / "compose.yaml"), "-f", str(ROOT / f"compose.{vendor}.yaml"),
                  "--env-file", str(empty_env_file), "--profile", "pair", "--profile", "node",
                  "config"],
                 env={**clean, **env}, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def expected_command(rank, addr, tp, port, model="/models/model"):
    return ["launch_server", "--model-path", model, "--tp", str(tp), "--nnodes", "2",
            "--node-rank", str(rank), "--dist-init-addr", addr, "--host", "0.0.0.0",
            "--port", str(port)]


def test_compose_files_match_the_compose_spec_schema():
    result = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
                  *(str(ROOT / f) for f in COMPOSE_FILES)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_pair_layout_two_containers_on_a_user_defined_network(vendor):
    project = render_all(vendor)
    services = project["services"]
    assert set(services) == {"node", "node0", "node1"}
    pair = {name: s for name, s in services.items() if s.get("profiles") == ["pair"]}
    assert set(pair) == {"node0", "node1"}
    assert pair["node0"]["command"] == expected_command(0, "node0:50000", 2, 30000)
    assert pair["node1"]["command"] == expected_command(1, "node0:50000", 2, 30000)
    assert project["networks"]["tp"]["driver"] == "bridge"
    for name, s in pair.items():
        assert s["image"] == f"flagos/sglang-fl:{vendor}"
        assert "network_mode" not in s and list(s["networks"]) == ["tp"]
        assert s["hostname"] == name  # the leader address node0 is its name on that network
        # own IPC namespace: with the host's, SGLang takes both containers for one node and
        # waits on a loopback socket across network namespaces (seen in compose-cpu)
        assert "ipc" not in s and s["shm_size"] == "17179869184"
        assert s["environment"]["GLOO_SOCKET_IFNAME"] == "eth0"  # the bridge interface
        assert s["environment"]["SGLANG_FL_PORT"] == s["command"][-1]  # healthcheck's port
    # only the leader publishes the API
    (published,) = pair["node0"]["ports"]
    assert (published["target"], str(published["published"])) == (30000, "30000")
    assert "ports" not in pair["node1"]


def test_pair_layout_takes_port_address_and_server_args_from_the_environment():
    env = {"PORT": "31234", "PUBLISH_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "SERVER_ARGS": "--dtype float32", "HEALTH_INTERVAL": "3s", "LEADER_TIMEOUT": "60"}
    services = render("cpu", env)
    assert services["node1"]["command"] == expected_command(1, "node0:29500", 2, 31234)
    (published,) = services["node0"]["ports"]
    assert (published["host_ip"], str(published["published"]), published["target"]) == \
        ("127.0.0.1", "31234", 31234)
    for name in ("node0", "node1"):
        s = services[name]
        assert s["environment"]["SGLANG_FL_EXTRA_ARGS"] == "--dtype float32"
        assert s["environment"]["SGLANG_FL_LEADER_TIMEOUT"] == "60"
        assert s["healthcheck"]["interval"] == "3s"


def test_cpu_override_uses_gloo_one_core_per_rank_and_no_unlimited_memlock():
    for name, s in render("cpu").items():
        assert s["image"] == "flagos/sglang-fl:cpu"
        assert s["environment"]["SGLANG_FL_DIST_BACKEND"] == "gloo", name  # no FlagCX on CPU
        assert s["environment"]["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
        assert s["environment"]["GLOO_SOCKET_IFNAME"] == "eth0"  # compose.yaml's env kept
        # an engine without CAP_SYS_RESOURCE refuses memlock -1 ("error setting rlimit type 8")
        assert s["ulimits"]["memlock"] == 65536 and s["ulimits"]["stack"] == 67108864


@pytest.mark.parametrize("vendor", PLATFORMS)
def test_node_layout_takes_rank_and_master_from_the_environment(vendor):
    env = {"NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "TP": "16", "MODEL_NAME": "Qwen2.5-72B",
           "SOCKET_IFNAME": "ib0", "MODEL_DIR": "/data/models"}
    node = render(vendor, env)["node"]
    assert node["profiles"] == ["node"]
    assert node["command"] == expected_command(1, "10.1.2.3:50000", 16, 30000,
                                               "/models/Qwen2.5-72B")
    assert node["network_mode"] == "host" and node["ipc"] == "host"
    for var in ("NCCL", "GLOO", "FLAGCX", "HCCL", "MCCL"):
        assert node["environment"][f"{var}_SOCKET_IFNAME"] == "ib0"
    assert node["environment"]["SGLANG_FL_DIST_BACKEND"] == ("gloo" if vendor == "cpu" else "flagcx")
    assert any(str(v).startswith("/data/models:/models") or
               (isinstance(v, dict) and v.get("source") == "/data/models")
               for v in node["volumes"])
    assert node["healthcheck"]["test"] == ["CMD", "sglang-fl-entrypoint", "healthcheck"]
    assert node["restart"] == "on-failure:3"
    assert node["ulimits"]["memlock"] == (65536 if vendor == "cpu" else -1)  # RDMA: unlimited


def test_node_layout_defaults_to_rank_zero_on_loopback():
    node = render("cuda")["node"]
    assert node["command"] == expected_command(0, "127.0.0.1:50000", 2, 30000)


def test_device_reservations_per_vendor():
    cuda = render("cuda")
    (req,) = cuda["node"]["deploy"]["resources"]["reservations"]["devices"]
    assert req["driver"] == "nvidia" and req["capabilities"] == ["gpu"]
    assert req["count"] == -1  # "all", as Compose v2 writes it
    for name, dev in (("node0", "0"), ("node1", "1")):
        (req,) = cuda[name]["deploy"]["resources"]["reservations"]["devices"]
        assert req["driver"] == "nvidia" and req["device_ids"] == [dev]

    ascend = render("ascend")
    common = {"/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"}

    def devices(service):  # Compose v2 writes each as {source, target, permissions}
        found = {d["source"] for d in service["devices"]}
        assert all(d["target"] == d["source"] for d in service["devices"])
        return found

    assert devices(ascend["node"]) == common | {f"/dev/davinci{i}" for i in range(8)}
    assert devices(ascend["node0"]) == common | {"/dev/davinci0"}
    assert devices(ascend["node1"]) == common | {"/dev/davinci1"}
    mounts = " ".join(map(str, ascend["node"]["volumes"]))
    for path in ("/usr/local/Ascend/driver/lib64", "/usr/local/dcmi", "/usr/local/bin/npu-smi"):
        assert path in mounts

    musa = render("musa")
    assert musa["node"]["environment"]["MTHREADS_VISIBLE_DEVICES"] == "all"
    assert musa["node0"]["environment"]["MTHREADS_VISIBLE_DEVICES"] == "0"
    assert musa["node1"]["environment"]["MTHREADS_VISIBLE_DEVICES"] == "1"


@pytest.mark.parametrize("layout", ["pair", "node"])
def test_rendered_commands_run_launch_server_with_sglangs_own_parser(layout, fake_python, tmp_path):
    from sglang.srt.server_args import ServerArgs

    services = render("cuda", {"NODE_RANK": "1", "MASTER_ADDR": "10.1.2.3", "TP": "16",
                               "SERVER_ARGS": "--dtype float32 --mem-fraction-static 0.8"})
    names = ["node0", "node1"] if layout == "pair" else ["node"]
    for name in names:
        command = services[name]["command"]
        out = tmp_path / f"{name}.argv"
        env = {k: str(v) for k, v in services[name]["environment"].items()}
        result = run([str(ROOT / "docker" / "entrypoint.sh"), *command],
                     env={**os.environ, **env, "SGLANG_FL_PYTHON": str(fake_python),
                          "ARGV_OUT": str(out),
                          "SGLANG_FL_PORT_FILE": str(tmp_path / f"{name}.port")})
        assert result.returncode == 0, result.stderr
        argv = out.read_text().splitlines()
        assert argv[:2] == ["-m", "sglang.launch_server"]
        assert argv[2:] == command[1:] + ["--dtype", "float32", "--mem-fraction-static", "0.8"], \
            "SERVER_ARGS appended; nothing else added: host and port are explicit"
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        ns = parser.parse_args(argv[2:])
        rank = {"node0": 0, "node1": 1, "node": 1}[name]
        assert (ns.nnodes, ns.node_rank) == (2, rank)
        assert ns.tensor_parallel_size == (2 if layout == "pair" else 16)
        assert ns.dist_init_addr == ("node0:50000" if layout == "pair" else "10.1.2.3:50000")
        assert ns.dtype == "float32"
        assert (tmp_path / f"{name}.port").read_text().strip() == str(ns.port)
