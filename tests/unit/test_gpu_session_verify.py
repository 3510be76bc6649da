"""benchmarks/gpu_session.sh's ``verify`` stage, run with a stand-in python that logs each call
with its time: the four empty-mode servers and doctor in empty mode run in the overlay made by
tools/overlay_env.py (its python, not the full install's), beside the GPU suite rather than after
it, with the larger memory margin; where the overlay cannot be made, or its python cannot import
the serving stack or see the GPU, empty mode falls back to uninstalling SGLang's kernels after
the suite, and says so. Every step's duration and the total
reach verify-durations.txt."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PY = r"""#!/usr/bin/env bash
# Logs "<time> <interpreter> start|end <what> [MEM=...]" to $CALLS; the GPU suite and the
# empty-mode servers take a while, so that overlap shows.
say() { echo "$(date +%s.%N) $0 $1 $2 MEM=${SGLANG_FL_TEST_MEM_FRACTION:-} MODELS=${SGLANG_FL_TEST_MODELS:-}" >> "$CALLS"; }
if [[ $1 == - ]]; then cat > /dev/null; exit 0; fi
if [[ $1 == -c ]]; then
  case $2 in
    *sglang-kernel*) exit "${FAKE_NO_KERNEL:-0}" ;;
    *"print(m.version('sglang'))"*) echo 0.5.11 ;;
    *"torch.cuda.is_available()"*) exit "${FAKE_OVERLAY_BROKEN:-0}" ;;
  esac
  exit 0
fi
case "$1 $2 $3" in
  "-m pip list") printf 'torch==2.11\nregex==1\n' ;;
  "-m pip uninstall") say once "uninstall:$(IFS=,; echo "${*:4}")" ;;
  "-m pip"*) ;;
  "-m sglang_fl.cli doctor"*) say once doctor; echo "doctor ok" ;;
  "-m sglang_fl.cli make-tiny-model") mkdir -p "$4" ;;
  "-m pytest tests/gpu") say start suite; touch "$CALLS.suite"; sleep 6; say end suite ;;
  "-m pytest tests/e2e/test_gpu_empty_mode.py")
    say start empty; touch "$CALLS.empty"; sleep 1; say end empty ;;
  tools/overlay_env.py*)
    [[ -n ${FAKE_OVERLAY_FAILS:-} ]] && { echo "overlay_env: no" >&2; exit 1; }
    mkdir -p "$2/bin" && cp "$0" "$2/bin/python" && echo "$2/bin/python" ;;
  benchmarks/e2e_bench.py*) say start smoke; sleep 0.5; say end smoke ;;
  tests/e2e/e2e_support.py*)
    # until the suite and the empty-mode servers started (at most 10 s each): proves neither
    # waits for it
    say start ahead
    for m in suite empty; do
      for _ in $(seq 100); do [[ -e $CALLS.$m ]] && break; sleep 0.1; done
    done
    [[ -z ${FAKE_AHEAD_FAILS:-} ]] || exit 1
    rm -f "$2/.writing"; say end ahead ;;
esac
exit 0
"""


def verify(tmp_path, **env_extra):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("py", FAKE_PY), ("nvidia-smi", "#!/usr/bin/env bash\necho H200\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "sglang_kernel-0.4-py3-none-any.whl").write_text("")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PY": str(bin_dir / "py"),
           "OUT": str(tmp_path / "out"), "CALLS": str(tmp_path / "calls"),
           "BUNDLE": str(tmp_path / "wheels"), "BUNDLE_ADDED": str(tmp_path / "added"),
           "HOME": str(tmp_path / "home"), "TVM_FFI_CACHE_DIR": str(tmp_path / "jit"),
           "MODEL_DIR": str(tmp_path / "model"), "EMPTY_OVERLAY": str(tmp_path / "overlay"),
           "VERIFY_MODELS": str(tmp_path / "models"),
           **env_extra}
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "verify"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert "stage verify FAILED" not in proc.stdout, proc.stdout + proc.stderr
    calls = []
    for line in (tmp_path / "calls").read_text().splitlines():
        t, python, event, what, mem, models = line.split(" ")
        calls.append((float(t), python, event, what, mem.removeprefix("MEM="),
                      models.removeprefix("MODELS=")))
    durations = (tmp_path / "out" / "verify-durations.txt").read_text()
    return calls, durations, proc.stdout


def _at(calls, event, what):
    return next(c for c in calls if c[2] == event and c[3] == what)


def test_empty_mode_runs_in_the_overlay_beside_the_suite(tmp_path):
    calls, durations, _ = verify(tmp_path)
    overlay_python = str(tmp_path / "overlay" / "bin" / "python")
    empty = _at(calls, "start", "empty")
    assert empty[1] == overlay_python and empty[4] == "0.3"
    assert _at(calls, "start", "suite")[1] == str(tmp_path / "bin" / "py")
    # side by side: the servers start before the suite ends, and nothing is uninstalled
    assert empty[0] < _at(calls, "end", "suite")[0]
    assert not [c for c in calls if c[3].startswith("uninstall")]
    doctors = [c[1] for c in calls if c[3] == "doctor"]
    assert overlay_python in doctors and str(tmp_path / "bin" / "py") in doctors
    steps = [line.split()[0] for line in durations.splitlines()]
    for step in ("install", "treecore", "doctor", "model", "overlay", "models-ahead", "jit",
                 "smoke", "tests", "emptymode", "doctor-empty", "savejit", "total"):
        assert step in steps, durations


@pytest.mark.parametrize("fails", [False, True], ids=["made", "failed"])
def test_the_big_checkpoint_is_written_beside_everything_else(tmp_path, fails):
    """The 27B-shaped checkpoint is written from the start, and neither the suite nor the
    empty-mode servers wait for it (only the test that serves it does, `made_ahead`); they are
    pointed at its folder, which holds `.writing` until the writer ends, also by failing (then
    that test writes its own)."""
    calls, durations, _ = verify(tmp_path, **({"FAKE_AHEAD_FAILS": "1"} if fails else {}))
    empty = _at(calls, "start", "empty")
    assert empty[5] == str(tmp_path / "models")
    assert not (tmp_path / "models" / ".writing").exists()  # the test that waits goes on
    if not fails:
        ahead_end = _at(calls, "end", "ahead")[0]
        assert _at(calls, "start", "suite")[0] < ahead_end and empty[0] < ahead_end
    assert "models-ahead" in durations


@pytest.mark.parametrize("broken", [{"FAKE_OVERLAY_FAILS": "1"}, {"FAKE_OVERLAY_BROKEN": "1"}],
                         ids=["not-made", "cannot-import-or-see-the-gpu"])
def test_without_an_overlay_empty_mode_uninstalls_after_the_suite(tmp_path, broken):
    calls, durations, stdout = verify(tmp_path, **broken)
    assert "no empty-mode overlay" in stdout
    uninstall = next(c for c in calls if c[3].startswith("uninstall:"))
    assert "sglang-kernel" in uninstall[3] and "apache-tvm-ffi" in uninstall[3]
    empty = _at(calls, "start", "empty")
    assert empty[1] == str(tmp_path / "bin" / "py") and empty[4] == ""
    assert _at(calls, "end", "suite")[0] < uninstall[0] < empty[0]
    assert "emptymode" in durations and "total" in durations
