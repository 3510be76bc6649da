#!/usr/bin/env python3
"""Kubernetes manifests for multi-node tensor-parallel serving: one LeaderWorkerSet (LWS, the
SGLang community's way to run a multi-node server on Kubernetes) plus a Service for the API.

LWS creates the pods of a group together and tells each one its place: ``LWS_WORKER_INDEX``
(0 for the leader) becomes ``--node-rank``, ``LWS_GROUP_SIZE`` becomes ``--nnodes`` and
``LWS_LEADER_ADDRESS`` (the leader pod's DNS name) is ``--dist-init-addr``; the leader, node
rank 0, serves the API. The containers run the same image, entrypoint and environment
contract as compose.yaml (SGLANG_FL_DIST_BACKEND, *_SOCKET_IFNAME, SGLANG_FL_EXTRA_ARGS,
SGLANG_FL_LEADER_TIMEOUT, ...).

    python3 deploy/kubernetes/render.py --vendor cuda --nodes 2 --devices 8 \\
        --model Qwen2.5-72B-Instruct --models-pvc models > lws.yaml
    kubectl apply -f lws.yaml          # needs the LWS controller installed in the cluster

The files deploy/kubernetes/sglang-fl-<vendor>.yaml are this script's output for 2 nodes with
the defaults (the test suite checks they are up to date).
"""

from __future__ import annotations

import argparse
import copy
import sys

import yaml

#: Per vendor: the device plugin's resource name and the host paths the pods need (Ascend's
#: driver, mounted read-only as in compose.ascend.yaml).
VENDORS = {
    "cuda": {"resource": "nvidia.com/gpu", "host_paths": []},
    "ascend": {
        "resource": "huawei.com/Ascend910",
        "host_paths": ["/usr/local/Ascend/driver", "/usr/local/dcmi",
                       "/usr/local/bin/npu-smi", "/etc/ascend_install.info"],
    },
    "musa": {"resource": "mthreads.com/gpu", "host_paths": []},
}
PORT = 30000
DIST_PORT = 50000
SOCKET_VARS = ("NCCL", "GLOO", "FLAGCX", "HCCL", "MCCL")


def container_env(backend: str, ifname: str) -> list[dict]:
    env = {
        "SGLANG_FL_DIST_BACKEND": backend,
        "SGLANG_FL_LOG_LEVEL": "INFO",
        "SGLANG_FL_EXTRA_ARGS": "",
        "SGLANG_FL_LEADER_TIMEOUT": "600",
        "SGLANG_FL_PORT": str(PORT),
        **{f"{var}_SOCKET_IFNAME": ifname for var in SOCKET_VARS},
    }
    return [{"name": k, "value": v} for k, v in env.items()]


def pod_spec(args: argparse.Namespace) -> dict:
    vendor = VENDORS[args.vendor]
    command = [
        "launch_server",
        "--model-path", f"/models/{args.model}",
        "--tp", str(args.nodes * args.devices),
        # LWS sets these in every pod of the group; Kubernetes expands $(VAR) in args.
        "--nnodes", "$(LWS_GROUP_SIZE)",
        "--node-rank", "$(LWS_WORKER_INDEX)",
        "--dist-init-addr", f"$(LWS_LEADER_ADDRESS):{DIST_PORT}",
        "--host", "0.0.0.0",
        "--port", str(PORT),
    ]
    mounts = [{"name": "models", "mountPath": "/models", "readOnly": True},
              {"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [
        {"name": "models", "persistentVolumeClaim": {"claimName": args.models_pvc,
                                                     "readOnly": True}},
        # NCCL/HCCL shared-memory transports and torch's inter-process tensors need more than
        # a container's default 64 MB /dev/shm.
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": args.shm_size}},
    ]
    for i, path in enumerate(vendor["host_paths"]):
        name = f"driver-{i}"
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
        volumes.append({"name": name, "hostPath": {"path": path}})
    devices = {vendor["resource"]: args.devices}
    container = {
        "name": "sglang",
        "image": args.image or f"flagos/sglang-fl:{args.vendor}",
        "args": command,
        "env": container_env(args.dist_backend, args.socket_ifname),
        "ports": [{"name": "http", "containerPort": PORT},
                  {"name": "dist", "containerPort": DIST_PORT}],
        "resources": {"limits": devices, "requests": dict(devices)},
        # The leader answers /health once it serves; the workers answer it too (SGLang starts a
        # small health server on nodes of rank > 0).
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"},
                           "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
        "volumeMounts": mounts,
    }
    return {"containers": [container], "volumes": volumes}


def manifests(args: argparse.Namespace) -> list[dict]:
    name = args.name or f"sglang-fl-{args.vendor}"
    labels = {"app.kubernetes.io/name": "sglang-fl", "app.kubernetes.io/instance": name}
    spec = pod_spec(args)
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": args.replicas,
            "leaderWorkerTemplate": {
                "size": args.nodes,
                # A tensor-parallel group lives and dies together.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": {**labels, "role": "leader"}},
                                   "spec": copy.deepcopy(spec)},
                "workerTemplate": {"metadata": {"labels": {**labels, "role": "worker"}},
                                   "spec": copy.deepcopy(spec)},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"leaderworkerset.sigs.k8s.io/name": name, "role": "leader"},
            "ports": [{"name": "http", "port": PORT, "targetPort": "http"}],
        },
    }
    return [lws, service]


def render(argv: list[str] | None = None) -> str:
    args = parser().parse_args(argv)
    header = ("# Rendered by deploy/kubernetes/render.py " + " ".join(argv or []) + "\n"
              "# sglang-fl multi-node TP on Kubernetes with LeaderWorkerSet: see docs/deployment.md\n")
    return header + yaml.safe_dump_all(manifests(args), sort_keys=False, default_flow_style=False)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="deploy/kubernetes/render.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vendor", choices=sorted(VENDORS), default="cuda")
    ap.add_argument("--nodes", type=_positive, default=2, help="pods per group (nodes); default 2")
    ap.add_argument("--devices", type=_positive, default=8,
                    help="accelerators per node; --tp is nodes x devices (default 8)")
    ap.add_argument("--model", default="model", help="folder under /models (default: model)")
    ap.add_argument("--models-pvc", default="models",
                    help="PersistentVolumeClaim holding the models, mounted read-only at /models")
    ap.add_argument("--image", help="image (default flagos/sglang-fl:<vendor>)")
    ap.add_argument("--name", help="LWS and Service name (default sglang-fl-<vendor>)")
    ap.add_argument("--replicas", type=_positive, default=1, help="independent groups (default 1)")
    ap.add_argument("--dist-backend", default="flagcx", help="SGLANG_FL_DIST_BACKEND (flagcx)")
    ap.add_argument("--socket-ifname", default="eth0",
                    help="interface of the pod network, for every collective library (eth0)")
    ap.add_argument("--shm-size", default="16Gi", help="size limit of the /dev/shm volume")
    return ap


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


if __name__ == "__main__":
    sys.stdout.write(render(sys.argv[1:]))
