"""docker/host_engine.py, the parts that need no root and no engine: reading this host's apt
and pip settings, and handing pip's local wheel folders and CA certificates to a build. (The
engine, Compose v2 and the debootstrap base image are exercised for real by `nox -s image-cpu`
and `compose-cpu`, which .ci/run runs.)"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

import pytest
from pkg_helpers import ROOT, run

sys.path.insert(0, str(ROOT / "docker"))
import host_engine  # noqa: E402 - docker/ is not a package


@pytest.fixture
def pip_env(monkeypatch, tmp_path):
    """pip settings from the environment only (no config file of this host)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_TRUSTED_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(host_engine, "BUILD_CA_DIR", tmp_path / "build-ca")
    monkeypatch.setattr(host_engine, "HOST_CA_DIR", tmp_path / "host-ca")
    return monkeypatch


def test_debian_mirror_from_deb822_and_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    assert host_engine.debian_mirror(tmp_path) == "http://deb.debian.org/debian"
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n")
    assert host_engine.debian_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list").write_text(
        "deb [signed-by=/k.gpg] http://other.example/debian bookworm main\n")
    assert host_engine.debian_mirror(tmp_path) == "http://other.example/debian"


def test_local_wheel_folders_and_file_indexes_are_served_to_the_build(pip_env, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    index = tmp_path / "pypi"
    (index / "simple" / "demo").mkdir(parents=True)
    (index / "files").mkdir()
    (index / "files" / "demo-1.0-py3-none-any.whl").write_bytes(b"demo")
    (index / "simple" / "demo" / "index.html").write_text(
        '<a href="../../files/demo-1.0-py3-none-any.whl">demo</a>')
    (tmp_path / "secret.txt").write_text("not for the build")
    (tmp_path / "host-ca").mkdir()
    (tmp_path / "host-ca" / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    pip_env.setenv("PIP_FIND_LINKS", str(wheels))
    pip_env.setenv("PIP_EXTRA_INDEX_URL", f"file://{index}/simple https://pypi.example/simple")

    with host_engine.pip_build_args() as args:
        values = dict(a.split("=", 1) for a in args[1::2])
        assert args[0::2] == ["--build-arg"] * len(values)
        links = values["PIP_FIND_LINKS"]
        assert links.startswith("http://127.0.0.1:") and links.endswith(f"{wheels}/")
        local, remote = values["PIP_EXTRA_INDEX_URL"].split()
        assert remote == "https://pypi.example/simple"
        page = urllib.request.urlopen(local + "demo/").read().decode()
        wheel = urllib.request.urlopen(local + "demo/" + page.split('"')[1]).read()
        assert wheel == b"demo"  # the index's relative link resolves beside it
        base = links.split(str(wheels))[0]
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(base + str(tmp_path / "secret.txt"))
        assert (tmp_path / "build-ca" / "host-proxy.crt").is_file()
    assert not (tmp_path / "build-ca" / "host-proxy.crt").exists()  # removed after the build
    with pytest.raises(OSError):
        urllib.request.urlopen(links, timeout=2)  # the server is gone


def test_credentials_in_an_index_url_are_refused(pip_env):
    pip_env.setenv("PIP_INDEX_URL", "https://user:token@pypi.example/simple")
    with pytest.raises(host_engine.HostError, match="credentials in an index URL"):
        with host_engine.pip_build_args():
            pass


def test_vendor_wheels_are_local_only_for_the_right_version_and_python(pip_env, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pip_env.setenv("PIP_FIND_LINKS", str(wheels))
    assert not host_engine.vendor_wheels_are_local("cpu")
    (wheels / "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert not host_engine.vendor_wheels_are_local("cpu")
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert host_engine.vendor_wheels_are_local("cpu", "cp311")
    assert not host_engine.vendor_wheels_are_local("cpu", "cp312")
    assert not host_engine.vendor_wheels_are_local("cuda")  # nothing to install: the base has it


def test_check_says_why_it_cannot_in_one_line(tmp_path):
    """What .ci/run prints when it skips the image sessions."""
    import os

    r = run([sys.executable, str(ROOT / "docker" / "host_engine.py"), "check"],
            env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/absent.sock"})
    assert r.returncode == 3
    (line,) = r.stdout.splitlines()
    assert line.startswith(f"no Docker engine here: DOCKER_HOST=unix://{tmp_path}/absent.sock "
                           "is set but ")
    assert host_engine.main(["no-such-command"]) == 2


def test_image_sessions_take_the_sglang_version_to_build():
    import image_tests

    opts = image_tests.split_posargs(["--sglang", "0.5.23", "--base=deb:12"])
    assert opts == {"sglang": "0.5.23", "base": "deb:12"}
    assert image_tests.cpu_image_tag(opts) == "flagos/sglang-fl:cpu-sglang0.5.23"
    assert image_tests.cpu_image_tag({}) == "flagos/sglang-fl:cpu"
    assert image_tests.cpu_image_tag({"image": "mine:1"}) == "mine:1"
    with pytest.raises(image_tests.ImageCheckError, match="give one"):
        image_tests.split_posargs(["--sglang", "0.5.23", "--image", "mine:1"])
    with pytest.raises(image_tests.ImageCheckError, match="accepted: --image IMG, --base IMG, --sglang"):
        image_tests.split_posargs(["--sglnag", "0.5.23"])
