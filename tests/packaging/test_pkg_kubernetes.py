"""deploy/kubernetes: LeaderWorkerSet manifests for multi-node TP serving, rendered for 2 and 4
nodes and every vendor, validated with a real schema validator (kubernetes-validate's
Kubernetes schemas, strict, plus the LWS subset schema in deploy/kubernetes/schemas whose pod
templates refer to Kubernetes' own PodTemplateSpec), and checked for the product's contract:
leader = node rank 0, --dist-init-addr from the LWS leader address, /health readiness, shared
memory, the vendor's device resource, the same image and environment as compose.yaml. The
rendered args, with the values LWS injects, go through the entrypoint and SGLang's own parser."""

from __future__ import annotations

import argparse
import importlib.resources
import importlib.util
import json
import os
import re
import sys

import pytest
import yaml
from pkg_helpers import ROOT, VENDORS, run

K8S_DIR = ROOT / "deploy" / "kubernetes"
RENDER = K8S_DIR / "render.py"
LWS_SCHEMA = K8S_DIR / "schemas" / "leaderworkerset-v1.schema.json"
RESOURCE = {"cuda": "nvidia.com/gpu", "ascend": "huawei.com/Ascend910", "musa": "mthreads.com/gpu"}
K8S_VERSION = "1.34"


def render_text(*args: str) -> str:
    result = run([sys.executable, str(RENDER), *args])
    assert result.returncode == 0, result.stderr
    return result.stdout


def render(*args: str) -> tuple[dict, dict]:
    lws, service = yaml.safe_load_all(render_text(*args))
    return lws, service


def validator():
    """kubernetes-validate (PyPI) supplies the Kubernetes schemas and the jsonschema validator;
    a missing package fails where the run installs it (nox -s tests), else skips."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        if os.environ.get("SGLANG_FL_TEST_REQUIRE_TOOLS") == "1":
            pytest.fail("kubernetes-validate is required here but not installed")
        pytest.skip("kubernetes-validate is not installed (nox -s tests installs it)")
    import jsonschema
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    schemas = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    strict = sorted((p.name for p in schemas.iterdir() if p.name.endswith("-local-strict")),
                    key=lambda n: [int(x) for x in re.findall(r"\d+", n)])
    definitions = json.loads((schemas / strict[-1] / "_definitions.json").read_text())
    registry = Registry().with_resource(definitions["$id"], Resource.from_contents(definitions))
    lws = jsonschema.Draft202012Validator(json.loads(LWS_SCHEMA.read_text()), registry=registry)
    return lws, utils


def container(lws: dict, role: str) -> dict:
    (c,) = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("vendor", VENDORS)
def test_manifests_validate_against_the_schemas(vendor, nodes):
    lws_validator, k8s = validator()
    lws, service = render("--vendor", vendor, "--nodes", str(nodes))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in lws_validator.iter_errors(lws)]
    assert errors == []
    assert k8s.validate(service, K8S_VERSION, strict=True) == K8S_VERSION


def test_the_validator_rejects_what_kubernetes_would():
    """The schemas are strict where it matters: a misspelt pod field, an LWS field that does
    not exist, a wrong type all fail (so the passing test above means something)."""
    lws_validator, _ = validator()
    lws, _ = render()
    bad = json.loads(json.dumps(lws))
    container(bad, "worker")["readinessprobe"] = container(bad, "worker").pop("readinessProbe")
    assert any("readinessprobe" in e.message for e in lws_validator.iter_errors(bad))
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["groupSize"] = 2
    assert any("groupSize" in e.message for e in lws_validator.iter_errors(bad))
    bad = json.loads(json.dumps(lws))
    bad["spec"]["leaderWorkerTemplate"]["size"] = "2"
    assert list(lws_validator.iter_errors(bad))


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("vendor", VENDORS)
def test_group_layout_probe_shm_and_devices(vendor, nodes):
    lws, service = render("--vendor", vendor, "--nodes", str(nodes), "--devices", "8",
                          "--model", "Qwen2.5-72B-Instruct")
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == nodes
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert template["leaderTemplate"]["metadata"]["labels"]["role"] == "leader"
    for role in ("leader", "worker"):
        c = container(lws, role)
        assert c["image"] == f"flagos/sglang-fl:{vendor}"
        args = c["args"]
        assert args[0] == "launch_server"
        assert args[args.index("--tp") + 1] == str(nodes * 8)
        assert args[args.index("--nnodes") + 1] == "$(LWS_GROUP_SIZE)"
        # the leader is the pod LWS numbers 0: node rank 0, the one that serves the API
        assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert args[args.index("--dist-init-addr") + 1] == "$(LWS_LEADER_ADDRESS):50000"
        assert args[args.index("--model-path") + 1] == "/models/Qwen2.5-72B-Instruct"
        probe = c["readinessProbe"]["httpGet"]
        assert (probe["path"], probe["port"]) == ("/health", "http")
        assert {"name": "http", "containerPort": 30000} in c["ports"]
        assert c["resources"]["limits"] == {RESOURCE[vendor]: 8} == c["resources"]["requests"]
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert mounts["/models"]["readOnly"] is True
        volumes = {v["name"]: v for v in template[f"{role}Template"]["spec"]["volumes"]}
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
        assert volumes["models"]["persistentVolumeClaim"]["readOnly"] is True
        if vendor == "ascend":
            assert "/usr/local/Ascend/driver" in mounts
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
                                           "role": "leader"}


def test_environment_contract_is_compose_s():
    """The same variables as compose.yaml's nodes, with the same defaults."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    compose_env = compose["x-node"]["environment"]
    lws, _ = render()
    env = {e["name"]: e["value"] for e in container(lws, "worker")["env"]}
    assert set(env) == set(compose_env)
    for name, value in compose_env.items():
        default = re.fullmatch(r"\$\{\w+:-(.*)\}", value).group(1)
        assert env[name] == default, name


def test_committed_manifests_are_the_renderer_s_output():
    for vendor in VENDORS:
        path = K8S_DIR / f"sglang-fl-{vendor}.yaml"
        assert path.read_text() == render_text("--vendor", vendor), (
            f"{path} is stale: python3 deploy/kubernetes/render.py --vendor {vendor} > {path}")


def test_bad_renderer_input_is_refused():
    for args, message in ((["--vendor", "rocm"], "invalid choice: 'rocm'"),
                          (["--nodes", "0"], "0 is not a positive integer")):
        result = run([sys.executable, str(RENDER), *args])
        assert result.returncode == 2 and message in result.stderr


@pytest.mark.parametrize("nodes", [2, 4])
def test_each_pod_s_args_run_launch_server_with_sglangs_own_parser(nodes, fake_python, tmp_path):
    """What Kubernetes runs in pod i of the group: $(VAR) expanded with LWS's values, through
    the image entrypoint, parsed by SGLang 0.5.11's ServerArgs parser."""
    from sglang.srt.server_args import ServerArgs

    lws, _ = render("--nodes", str(nodes), "--devices", "4")
    leader = "sglang-fl-cuda-0.sglang-fl-cuda.default"
    for index in range(nodes):
        c = container(lws, "leader" if index == 0 else "worker")
        values = {"LWS_GROUP_SIZE": str(nodes), "LWS_WORKER_INDEX": str(index),
                  "LWS_LEADER_ADDRESS": leader}
        args = [re.sub(r"\$\((\w+)\)", lambda m, v=values: v[m.group(1)], a) for a in c["args"]]
        out = tmp_path / f"{index}.argv"
        env = {e["name"]: e["value"] for e in c["env"]}
        result = run([str(ROOT / "docker" / "entrypoint.sh"), *args],
                     env={**os.environ, **env, "SGLANG_FL_PYTHON": str(fake_python),
                          "ARGV_OUT": str(out), "SGLANG_FL_PORT_FILE": str(tmp_path / "port")})
        assert result.returncode == 0, result.stderr
        argv = out.read_text().splitlines()
        assert argv[:2] == ["-m", "sglang.launch_server"]
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        ns = parser.parse_args(argv[2:])
        assert (ns.nnodes, ns.node_rank, ns.tensor_parallel_size) == (nodes, index, nodes * 4)
        assert ns.dist_init_addr == f"{leader}:50000"
        assert (ns.host, ns.port) == ("0.0.0.0", 30000)
