"""What ``nox -s image-cpu`` and ``nox -s compose-cpu`` do with a real Docker engine.

image-cpu    build flagos/sglang-fl:cpu (engine and base image made here if missing), run the
             smoke suite inside it and `sglang-fl doctor` (verdict ok), serve the tiny model
             with `docker run ... launch_server`, send one /v1/chat/completions request from
             the host, check the HEALTHCHECK turns
             healthy, and check that bad input (missing model, wrong platform name, unreachable
             leader) stops a container within seconds with its reason.
compose-cpu  the compose `pair` layout with compose.cpu.yaml: TP=2 over two containers on the
             layout's own bridge network; greedy ids equal a TP=1 container's; both health
             checks green; `down` leaves no container or network behind.

Standard library only: nox runs these with the interpreter it runs on (``python=False``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import host_engine

ROOT = Path(__file__).resolve().parent.parent
IMAGE_CPU = "flagos/sglang-fl:cpu"
MODEL_NAME = "tiny"
PROMPT = "Hello world, please write a small model"
MAX_NEW_TOKENS = 12
# Both servers of the id comparison run in float32 (a float32 checkpoint would get float16).
SERVER_ARGS = ("--dtype", "float32")


class ImageCheckError(RuntimeError):
    pass


def _docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise ImageCheckError(f"docker {shlex.join(args)} failed ({result.returncode}): "
                              f"{(result.stdout + result.stderr).strip()[-2000:]}")
    return result


# SGLang derives more ports from --port (its gRPC port is port + 10000 and must stay <= 65535),
# so the OS's ephemeral range (up to 60999) is not safe: pick below it (as sglang_fl.serving).
PORT_RANGE = (20000, 50000)


def free_port() -> int:
    import random

    for _ in range(200):
        port = random.randrange(*PORT_RANGE)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port in {PORT_RANGE} on 127.0.0.1")


def split_posargs(posargs: list[str]) -> dict[str, str]:
    """``--image IMG`` (skip the build, use IMG), ``--base IMG`` (build on IMG) and
    ``--sglang VERSION`` (build with that SGLang of docker/stacks/cpu.ini, tagged
    ``flagos/sglang-fl:cpu-sglangVERSION``)."""
    opts, it = {}, iter(posargs)
    for arg in it:
        key, sep, value = arg.partition("=")
        if key in ("--image", "--base", "--sglang"):
            value = value if sep else next(it, "")
            if not value:
                raise ImageCheckError(f"{key} needs a value")
            opts[key[2:]] = value
        else:
            raise ImageCheckError(f"unknown argument {arg!r}; accepted: --image IMG, --base IMG, "
                                  "--sglang VERSION")
    if "image" in opts and "sglang" in opts:
        raise ImageCheckError("--sglang picks what to build; --image skips the build: give one")
    return opts


def cpu_image_tag(opts: dict[str, str]) -> str:
    return opts.get("image") or (f"{IMAGE_CPU}-sglang{opts['sglang']}" if "sglang" in opts else IMAGE_CPU)


def prepare(session, need_compose: bool = False) -> None:
    """Engine (and Compose v2) ready, or stop the session with the reason."""
    try:
        session.log(host_engine.ensure_engine())
        if need_compose:
            session.log(host_engine.ensure_compose())
    except host_engine.HostError as exc:
        session.error(f"no Docker engine for this session: {exc}")


def build_image(session, vendor: str, tag: str, base: str | None = None,
                sglang: str | None = None) -> None:
    """`docker build` of docker/<vendor>/Dockerfile with the classic builder (no BuildKit: it
    would contact Docker Hub for a frontend), this host's pip settings and CA certificates;
    ``sglang``: the image's SGLANG_VERSION build argument (else the stack's default)."""
    args = ["docker", "build", "--network", "host", "-f", f"docker/{vendor}/Dockerfile",
            "-t", tag]
    if sglang:
        args += ["--build-arg", f"SGLANG_VERSION={sglang}"]
    if base is None and vendor == "cpu":
        session.log(host_engine.ensure_base_image())
        base = host_engine.BASE_IMAGE
    if base:
        args += ["--build-arg", f"BASE_IMAGE={base}"]
    if host_engine.vendor_wheels_are_local(vendor):
        # The host's own wheel folder has the vendor torch: no lookups in PyTorch's index.
        args += ["--build-arg", "VENDOR_INDEX_URL="]
    start = time.monotonic()
    with host_engine.pip_build_args() as pip_args:
        session.run(*args, *pip_args, ".", external=True, env={"DOCKER_BUILDKIT": "0"})
    size = _docker("image", "inspect", tag, "--format", "{{.Size}}").stdout.strip()
    session.log(f"built {tag} in {time.monotonic() - start:.0f} s, "
                f"{int(size) / 1e9:.2f} GB")


def make_model_dir(image: str) -> Path:
    """The embedded tiny Qwen2, written by the image itself into a host folder to mount."""
    path = Path(tempfile.mkdtemp(prefix="sglang-fl-models-"))
    path.chmod(0o755)  # the image's user (uid 10001) reads it through a read-only mount
    # (safetensors writes its file 0600: open it to the image's user, as a model store would)
    _docker("run", "--rm", "--user", "0", "-v", f"{path}:/models", image, "bash", "-c",
            f"sglang-fl make-tiny-model /models/{MODEL_NAME} && chmod -R a+rX /models",
            timeout=300)
    return path


def container_state(name: str) -> tuple[str, str]:
    out = _docker("inspect", name, "--format",
                  "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{end}}",
                  check=False).stdout.split()
    return (out[0] if out else "gone"), (out[1] if len(out) > 1 else "")


def health_report(name: str) -> str:
    """Why a container is not healthy: its restarts, its last health probes' exit codes and
    output, and its log lines other than the per-call collective lines (which fill a tail)."""
    state = _docker("inspect", name, "--format", "{{json .State}} {{.RestartCount}}",
                    check=False).stdout.strip()
    try:
        raw, restarts = state.rsplit(" ", 1)
        doc = json.loads(raw)
    except ValueError:
        return f"{name}: no state ({state!r})"
    probes = (doc.get("Health") or {}).get("Log") or []
    lines = [f"{name}: {doc.get('Status')}, health {(doc.get('Health') or {}).get('Status')}, "
             f"{restarts} restart(s), exit code {doc.get('ExitCode')}"]
    lines += [f"  probe {p.get('Start', '')[:19]}: exit {p.get('ExitCode')}: "
              f"{(p.get('Output') or '').strip()[-300:]}" for p in probes[-3:]]
    kept = [line for line in logs(name, 100000).splitlines() if " through CommunicatorFL" not in line]
    lines += ["  " + line for line in kept[:40]]
    if len(kept) > 80:
        lines.append(f"  ... {len(kept) - 80} lines ...")
    lines += ["  " + line for line in kept[max(40, len(kept) - 40):]]
    return "\n".join(lines)


def logs(name: str, lines: int = 60) -> str:
    r = _docker("logs", "--tail", str(lines), name, check=False)
    return (r.stdout + r.stderr).strip()


def wait_healthy(names: list[str], timeout: float = 420) -> float:
    """Until every container's HEALTHCHECK says healthy; a container that stops fails at once."""
    start = time.monotonic()
    while True:
        states = {n: container_state(n) for n in names}
        dead = [n for n, (status, _) in states.items() if status not in ("running", "created")]
        if dead:
            raise ImageCheckError(f"{dead[0]} stopped ({states[dead[0]][0]}):\n{logs(dead[0])}")
        if all(health == "healthy" for _, health in states.values()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise ImageCheckError(f"not healthy within {timeout:.0f} s: {states}\n"
                                  + "\n".join(logs(n, 30) for n in names))
        time.sleep(2)


def post(port: int, path: str, payload: dict, timeout: float = 180) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise ImageCheckError(f"POST {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None


def greedy_ids(port: int) -> list[int]:
    body = post(port, "/generate", {"text": PROMPT, "sampling_params": {
        "temperature": 0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True}})
    ids = body["output_ids"]
    if len(ids) != MAX_NEW_TOKENS:
        raise ImageCheckError(f"/generate returned {len(ids)} ids, wanted {MAX_NEW_TOKENS}: {body}")
    return ids


def run_server(image: str, name: str, model_dir: Path, port: int, *server_args: str) -> None:
    """`docker run -d IMAGE launch_server ...`, the API published on 127.0.0.1:port only."""
    _docker("run", "-d", "--name", name, "--health-interval", "3s",
            "-p", f"127.0.0.1:{port}:30000", "-v", f"{model_dir}:/models:ro", image,
            "launch_server", "--model-path", f"/models/{MODEL_NAME}", *server_args)


def remove(*names: str) -> None:
    for name in names:
        _docker("rm", "-f", name, check=False, timeout=60)


# ---------------------------------------------------------------------------------------------


BAD_INPUTS = (
    # (what, docker run options, launch_server args, exit status, message in the log)
    ("missing model path", [], ["--model-path", "/models/absent"], 2,
     "model path /models/absent does not exist"),
    ("wrong platform name", ["-e", "SGLANG_FL_PLATFORM=nvidia"],
     ["--model-path", f"/models/{MODEL_NAME}"], 2,
     "SGLANG_FL_PLATFORM='nvidia' is not accepted"),
    ("unreachable leader", ["--network", "none", "-e", "SGLANG_FL_LEADER_TIMEOUT=5"],
     ["--model-path", f"/models/{MODEL_NAME}", "--tp", "2", "--nnodes", "2", "--node-rank", "1",
      "--dist-init-addr", "node0:50000"], 3,
     "node 1 cannot reach the leader (node 0) at node0:50000 after 5 s"),
)


def check_bad_inputs(session, image: str, model_dir: Path) -> None:
    for what, opts, args, status, message in BAD_INPUTS:
        start = time.monotonic()
        r = _docker("run", "--rm", "-v", f"{model_dir}:/models:ro", *opts, image,
                    "launch_server", *args, check=False, timeout=90)
        out = r.stdout + r.stderr
        if r.returncode != status or message not in out:
            raise ImageCheckError(f"{what}: wanted exit {status} and {message!r}, got exit "
                                  f"{r.returncode}:\n{out[-2000:]}")
        line = next(ln for ln in out.splitlines() if message in ln)
        session.log(f"bad input, {what}: exit {r.returncode} in {time.monotonic() - start:.1f} s: "
                    f"{line.strip()[:160]}")


def image_cpu(session) -> None:
    opts = _posargs(session)
    prepare(session)
    image = cpu_image_tag(opts)
    if "image" not in opts:
        build_image(session, "cpu", image, opts.get("base"), opts.get("sglang"))
    name = f"sglang-fl-image-cpu-{os.getpid()}"
    model_dir = None
    try:
        start = time.monotonic()
        session.run("docker", "run", "--rm", "--ipc=host", image, "smoke", "--no-skip",
                    external=True)
        session.log(f"smoke suite inside {image}: passed in {time.monotonic() - start:.0f} s")
        # the suite's doctor check accepts warnings (a device image may pass over a kind for
        # some op); the CPU image has none to have: its verdict must be ok
        doctor = _docker("run", "--rm", image, "sglang-fl", "doctor", "--json", check=False)
        if doctor.returncode != 0:
            session.error(f"sglang-fl doctor in {image} exited {doctor.returncode}: "
                          f"{(doctor.stdout + doctor.stderr)[-2000:]}")
        session.log(f"sglang-fl doctor in {image}: {json.loads(doctor.stdout)['verdict']}")

        model_dir = make_model_dir(image)
        port = free_port()
        run_server(image, name, model_dir, port)
        took = wait_healthy([name])
        session.log(f"docker run {image} launch_server: healthy after {took:.0f} s")
        body = post(port, "/v1/chat/completions", {
            "model": "default", "max_tokens": 16, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello to the chip."}]})
        reply = body["choices"][0]["message"]["content"]
        if not body["usage"]["completion_tokens"]:
            raise ImageCheckError(f"empty completion: {body}")
        session.log(f"chat reply from the container ({body['usage']['completion_tokens']} "
                    f"tokens): {reply!r}")
        dispatch = [ln for ln in logs(name, 400).splitlines() if "[OOT-DISPATCH]" in ln]
        if not dispatch:
            raise ImageCheckError("no [OOT-DISPATCH] line in the server log: plugin not loaded?")
        session.log("dispatch: " + "; ".join(ln.split("[OOT-DISPATCH]")[1].strip()
                                             for ln in dispatch))
        # A clean stop is no crash: `docker stop` (SIGTERM, drain) leaves exit status 0.
        _docker("stop", "--time", "60", name, timeout=120)
        status = _docker("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        if status != "0":
            raise ImageCheckError(f"docker stop: exit status {status}, wanted 0:\n{logs(name, 40)}")
        session.log("docker stop: exit status 0")
        remove(name)
        check_bad_inputs(session, image, model_dir)
    except ImageCheckError as exc:
        session.error(str(exc))
    finally:
        remove(name)
        if model_dir:
            shutil.rmtree(model_dir, ignore_errors=True)


def compose_cpu(session) -> None:
    opts = _posargs(session)
    prepare(session, need_compose=True)
    image = cpu_image_tag(opts)
    if "image" not in opts:
        build_image(session, "cpu", image, opts.get("base"), opts.get("sglang"))
    project = f"sglang-fl-compose-cpu-{os.getpid()}"
    single = f"{project}-tp1"
    port = free_port()
    compose = ["docker", "compose", "-p", project, "-f", "compose.yaml", "-f", "compose.cpu.yaml",
               "--profile", "pair"]
    model_dir = None
    up = False
    try:
        model_dir = make_model_dir(image)
        run_server(image, single, model_dir, port, *SERVER_ARGS)
        wait_healthy([single])
        reference = greedy_ids(port)
        remove(single)
        session.log(f"TP=1 container, greedy ids: {reference}")

        env = {"SGLANG_FL_IMAGE": image, "MODEL_DIR": str(model_dir), "MODEL_NAME": MODEL_NAME,
               "PORT": str(port), "PUBLISH_ADDR": "127.0.0.1", "HEALTH_INTERVAL": "3s",
               # SGLang's own warm-up gives the leader a fixed 120 s to answer itself, then
               # kills it: on a loaded 2-core CI host node0 missed it once (2026-12-05) and
               # node1 lost its peer. The health check and the request below wait instead.
               "SERVER_ARGS": " ".join((*SERVER_ARGS, "--skip-server-warmup")),
               "LEADER_TIMEOUT": "120"}
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}, **env}
        start = time.monotonic()
        up = True
        result = subprocess.run([*compose, "up", "-d", "--wait", "--wait-timeout", "420"],
                                env=env, cwd=ROOT, capture_output=True, text=True)
        if result.returncode != 0:
            raise ImageCheckError("compose up --wait failed:\n" + result.stderr[-2000:])
        names = [f"{project}-node0-1", f"{project}-node1-1"]
        health = {n: container_state(n)[1] for n in names}
        if set(health.values()) != {"healthy"}:
            raise ImageCheckError(f"health after up --wait: {health}")
        session.log(f"compose pair up, both healthy after {time.monotonic() - start:.0f} s")
        network = _docker("inspect", names[1], "--format",
                          "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}").stdout
        if f"{project}_tp" not in network.split():
            raise ImageCheckError(f"node1 is on {network!r}, not the pair's network")
        ids = greedy_ids(port)
        session.log(f"TP=2 over two containers ({project}_tp), greedy ids: {ids}")
        if ids != reference:
            raise ImageCheckError(f"TP=2 ids {ids} differ from TP=1 ids {reference}")
        node1 = logs(names[1], 2000)
        if "rank 1: first all_reduce through CommunicatorFL" not in node1:
            raise ImageCheckError("node1 never ran an all_reduce through sglang-fl's Layer 3:\n"
                                  + node1[-2000:])
        session.log("TP=2 ids equal TP=1 ids; node1's all_reduce went through CommunicatorFL")
    except ImageCheckError as exc:
        if up:
            out = subprocess.run([*compose, "logs", "--tail", "40"], cwd=ROOT, capture_output=True,
                                 text=True, env={**os.environ, "MODEL_DIR": str(model_dir)})
            session.log(out.stdout[-6000:])
            for name in (f"{project}-node0-1", f"{project}-node1-1"):
                session.log(health_report(name))
        session.error(str(exc))
    finally:
        remove(single)
        if up:
            down_env = {**os.environ, "MODEL_DIR": str(model_dir), "PORT": str(port)}
            subprocess.run([*compose, "down", "--volumes", "--remove-orphans", "--timeout", "30"],
                           cwd=ROOT, env=down_env, capture_output=True, text=True)
        if model_dir:
            shutil.rmtree(model_dir, ignore_errors=True)
    left = [_docker(kind, "ls", "-aq" if kind == "container" else "-q", "--filter",
                    f"label=com.docker.compose.project={project}").stdout.split()
            for kind in ("container", "network", "volume")]
    if any(left):
        session.error(f"`compose down` left behind: containers {left[0]}, networks {left[1]}, "
                      f"volumes {left[2]}")
    session.log("compose down: no container, network or volume of the project left")


def _posargs(session) -> dict[str, str]:
    try:
        return split_posargs(list(session.posargs))
    except ImageCheckError as exc:
        session.error(str(exc))  # raises: the session stops here
        return {}
