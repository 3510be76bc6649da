"""tools/overlay_env.py: the GPU verify's empty-mode environment. Over a made-up site directory,
the overlay's python must not import or find the metadata of a left-out distribution, also where
it shares a namespace folder with a kept one, and must see everything else, ``.pth`` files
included; the full install is left as it was."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _overlay_env():
    spec = importlib.util.spec_from_file_location("overlay_env", ROOT / "tools" / "overlay_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dist(site: Path, name: str, files: dict[str, str]) -> None:
    """Install a made-up distribution: its files and a dist-info whose RECORD lists them."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    record = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{r},,\n" for r in record))


@pytest.fixture
def site(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _dist(site, "keep-me", {"keepme/__init__.py": "VALUE = 1\n",
                            "ns/a/__init__.py": "A = 1\n", "keep_me.pth": "import keepme_hook\n",
                            "keepme_hook.py": "import os; os.environ['KEEPME_PTH'] = 'ran'\n"})
    _dist(site, "drop-me", {"dropme/__init__.py": "", "dropme/ops.so": "",
                            "ns/b/__init__.py": "B = 1\n"})
    (site / "keepme" / "__pycache__").mkdir()  # not in any RECORD: goes with its folder
    return site


def test_the_overlay_hides_what_it_leaves_out_and_sees_the_rest(tmp_path, site):
    python = _overlay_env().make(tmp_path / "overlay", ["drop-me", "never-installed"],
                                 site_dirs=[site])
    probe = """
import importlib, importlib.metadata as m, os
import keepme, ns.a
assert keepme.VALUE == 1 and ns.a.A == 1
assert os.environ.get('KEEPME_PTH') == 'ran', 'the .pth file did not run'
assert m.version('keep-me') == '1.0'
for mod in ('dropme', 'ns.b'):
    try:
        importlib.import_module(mod)
    except ImportError:
        continue
    raise SystemExit(f'{mod} is importable')
try:
    m.distribution('drop-me')
except m.PackageNotFoundError:
    pass
else:
    raise SystemExit('drop-me metadata is visible')
print('ok')
"""
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    # The full install is untouched.
    assert (site / "dropme" / "ops.so").exists() and (site / "ns" / "b" / "__init__.py").exists()


def test_a_distribution_without_a_record_is_refused_by_name(tmp_path, site):
    info = site / "old_style-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: old-style\nVersion: 1.0\n")
    with pytest.raises(SystemExit, match="old-style has no RECORD"):
        _overlay_env().make(tmp_path / "overlay", ["old-style"], site_dirs=[site])


def test_the_command_line_checks_its_own_result(tmp_path):
    """Over this Python's own site directories, leaving out a real installed distribution:
    the tool's final check passes and prints the overlay's python."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "overlay_env.py"),
                           str(tmp_path / "overlay"), "--without", "pluggy"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    python = proc.stdout.strip().splitlines()[-1]
    assert python.endswith("/bin/python")
    assert "pluggy: left out" in proc.stderr
    check = subprocess.run([python, "-c", "import pluggy"], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode != 0 and "pluggy" in check.stderr


def test_a_record_with_unquoted_commas_in_its_paths_is_still_read(tmp_path, site):
    """GPU host, 2026-12-05: a rewritten sglang wheel listed ``E=128,N=768,device_name=...json``
    unquoted in its RECORD, pip installed it with a RECORD ``importlib.metadata`` cannot read;
    the overlay must still leave out exactly that distribution's files, and keep a kept one's.
    A row of more than three columns (a path with commas, unquoted) is read too."""
    # in the folder both share, so each file is linked or left out by its own RECORD row
    for name, rel in (("drop-me", "ns/E=1,N=2,device=X.json"),
                      ("keep-me", "ns/E=3,N=4,device=Y.json")):
        (site / rel).write_text("{}")
        info = site / f"{name.replace('-', '_')}-1.0.dist-info"
        with (info / "RECORD").open("a") as record:
            # as pip 23 installs such a wheel: the path once cut at its commas, once quoted
            record.write(f"{rel}\n\"{rel}\",,\n")
    info = site / "drop_me-1.0.dist-info"
    with (info / "RECORD").open("a") as record:
        record.write("ns/a,b.txt,sha256=abc,2\n")
    (site / "ns" / "a,b.txt").write_text("x")
    python = _overlay_env().make(tmp_path / "overlay", ["drop-me"], site_dirs=[site])
    target = next((tmp_path / "overlay").glob("lib/python*/site-packages"))
    assert not (target / "ns" / "E=1,N=2,device=X.json").exists()
    assert not (target / "ns" / "a,b.txt").exists()
    assert (target / "ns" / "E=3,N=4,device=Y.json").exists()
    assert python.exists()
