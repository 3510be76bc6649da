#!/usr/bin/env python3
"""Get what the image sessions need on a build host: a Docker engine, Compose v2, a local base
image, and this host's pip settings handed to ``docker build``.

Used by ``nox -s image-cpu`` / ``compose-cpu`` (imported) and by ``.ci/run`` (``check``). Each
step reuses what is already there and installs only what is missing, from Debian's archive, as
root: nothing has to be set up by hand on a fresh machine.

  python3 docker/host_engine.py check      exit 0 if an engine answers or can be started here,
                                           else 3 with a one-line reason
  python3 docker/host_engine.py engine     start (or reuse) the engine; print how
  python3 docker/host_engine.py compose    make `docker compose` v2 available
  python3 docker/host_engine.py base [IMAGE]   make local/debian:bookworm (debootstrap) if absent

Standard library only (it runs before any virtual environment exists).
"""

from __future__ import annotations

import contextlib
import fcntl
import http.server
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_IMAGE = "local/debian:bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
ENGINE_LOG = Path("/var/log/sglang-fl-dockerd.log")
LOCK = Path("/run/lock/sglang-fl-host-engine.lock")
COMPOSE_PLUGIN = Path("/usr/local/lib/docker/cli-plugins/docker-compose")
# Where a build looks for extra CA certificates (a TLS-intercepting proxy's): see the Dockerfiles.
BUILD_CA_DIR = ROOT / "docker" / "ca-certificates"
# Debian's place for locally added CAs; copied into BUILD_CA_DIR for builds on this host.
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
# Loopback port the local wheel folders are served on during a build. A fixed port keeps the
# build arguments, and with them Docker's layer cache, the same from run to run.
WHEEL_SERVER_PORT = 38411


class HostError(RuntimeError):
    """A step that cannot be done here; the message says which and why."""


def log(msg: str) -> None:
    print(f"host_engine: {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(cmd, **kwargs)


def _must(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    result = _run(cmd, **kwargs)
    if result.returncode != 0:
        out = ((result.stdout or "") + (result.stderr or "")).strip()
        raise HostError(f"{what} failed (exit {result.returncode}): {out[-1500:]}")
    return result


@contextlib.contextmanager
def _host_lock():
    """One installer/starter at a time on this host (parallel CI jobs, several checkouts)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------------------------


def engine_problem() -> str | None:
    """Why no Docker engine answers, or None when `docker info` does."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    try:
        probe = _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=20)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 20 s"
    if probe.returncode != 0:
        return "no Docker engine answers: " + " ".join(probe.stderr.split())[:300]
    return None


def start_problem() -> str | None:
    """None when an engine answers or this host can start one; else the one-line reason."""
    problem = engine_problem()
    if problem is None:
        return None
    if os.environ.get("DOCKER_HOST"):
        return f"DOCKER_HOST={os.environ['DOCKER_HOST']} is set but {problem}"
    if os.geteuid() != 0:
        return f"{problem}, and starting dockerd needs root"
    if shutil.which("dockerd") is None and shutil.which("apt-get") is None:
        return f"{problem}, dockerd is not installed and there is no apt-get to install it"
    return None


_apt_updated = False


def apt_install(*packages: str) -> None:
    """Install Debian packages (root). `apt-get update` once per process."""
    global _apt_updated
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise HostError(f"{' '.join(packages)} missing and cannot be installed here "
                        "(needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", "DPkg::Lock::Timeout=300"]
    if not _apt_updated:
        log("apt-get update")
        _must(["apt-get", *wait, "update", "-qq"], "apt-get update", env=env)
        _apt_updated = True
    log("apt-get install " + " ".join(packages))
    _must(["apt-get", *wait, "install", "-y", "-qq", "--no-install-recommends", *packages],
          "apt-get install " + " ".join(packages), env=env)


def ensure_engine(timeout: float = 90.0) -> str:
    """Reuse the engine that answers, or install docker.io and start dockerd in the background.
    Returns a line saying which."""
    if engine_problem() is None:
        return "reusing the Docker engine that answers `docker info`"
    reason = start_problem()
    if reason:
        raise HostError(reason)
    with _host_lock():
        if engine_problem() is None:
            return "reusing the Docker engine another job just started"
        if shutil.which("dockerd") is None:
            start = time.monotonic()
            apt_install("docker.io")
            log(f"docker.io installed in {time.monotonic() - start:.0f} s")
        ENGINE_LOG.parent.mkdir(parents=True, exist_ok=True)
        logfile = open(ENGINE_LOG, "ab")  # noqa: SIM115 - handed to the daemon
        # Detached: the engine outlives this session (later sessions reuse it); stop it with
        # `kill $(cat /var/run/docker.pid)`.
        proc = subprocess.Popen(["dockerd"], stdin=subprocess.DEVNULL, stdout=logfile,
                                stderr=subprocess.STDOUT, start_new_session=True)
        logfile.close()
        deadline = time.monotonic() + timeout
        while engine_problem() is not None:
            if proc.poll() is not None:
                raise HostError(f"dockerd exited with status {proc.returncode}: "
                                + _tail(ENGINE_LOG, 6))
            if time.monotonic() > deadline:
                raise HostError(f"dockerd (pid {proc.pid}) did not answer within {timeout:.0f} s: "
                                + _tail(ENGINE_LOG, 6))
            time.sleep(1)
    return f"started dockerd (pid {proc.pid}, log {ENGINE_LOG})"


def _tail(path: Path, lines: int) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ---------------------------------------------------------------------------------------------
# Compose v2
# ---------------------------------------------------------------------------------------------


def compose_version() -> str | None:
    """`docker compose` v2's version, or None."""
    if shutil.which("docker") is None:
        return None
    probe = _run(["docker", "compose", "version", "--short"])
    version = probe.stdout.strip().lstrip("v")
    if probe.returncode == 0 and re.match(r"^[2-9]\.", version):
        return version
    return None


def debian_mirror(etc_apt: Path = Path("/etc/apt")) -> str:
    """The Debian archive this host's apt uses (deb822 or one-line sources)."""
    sources = [etc_apt / "sources.list", *sorted((etc_apt / "sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file() or path.suffix not in ("", ".list", ".sources"):
            continue
        text = path.read_text(errors="replace")
        for uri in re.findall(r"^\s*URIs:\s*(\S+)", text, re.M) + re.findall(
                r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M):
            if "security" not in uri and "debian" in uri:
                return uri.rstrip("/")
    return DEFAULT_MIRROR


def ensure_compose() -> str:
    """Compose v2 as a CLI plugin. Debian bookworm has only v1; trixie's `docker-compose`
    package holds the v2 plugin binary: download that one .deb with a private apt list (the
    host's sources stay untouched) and install the binary."""
    version = compose_version()
    if version:
        return f"docker compose {version}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise HostError("`docker compose` (v2) is missing and cannot be installed here "
                        "(needs root and apt-get); install the Compose v2 CLI plugin")
    with _host_lock(), tempfile.TemporaryDirectory(prefix="sglang-fl-compose-") as tmp:
        if compose_version():
            return f"docker compose {compose_version()}"
        if shutil.which("docker") is None:
            apt_install("docker.io")  # the CLI the plugin belongs to
        work = Path(tmp)
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "cache" / "archives" / "partial").mkdir(parents=True)
        (work / "sources.list").write_text(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
            f"{debian_mirror()} trixie main\n")
        opts = ["-o", f"Dir::Etc::SourceList={work / 'sources.list'}",
                "-o", f"Dir::Etc::SourceParts={work / 'none'}",
                "-o", f"Dir::State::Lists={work / 'lists'}",
                "-o", f"Dir::Cache={work / 'cache'}", "-qq"]
        log("fetching Compose v2 from Debian trixie's docker-compose package")
        _must(["apt-get", *opts, "update"], "apt-get update (trixie list)")
        _must(["apt-get", *opts, "download", "docker-compose"], "apt-get download docker-compose",
              cwd=work)
        (deb,) = work.glob("docker-compose_*.deb")
        _must(["dpkg-deb", "-x", str(deb), str(work / "x")], "dpkg-deb -x")
        found = [p for p in (work / "x").rglob("docker-compose")
                 if p.is_file() and "cli-plugins" in str(p)]
        if not found:
            raise HostError(f"{deb.name} holds no cli-plugins/docker-compose binary")
        COMPOSE_PLUGIN.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(found[0], COMPOSE_PLUGIN)
        COMPOSE_PLUGIN.chmod(0o755)
    version = compose_version()
    if not version:
        raise HostError(f"installed {COMPOSE_PLUGIN} but `docker compose version` still fails")
    return f"docker compose {version} (installed {COMPOSE_PLUGIN})"


# ---------------------------------------------------------------------------------------------
# Base image
# ---------------------------------------------------------------------------------------------


def image_exists(image: str) -> bool:
    return _run(["docker", "image", "inspect", image]).returncode == 0


def ensure_base_image(image: str = BASE_IMAGE, suite: str = "bookworm") -> str:
    """A minimal Debian image made here with debootstrap (no registry needed), if absent."""
    if image_exists(image):
        return f"reusing {image}"
    if os.geteuid() != 0:
        raise HostError(f"{image} is absent and debootstrap needs root; pass another base image")
    with _host_lock():
        if image_exists(image):
            return f"reusing {image}"
        if shutil.which("debootstrap") is None:
            apt_install("debootstrap")
        mirror = debian_mirror()
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="sglang-fl-rootfs-", dir="/var/tmp") as tmp:
            log(f"debootstrap --variant=minbase {suite} ({mirror})")
            _must(["debootstrap", "--variant=minbase", suite, tmp, mirror], "debootstrap")
            rootfs = Path(tmp)
            for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for item in (rootfs / leftover).glob("*"):
                    if item.is_file():
                        item.unlink()
            security = mirror.rsplit("/", 1)[0] + "/debian-security"
            (rootfs / "etc/apt/sources.list").write_text(
                f"deb {mirror} {suite} main\n"
                f"deb {mirror} {suite}-updates main\n"
                f"deb {security} {suite}-security main\n")
            tar = subprocess.Popen(["tar", "-C", tmp, "-c", "."], stdout=subprocess.PIPE)
            imported = _run(["docker", "import", "--change", 'CMD ["bash"]', "-", image],
                            stdin=tar.stdout)
            tar.stdout.close()
            tar.wait()
            if imported.returncode != 0 or tar.returncode != 0:
                raise HostError(f"docker import {image} failed: {imported.stderr.strip()}")
    return f"made {image} with debootstrap in {time.monotonic() - start:.0f} s"


# ---------------------------------------------------------------------------------------------
# This host's pip settings, handed to `docker build`
# ---------------------------------------------------------------------------------------------


def _pip_config() -> dict[str, str]:
    """pip's effective global/install settings on this host: config files, then PIP_* env."""
    values: dict[str, str] = {}
    probe = _run([sys.executable, "-m", "pip", "config", "list"])
    for line in probe.stdout.splitlines():
        m = re.match(r"^(?::env:|global|install)\.([a-z-]+)='(.*)'$", line.strip())
        if m:
            values[m.group(1)] = m.group(2)
    for key in ("index-url", "extra-index-url", "find-links", "trusted-host"):
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            values[key] = env
    return values


def vendor_wheels_are_local(platform: str, python_tag: str = "cp311") -> bool:
    """Whether a local wheel folder in pip's settings (find-links) holds every vendor package
    of ``platform`` (cpu: torch 2.13.0's CPU build) for ``python_tag``. Then the stack's vendor
    index is not needed (``install_stack.py --vendor-index-url ''``): pip takes the local wheel,
    and no lookup goes to an index this host may not reach."""
    sys.path.insert(0, str(ROOT / "docker"))
    try:
        from install_stack import load_stack
    finally:
        sys.path.pop(0)
    specs = load_stack(platform).vendor_install
    folders = [Path(v[len("file://"):] if v.startswith("file://") else v)
               for v in _pip_config().get("find-links", "").split()]
    folders = [f for f in folders if f.is_dir()]
    if not specs or not folders:
        return False
    for spec in specs:
        name, _, version = spec.partition("==")
        stem = re.sub(r"[-_.]+", "_", name)
        pattern = re.compile(rf"^{re.escape(stem)}-{re.escape(version)}(\+[\w.]+)?-"
                             rf"({python_tag}|py3)-.*\.whl$", re.I)
        if not any(pattern.match(w.name) for f in folders for w in f.glob("*.whl")):
            return False
    return True


class _LocalDirs(http.server.SimpleHTTPRequestHandler):
    """Serves absolute paths below the allowed roots, read-only; nothing else."""

    roots: tuple[str, ...] = ()

    def translate_path(self, path):
        fs = os.path.realpath(urllib.parse.unquote(urllib.parse.urlsplit(path).path))
        if any(fs == r or fs.startswith(r + os.sep) for r in self.roots):
            return fs
        return "/nonexistent"

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def pip_build_args():
    """Build arguments carrying this host's pip settings into a build with `--network host`.

    Remote index URLs pass through as they are; local wheel folders and file:// indexes are
    served read-only on 127.0.0.1 for the duration of the build (a wheel folder as it is; for a
    file index the folder above it, since its links point to a folder beside it). Locally added CA certificates
    (Debian: /usr/local/share/ca-certificates) go into docker/ca-certificates/, which the
    Dockerfiles trust. Yields the list of ``--build-arg`` arguments."""
    config = _pip_config()
    roots: list[str] = []

    def local(value: str) -> str | None:
        if value.startswith("file://"):
            return urllib.parse.urlsplit(value).path
        if value.startswith("/") and os.path.isdir(value):
            return value
        return None

    for key in ("index-url", "extra-index-url", "find-links"):
        for value in config.get(key, "").split():
            if re.match(r"^[a-z+]+://[^/@]+@", value):
                raise HostError(f"pip {key} {value.split('@')[0]}@...: credentials in an index "
                                "URL would be written into the image history; use a proxy or "
                                "a token-free mirror for builds")
            path = local(value)
            if path:
                path = os.path.realpath(path)
                # a wheel folder is served as it is; a file index with the folder above it
                roots.append(path if key == "find-links" else os.path.dirname(path))
    server = None
    added: list[Path] = []
    try:
        base = ""
        if roots:
            handler = type("Handler", (_LocalDirs,), {"roots": tuple(sorted(set(roots)))})
            try:
                server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEEL_SERVER_PORT), handler)
            except OSError:  # another build serves there now: any port (this build misses cache)
                server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            base = f"http://127.0.0.1:{server.server_address[1]}"

        def rewrite(value: str) -> str:
            path = local(value)
            return base + urllib.parse.quote(os.path.realpath(path)) + "/" if path else value

        args = []
        for key in ("index-url", "extra-index-url", "find-links", "trusted-host"):
            if config.get(key):
                value = " ".join(rewrite(v) for v in config[key].split())
                args += ["--build-arg", f"PIP_{key.upper().replace('-', '_')}={value}"]
        BUILD_CA_DIR.mkdir(exist_ok=True)
        for crt in sorted(HOST_CA_DIR.rglob("*.crt")) if HOST_CA_DIR.is_dir() else []:
            dest = BUILD_CA_DIR / f"host-{crt.name}"
            if not dest.exists():
                shutil.copyfile(crt, dest)
                added.append(dest)
        yield args
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        for path in added:
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "check"
    try:
        if cmd == "check":
            reason = start_problem()
            if reason:
                print(f"no Docker engine here: {reason}")
                return 3
            print("a Docker engine answers" if engine_problem() is None
                  else "a Docker engine can be started here (root, dockerd/apt-get)")
            return 0
        if cmd == "engine":
            print(ensure_engine())
        elif cmd == "compose":
            print(ensure_compose())
        elif cmd == "base":
            print(ensure_base_image(argv[1] if len(argv) > 1 else BASE_IMAGE))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except HostError as exc:
        print(f"host_engine: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
