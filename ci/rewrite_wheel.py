"""Rewrite a wheel keeping only some of its files, so that a GPU bundle fits the device tool's
64 MiB carry (ci/gpu-bundle). The new RECORD lists every kept file with its hash and size as
CSV: a path that holds a comma (SGLang's MoE configs are named ``E=..,N=..,device_name=..json``)
is quoted, as the wheel format asks; unquoted, ``importlib.metadata`` cannot read the RECORD.

    python3 ci/rewrite_wheel.py SRC [--out OUT] [--drop PREFIX ...] [--drop-suffix SUFFIX ...]
                                [--only PREFIX ...] [--only-suffix SUFFIX ...] [--keep NAME ...]

A file is kept when it is named by ``--keep`` or is in the ``.dist-info`` folder; otherwise it
must start with an ``--only`` prefix and end with an ``--only-suffix`` (where given), and must
not start with a ``--drop`` prefix or end with a ``--drop-suffix``. OUT defaults to SRC
(replaced). A wheel that loses nothing is left as it is, so a second run changes nothing.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import sys
import tempfile
import zipfile


def keeper(args):
    def keep(name: str) -> bool:
        if name in args.keep or ".dist-info/" in name:
            return True
        if args.only and not name.startswith(tuple(args.only)):
            return False
        if args.only_suffix and not name.endswith(tuple(args.only_suffix)):
            return False
        return not (name.startswith(tuple(args.drop)) or name.endswith(tuple(args.drop_suffix)))
    return keep


def rewrite(src: str, out: str, keep) -> tuple[int, int]:
    """Write ``out`` from ``src`` with the files ``keep(name)`` accepts and a new RECORD;
    returns (files kept, files dropped). Nothing is written when nothing is dropped."""
    with zipfile.ZipFile(src) as zin:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        infos = [i for i in zin.infolist() if i.filename != record_name]
        kept = [i for i in infos if keep(i.filename)]
        if len(kept) == len(infos):
            return len(kept), 0
        fd, tmp = tempfile.mkstemp(suffix=".whl", dir=os.path.dirname(os.path.abspath(out)))
        os.close(fd)
        rows = io.StringIO()
        writer = csv.writer(rows, lineterminator="\n")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for info in kept:
                data = zin.read(info)
                zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                writer.writerow([info.filename, f"sha256={digest.decode()}", len(data)])
            writer.writerow([record_name, "", ""])
            zout.writestr(record_name, rows.getvalue())
    os.replace(tmp, out)
    return len(kept), len(infos) - len(kept)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("--out")
    for flag in ("--drop", "--drop-suffix", "--only", "--only-suffix", "--keep"):
        ap.add_argument(flag, nargs="+", default=[], action="extend")
    args = ap.parse_args(argv)
    out = args.out or args.src
    before = os.path.getsize(args.src)
    kept, dropped = rewrite(args.src, out, keeper(args))
    if dropped == 0 and out != args.src:
        import shutil

        shutil.copyfile(args.src, out)
    print(f"{os.path.basename(args.src)}: kept {kept} files, dropped {dropped}: "
          f"{before / 2**20:.1f} -> {os.path.getsize(out) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
