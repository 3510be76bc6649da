"""Rewrite a wheel keeping only some of its files, so that a GPU bundle fits the device tool's
64 MiB carry (ci/gpu-bundle). The new RECORD lists every kept file with its hash and size as
CSV: a path that holds a comma (SGLang's MoE configs are named ``E=..,N=..,device_name=..json``)
is quoted, as the wheel format asks; unquoted, ``importlib.metadata`` cannot read the RECORD.

    python3 ci/rewrite_wheel.py SRC [--out OUT] [--drop PREFIX ...] [--drop-suffix SUFFIX ...]
                                [--only PREFIX ...] [--only-suffix SUFFIX ...] [--keep NAME ...]

A file is kept when it is named by ``--keep`` or is in the ``.dist-info`` folder; otherwise it
must start with an ``--only`` prefix and end with an ``--only-suffix`` (where given), and must
not start with a ``--drop`` prefix or end with a ``--drop-suffix``. OUT defaults to SRC
(replaced). A wheel that loses nothing and whose RECORD is sound is left as it is, so a second
run changes nothing; one trimmed before RECORDs were quoted gets its RECORD rewritten.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import shutil
import sys
import tempfile
import zipfile


def keeper(args):
    keep_names, only, only_suffix = set(args.keep), tuple(args.only), tuple(args.only_suffix)
    drop, drop_suffix = tuple(args.drop), tuple(args.drop_suffix)

    def keep(name: str) -> bool:
        if name in keep_names or name.split("/", 1)[0].endswith(".dist-info"):
            return True
        if only and not name.startswith(only):
            return False
        if only_suffix and not name.endswith(only_suffix):
            return False
        return not (name.startswith(drop) or name.endswith(drop_suffix))
    return keep


def record_ok(text: str, names: set[str]) -> bool:
    """Whether a RECORD reads as the wheel format's CSV: three columns, every path a member."""
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    return all(len(row) == 3 and row[0] in names for row in rows)


def rewrite(src: str, out: str, keep) -> tuple[int, int, bool]:
    """Write ``out`` from ``src`` with the files ``keep(name)`` accepts and a new RECORD;
    returns (files kept, files dropped, whether ``out`` was written). Nothing is written when
    nothing is dropped and the RECORD is sound (an earlier trim's unquoted one is rewritten)."""
    with zipfile.ZipFile(src) as zin:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        infos = [i for i in zin.infolist() if i.filename != record_name]
        kept = [i for i in infos if keep(i.filename)]
        if len(kept) == len(infos) and record_ok(zin.read(record_name).decode(),
                                                 set(zin.namelist())):
            return len(kept), 0, False
        fd, tmp = tempfile.mkstemp(suffix=".whl.tmp", dir=os.path.dirname(os.path.abspath(out)))
        os.close(fd)
        try:
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
            os.chmod(tmp, 0o644)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return len(kept), len(infos) - len(kept), True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("--out")
    for flag in ("--drop", "--drop-suffix", "--only", "--only-suffix", "--keep"):
        ap.add_argument(flag, nargs="+", default=[], action="extend")
    args = ap.parse_args(argv)
    out = args.out or args.src
    before = os.path.getsize(args.src)
    kept, dropped, written = rewrite(args.src, out, keeper(args))
    if not written and not (os.path.exists(out) and os.path.samefile(args.src, out)):
        shutil.copyfile(args.src, out)  # nothing to change: the wheel as it is
    print(f"{os.path.basename(args.src)}: kept {kept} files, dropped {dropped}: "
          f"{before / 2**20:.1f} -> {os.path.getsize(out) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
