"""Make a virtual environment that sees every package of this Python except the named ones.

    python3 tools/overlay_env.py DEST --without sglang-kernel apache-tvm-ffi flashinfer-python

prints DEST's python. Why: the GPU verify serves SGLang's "empty mode" (no sglang-kernel,
flashinfer or apache-tvm-ffi installed) while the GPU suite still needs those packages in the
full install. Uninstalling them made the two run one after the other; an overlay lets them run
side by side on one machine, and in the overlay the packages really are absent (neither import
nor ``importlib.metadata`` finds them), which is what the empty-mode tests check.

How: ``python -m venv --without-pip DEST``, then DEST's site-packages is filled with symbolic
links to each entry of this Python's site directories, in ``sys.path`` order. A file or folder
that a dropped distribution's RECORD lists is left out; a folder that holds files of both a
dropped and a kept distribution (a namespace package such as ``nvidia/``) becomes a real folder
whose entries are linked one by one. ``.pth`` files are linked too, so editable installs and
path hooks work as in the full install. Nothing in the full install changes.
"""

from __future__ import annotations

import argparse
import csv
import importlib.metadata as md
import io
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path


def _site_dirs() -> list[Path]:
    dirs = [Path(p) for p in site.getsitepackages() if Path(p).is_dir()]
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and Path(user).is_dir():
        dirs.append(Path(user))
    return list(dict.fromkeys(d.resolve() for d in dirs))


def _normalized(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _record(dist) -> list[str] | None:
    """The paths ``dist``'s RECORD lists (None: it has none). A wheel whose RECORD held paths
    with commas unquoted (some rewritten wheels: SGLang's MoE configs are named
    ``E=...,N=...,device_name=...json``) installs with a RECORD that ``importlib.metadata``
    cannot read (pip writes such a path once cut at its commas, once quoted); such a RECORD is
    read here row by row: a row of more than three columns is a path with commas, and a cut
    row names a path that does not exist, which is harmless here."""
    try:
        files = dist.files
    except (ValueError, TypeError):  # 3.12: int('device_name=...'); 3.11: too many columns
        text = dist.read_text("RECORD") or ""
        return [",".join(row[:-2]) if len(row) > 3 else row[0]
                for row in csv.reader(io.StringIO(text)) if row]
    return None if files is None else [str(f) for f in files]


def _owned(dists) -> tuple[set[Path], set[Path]]:
    """The files the distributions' RECORDs list (resolved) and every folder above them."""
    files: set[Path] = set()
    for dist in dists:
        for f in _record(dist) or ():
            files.add(Path(os.path.normpath(dist.locate_file(f))))
    dirs = {parent for f in files for parent in f.parents}
    return files, dirs


def plan(dists: list, without: list[str]) -> tuple[list, list, dict[str, str]]:
    """Split ``dists`` into those to drop and those to keep; per dropped name, where it was
    found ('' where it is not installed)."""
    wanted = {_normalized(n): n for n in without}
    dropped, kept, found = [], [], dict.fromkeys(without, "")
    for dist in dists:
        name = _normalized(dist.metadata["Name"] or "")
        if name not in wanted:
            kept.append(dist)
            continue
        if _record(dist) is None:
            raise SystemExit(f"overlay_env: {dist.metadata['Name']} has no RECORD: cannot "
                             "tell its files, so it cannot be left out")
        dropped.append(dist)
        found[wanted[name]] = str(dist.locate_file(""))
    return dropped, kept, found


def _fill(src: Path, dst: Path, drop_files: set[Path], drop_dirs: set[Path],
          keep_dirs: set[Path]) -> None:
    for entry in sorted(src.iterdir()):
        target = dst / entry.name
        if target.exists() or target.is_symlink():
            continue  # an earlier site directory already provides it (sys.path order)
        path = Path(os.path.normpath(entry))
        if entry.is_dir() and not entry.is_symlink():
            if path not in drop_dirs:
                target.symlink_to(entry)
            elif path in keep_dirs:  # shared with a kept distribution: link entry by entry
                target.mkdir()
                _fill(entry, target, drop_files, drop_dirs, keep_dirs)
            # else: only dropped distributions have files there
        elif path not in drop_files:
            target.symlink_to(entry)


def make(dest: Path, without: list[str], site_dirs: list[Path] | None = None) -> Path:
    """The overlay at ``dest`` over ``site_dirs`` (default: this Python's); returns its python."""
    site_dirs = site_dirs if site_dirs is not None else _site_dirs()
    dists = list(md.distributions(path=[str(d) for d in site_dirs]))
    dropped, kept, found = plan(dists, without)
    drop_files, drop_dirs = _owned(dropped)
    _, keep_dirs = _owned(kept)
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    target = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    target.mkdir(parents=True, exist_ok=True)
    for src in site_dirs:
        _fill(src, target, drop_files, drop_dirs, keep_dirs)
    for name, where in found.items():
        print(f"overlay_env: {name}: " + (f"left out (installed in {where})" if where
                                           else "not installed here"), file=sys.stderr)
    return python


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path, help="the overlay's folder (replaced if it exists)")
    ap.add_argument("--without", nargs="+", required=True, metavar="DIST",
                    help="distributions the overlay must not see")
    args = ap.parse_args(argv)
    python = make(args.dest, args.without)
    check = ("import importlib.metadata as m, sys\n"
             "seen = []\n"
             "for d in sys.argv[1:]:\n"
             "    try: m.distribution(d); seen.append(d)\n"
             "    except m.PackageNotFoundError: pass\n"
             "sys.exit(f'still visible: {seen}' if seen else 0)\n")
    subprocess.run([str(python), "-c", check, *args.without], check=True)
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
