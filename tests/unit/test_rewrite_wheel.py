"""ci/rewrite_wheel.py, which trims the GPU bundles' wheels: it keeps exactly what its options
say, and writes a RECORD that ``importlib.metadata`` reads back, also for a path with commas
(the 0.5.23 bundle's unquoted RECORD broke the GPU verify's overlay, 2026-12-05)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MOE = "pkg/configs/E=128,N=768,device_name=NVIDIA_H200.json"


def _tool():
    spec = importlib.util.spec_from_file_location("rewrite_wheel", ROOT / "ci" / "rewrite_wheel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name in ("pkg/__init__.py", "pkg/ops.so", "pkg/ops.pyx", MOE, "pkg/big/data.bin",
                     "pkg-1.0.dist-info/METADATA"):
            z.writestr(name, "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n"
                       if name.endswith("METADATA") else name)
        z.writestr("pkg-1.0.dist-info/RECORD", "whatever,,\n")
    return path


def test_drops_what_it_is_told_and_writes_a_readable_record(tmp_path):
    whl = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    assert _tool().main([str(whl), "--drop", "pkg/big/", "--drop-suffix", ".pyx"]) == 0
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    assert names == {"pkg/__init__.py", "pkg/ops.so", MOE, "pkg-1.0.dist-info/METADATA",
                     "pkg-1.0.dist-info/RECORD"}
    dist = md.PathDistribution(tmp_path / "site" / "pkg-1.0.dist-info")
    files = {str(f): f for f in dist.files}
    assert set(files) == names
    assert files[MOE].size == len(MOE) and files[MOE].hash.mode == "sha256"
    assert files["pkg-1.0.dist-info/RECORD"].hash is None


def test_only_and_keep_select_a_subset_and_a_second_run_changes_nothing(tmp_path):
    whl = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl")
    out = tmp_path / "out.whl"
    tool = _tool()
    options = ["--only", "pkg/", "--only-suffix", ".py", "--keep", "pkg/ops.so"]
    tool.main([str(whl), "--out", str(out), *options])
    with zipfile.ZipFile(out) as z:
        assert {n for n in z.namelist() if not n.startswith("pkg-1.0.dist-info/")} == {
            "pkg/__init__.py", "pkg/ops.so"}
    before = out.read_bytes()
    tool.main([str(out), *options])
    assert out.read_bytes() == before


def test_a_wheel_trimmed_with_an_unquoted_record_is_mended(tmp_path):
    """A bundle trimmed before RECORDs were quoted loses nothing on a second trim, but its
    RECORD is rewritten; the copy to another ``--out`` is the rewritten one."""
    whl = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("pkg/__init__.py", "")
        z.writestr(MOE, "{}")
        z.writestr("pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
        z.writestr("pkg-1.0.dist-info/RECORD",
                   f"pkg/__init__.py,sha256=x,0\n{MOE},sha256=y,2\npkg-1.0.dist-info/RECORD,,\n")
    tool = _tool()
    out = tmp_path / "out.whl"
    assert tool.main([str(whl), "--out", str(out)]) == 0
    with zipfile.ZipFile(out) as z:
        z.extractall(tmp_path / "site")
    dist = md.PathDistribution(tmp_path / "site" / "pkg-1.0.dist-info")
    assert MOE in {str(f) for f in dist.files}
    assert tool.rewrite(str(out), str(out), tool.keeper(_args()))[2] is False  # sound now
    assert oct(out.stat().st_mode & 0o777) == "0o644"


def _args():
    import argparse

    return argparse.Namespace(drop=[], drop_suffix=[], only=[], only_suffix=[], keep=[])
