"""benchmarks/gpu_session.sh's ``install`` stage switching bundles on one machine, with a stand-in
python whose ``pip`` keeps its packages in a file: what an earlier bundle added and the new one
lacks is removed (0.5.23's xgrammar broke 0.5.11's empty mode on the H200), what the image had is
kept even where an earlier bundle carried it too (transformers needs the image's regex)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PY = r"""#!/usr/bin/env bash
# pip list / install / uninstall over the package names in $STATE; anything else succeeds.
if [[ $1 == - ]]; then cat > /dev/null; exit 0; fi
[[ $1 == -m && $2 == pip ]] || exit 0
case $3 in
  list) sed 's/$/==1.0/' "$STATE" ;;
  install)
    for a in "${@:4}"; do
      case $a in
        *.whl) basename "$a" | cut -d- -f1 >> "$STATE" ;;
        .) echo sglang-fl >> "$STATE" ;;
      esac
    done
    sort -u -o "$STATE" "$STATE" ;;
  uninstall)
    for a in "${@:4}"; do
      [[ $a == -* ]] && continue
      n=$(echo "$a" | tr 'A-Z-' 'a-z_')
      grep -v -x -i -e "$a" -e "$n" -e "${n//_/-}" "$STATE" > "$STATE.new"; mv "$STATE.new" "$STATE"
    done ;;
esac
"""


def bundle(tmp_path, name, dists):
    folder = tmp_path / name
    folder.mkdir()
    for dist in dists:
        (folder / f"{dist}-1.0-py3-none-any.whl").write_text("")
    return folder


def install(tmp_path, folder):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("py", FAKE_PY), ("nvidia-smi", "#!/usr/bin/env bash\necho H200\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PY": str(bin_dir / "py"),
           "OUT": str(tmp_path / "out"), "STATE": str(tmp_path / "state"), "BUNDLE": str(folder),
           "BUNDLE_ADDED": str(tmp_path / "added")}
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "install"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert "stage install FAILED" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return set((tmp_path / "state").read_text().split())


def test_switching_bundles_removes_what_the_earlier_one_added_and_keeps_the_image(tmp_path):
    (tmp_path / "state").write_text("regex\ntorch\ntransformers\n")  # the image
    new = bundle(tmp_path, "gpu-0.5.23", ["sglang", "xgrammar", "regex", "markdown_it_py",
                                          "sglang_fl"])
    old = bundle(tmp_path, "gpu", ["sglang", "sglang_kernel", "markdown_it_py", "sglang_fl"])

    assert install(tmp_path, new) == {"regex", "torch", "transformers", "sglang", "xgrammar",
                                      "markdown_it_py", "sglang-fl"}
    assert install(tmp_path, old) == {"regex", "torch", "transformers", "sglang",
                                      "sglang_kernel", "markdown_it_py", "sglang-fl"}
    # and back: the 0.5.11 bundle's sglang-kernel goes, xgrammar returns, the image stays
    assert install(tmp_path, new) == {"regex", "torch", "transformers", "sglang", "xgrammar",
                                      "markdown_it_py", "sglang-fl"}


def test_a_first_install_removes_nothing(tmp_path):
    (tmp_path / "state").write_text("regex\ntorch\nxgrammar\n")  # an image that has xgrammar
    assert "xgrammar" in install(tmp_path, bundle(tmp_path, "gpu", ["sglang", "sglang_fl"]))
