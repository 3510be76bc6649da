"""The image entrypoint (run here as the plain script it is), the CI entry points and the nox
session list: what `docker run IMAGE ...` and CI runners execute."""

from __future__ import annotations

import http.server
import os
import shutil
import sys
import threading
import time

import pytest
import yaml
from pkg_helpers import ROOT, run, tool

ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
SESSIONS = {"tests", "tests-sglang-0.5.23", "lint", "demo", "smoke-cpu", "image-cpu", "compose-cpu", "smoke-cuda",
            "smoke-ascend", "smoke-musa"}


def entry(*args, tmp_path, fake_python=None, **env):
    full = {**os.environ, "SGLANG_FL_PORT_FILE": str(tmp_path / "port"),
            "ARGV_OUT": str(tmp_path / "argv"), **env}
    if fake_python:
        full["SGLANG_FL_PYTHON"] = str(fake_python)
    return run([str(ENTRYPOINT), *args], env=full)


def test_launch_server_adds_container_defaults_only_when_missing(tmp_path, fake_python):
    r = entry("launch_server", "--model-path", "/models/m", "--tp", "2",
              tmp_path=tmp_path, fake_python=fake_python)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "argv").read_text().splitlines() == [
        "-m", "sglang.launch_server", "--model-path", "/models/m", "--tp", "2",
        "--host", "0.0.0.0", "--port", "30000"]
    assert (tmp_path / "port").read_text().strip() == "30000"

    r = entry("launch_server", "--model-path", "m", "--port=31234", "--host", "127.0.0.1",
              tmp_path=tmp_path, fake_python=fake_python, SGLANG_FL_PORT="1")
    assert (tmp_path / "argv").read_text().splitlines() == [
        "-m", "sglang.launch_server", "--model-path", "m", "--port=31234", "--host", "127.0.0.1"]
    assert (tmp_path / "port").read_text().strip() == "31234"

    r = entry("launch_server", "--model-path", "m", tmp_path=tmp_path, fake_python=fake_python,
              SGLANG_FL_PORT="30500", SGLANG_FL_HOST="::")
    assert (tmp_path / "argv").read_text().splitlines()[-4:] == ["--host", "::", "--port", "30500"]


def test_extra_args_from_the_environment_are_appended(tmp_path, fake_python):
    r = entry("launch_server", "--model-path", "m", "--port", "31000", tmp_path=tmp_path,
              fake_python=fake_python, SGLANG_FL_EXTRA_ARGS=" --dtype  float32 --tp 2 ")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "argv").read_text().splitlines() == [
        "-m", "sglang.launch_server", "--model-path", "m", "--port", "31000", "--dtype",
        "float32", "--tp", "2", "--host", "0.0.0.0"]


def test_launch_server_stops_on_a_failed_preflight(tmp_path):
    """The real preflight (this interpreter) runs before SGLang: its exit status and message
    are the container's; SGLang is never started."""
    r = entry("launch_server", "--model-path", str(tmp_path / "absent"), tmp_path=tmp_path,
              SGLANG_FL_PYTHON=sys.executable)
    assert r.returncode == 2
    assert f"model path {tmp_path / 'absent'} does not exist" in r.stderr
    assert not (tmp_path / "argv").exists()


def test_smoke_and_passthrough_commands(tmp_path, fake_python):
    r = entry("smoke", "--layers", "1", tmp_path=tmp_path, fake_python=fake_python)
    assert r.returncode == 0
    assert (tmp_path / "argv").read_text().splitlines() == ["-m", "sglang_fl.smoke", "--layers", "1"]
    r = entry("sh", "-c", "echo passthrough $0", "ok", tmp_path=tmp_path)
    assert r.stdout.strip() == "passthrough ok"
    r = entry("false", tmp_path=tmp_path)
    assert r.returncode == 1
    r = entry(tmp_path=tmp_path)  # the image's CMD is `help`
    assert "launch_server ARGS" in r.stdout and r.returncode == 0


def test_vendor_env_scripts_are_sourced_when_present(tmp_path):
    script = tmp_path / "set_env.sh"
    # like real vendor scripts, it has a failing command (must not abort under `set -e`)
    script.write_text("false\nexport ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest\n")
    r = entry("sh", "-c", "echo $ASCEND_TOOLKIT_HOME", tmp_path=tmp_path,
              SGLANG_FL_ENV_SCRIPTS=f"{script} {tmp_path}/absent.sh")
    assert r.returncode == 0 and r.stdout.strip() == "/usr/local/Ascend/ascend-toolkit/latest"


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 - http.server API
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_healthcheck_reads_the_recorded_port(tmp_path, health_server):
    port = health_server.server_address[1]
    py = {"SGLANG_FL_PYTHON": sys.executable}
    (tmp_path / "port").write_text(f"{port}\n")
    assert entry("healthcheck", tmp_path=tmp_path, **py).returncode == 0
    _Health.status = 503
    try:
        r = entry("healthcheck", tmp_path=tmp_path, **py)
        assert r.returncode == 1 and "unhealthy" in r.stdout
    finally:
        _Health.status = 200
    (tmp_path / "port").unlink()
    r = entry("healthcheck", tmp_path=tmp_path, SGLANG_FL_PORT=str(port), **py)
    assert r.returncode == 0  # no port file: SGLANG_FL_PORT
    health_server.shutdown()
    time.sleep(0.2)
    assert entry("healthcheck", tmp_path=tmp_path, SGLANG_FL_PORT=str(port), **py).returncode == 1


def test_shell_scripts_pass_shellcheck():
    scripts = [ENTRYPOINT, ROOT / "ci" / "cpu-pipeline.sh", ROOT / "ci" / "gpu-smoke.sh",
               ROOT / ".ci" / "run"]
    r = run([tool("shellcheck"), *map(str, scripts)])
    assert r.returncode == 0, r.stdout + r.stderr
    for script in scripts:
        assert os.access(script, os.X_OK), f"{script} is not executable"


def test_ci_entry_points_call_existing_nox_sessions():
    cpu = (ROOT / "ci" / "cpu-pipeline.sh").read_text()
    assert "sessions=(lint tests tests-sglang-0.5.23 smoke-cpu)" in cpu
    assert "sessions+=(image-cpu compose-cpu)" in cpu
    assert "python3 -m nox -s image-cpu -- --sglang 0.5.23" in cpu
    gpu = (ROOT / "ci" / "gpu-smoke.sh").read_text()
    assert "python3 -m nox -s smoke-cuda" in gpu
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m nox -s tests" in ci
    assert "python3 -m nox -s image-cpu compose-cpu" in ci
    assert "python3 docker/host_engine.py check" in ci  # decides, and says why it skips


def test_example_workflow_is_valid_and_uses_the_entry_points():
    path = ROOT / "ci" / "github-actions.yml"
    r = run([tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", str(path)])
    assert r.returncode == 0, r.stdout + r.stderr
    jobs = yaml.safe_load(path.read_text())["jobs"]
    runs = {name: " ".join(s.get("run", "") for s in job["steps"]) for name, job in jobs.items()}
    assert "ci/cpu-pipeline.sh" in runs["cpu"]
    assert "ci/gpu-smoke.sh" in runs["smoke-cuda"]
    assert "nox -s smoke-${{ matrix.vendor }}" in runs["smoke-vendor"]


def nox_sessions() -> set[str]:
    """Every session nox finds in noxfile.py (selected `*` or not `-`), from `nox --list`."""
    pytest.importorskip("nox")
    r = run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "--list"])
    assert r.returncode == 0, r.stderr
    return {line[2:].split(" -> ")[0].strip() for line in r.stdout.splitlines()
            if line[:2] in ("* ", "- ")}


def test_nox_sessions_are_the_documented_ones():
    sessions = nox_sessions()
    assert set(sessions) == SESSIONS
    readme = (ROOT / "README.md").read_text()
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    for name in SESSIONS:
        assert f"nox -s {name}" in readme or f"`{name}`" in readme, f"README lacks session {name}"
        assert f"`{name}`" in deployment or f"nox -s {name}" in deployment


def test_smoke_vendor_session_fails_fast_without_its_devices(tmp_path):
    """No engine: it says so; an engine but no MUSA GPU (this host): it says that. Either way
    in seconds, before building anything."""
    pytest.importorskip("nox")
    start = time.monotonic()
    r = run([sys.executable, "-m", "nox", "-f", str(ROOT / "noxfile.py"), "-s", "smoke-musa"],
            cwd=tmp_path)
    assert r.returncode != 0
    assert time.monotonic() - start < 60
    out = r.stdout + r.stderr
    engine = run(["docker", "info"]) if shutil.which("docker") else None
    if engine is not None and engine.returncode == 0:
        assert "smoke-musa needs musa devices in the container, and this host has a Docker " \
               "engine but no Moore Threads GPU (no /dev/mtgpu* device)" in out
    else:
        assert "smoke-musa runs inside the musa image and needs a Docker engine" in out
    assert "docker build" not in out
