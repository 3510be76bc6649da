"""benchmarks/gpu_session.sh's ``shapes`` stage, with stand-ins for what needs the H200 (the
``nvidia-smi`` that counts GPUs, the python that makes checkpoints and runs e2e_bench): each
preset's checkpoint is made, then judged with its own HF reference file; with two GPUs the
presets run side by side, one per GPU; a run that finds a DEFECT (exit 1) fails the stage. The
``e2e`` stage, which runs e2e_bench once on ``MODEL_DIR``, fails by the same rule, and the
``profile`` stage as its step_profile does."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PY = """#!/usr/bin/env bash
# make-tiny-model DIR --preset P, or a benchmark (e2e_bench, step_profile) --model DIR ... (exit 1
# on "35b"); -c (gpu_session's sglang_version) prints a version
echo "$* gpu=${CUDA_VISIBLE_DEVICES-unset}" >> "$CALLS"
[[ $1 == -c ]] && { echo 0.5.11; exit 0; }
[[ $1 == -m ]] && exit 0
[[ $* == *35b* ]] && { echo "| fl-defaults | 0 | no | 3 | 1 / 2 | 2.0 | 2.0 | 0.1 | DEFECT |"; exit 1; }
echo "| fl-defaults | 0 | yes | - | - | - | - | - | equal |"
"""


def run_stage(tmp_path, gpus, stage="shapes", **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("nvidia-smi", "#!/usr/bin/env bash\n" + "".join(
            f"echo 'GPU {i}: NVIDIA H200 (UUID: x)'\n" for i in range(gpus))), ("py", FAKE_PY)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    out = tmp_path / "out"
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PY": str(bin_dir / "py"),
            "OUT": str(out), "CALLS": str(tmp_path / "calls"), "SHAPES_LOGS": str(tmp_path / "logs"),
            **env}
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", stage], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    return proc.stdout + proc.stderr, calls, out


def test_one_gpu_runs_the_presets_one_after_another_and_a_defect_fails_the_stage(tmp_path):
    text, calls, out = run_stage(tmp_path, 1)
    makes = [c for c in calls if c.startswith("-m sglang_fl.cli make-tiny-model")]
    assert sorted(c.split()[5] for c in makes) == ["qwen3.6-27b", "qwen3.6-35b-a3b"]
    runs = [c for c in calls if c.startswith("benchmarks/e2e_bench.py")]
    assert [r.split()[2] for r in runs] == ["/tmp/shapes-qwen3.6-27b", "/tmp/shapes-qwen3.6-35b-a3b"]
    for r, p in zip(runs, ("qwen3.6-27b", "qwen3.6-35b-a3b"), strict=True):
        assert "--configs native-L1off,fl-defaults,flagos-L1off" in r
        assert f"--hf-reference {out}/hf-reference-{p}.json --repeats 2 --new-tokens 32" in r
        assert r.endswith("gpu=unset")  # one GPU: left as it is
    assert "stage shapes FAILED" in text and "| DEFECT |" in text
    durations = (out / "shapes-durations.txt").read_text()
    assert "e2e-qwen3.6-27b" in durations and "e2e-qwen3.6-35b-a3b" in durations
    assert (out / "shapes-logs.tgz").exists()


def test_the_e2e_stage_fails_as_its_e2e_bench_does(tmp_path):
    """The stage's status is e2e_bench's, not that of the log tarball made after it: on
    2026-12-07 a ``--reprobe`` that passed (it serves nothing, so no log folder) read "FAILED
    (rc=2)", and a DEFECT would have read as tar's success."""
    text, calls, out = run_stage(tmp_path, 1, "e2e", MODEL_DIR="/tmp/shapes-qwen3.6-35b-a3b",
                                 E2E_ARGS="--reprobe old.json")
    assert calls[0].startswith("benchmarks/e2e_bench.py --model /tmp/shapes-qwen3.6-35b-a3b")
    assert calls[0].split(" gpu=")[0].endswith("--reprobe old.json")
    assert "| DEFECT |" in (out / "e2e.log").read_text() and "stage e2e FAILED (rc=1)" in text
    (tmp_path / "calls").unlink()
    text, _, out = run_stage(tmp_path, 1, "e2e", MODEL_DIR="/tmp/shapes-qwen3.6-27b")
    assert "| equal |" in (out / "e2e.log").read_text() and "FAILED" not in text


def test_the_profile_stage_fails_as_its_step_profile_does(tmp_path):
    """The stage's status is step_profile's, not that of the best-effort copies of its outputs
    made after it (a profile that wrote no py-spy file read as a failed stage, and a failed
    profile as the copies' success)."""
    text, calls, _ = run_stage(tmp_path, 1, "profile", MODEL_DIR="/tmp/shapes-qwen3.6-35b-a3b")
    assert calls[0].startswith("benchmarks/step_profile.py --phase decode")
    assert "stage profile FAILED (rc=1)" in text
    (tmp_path / "calls").unlink()
    text, _, _ = run_stage(tmp_path, 1, "profile", MODEL_DIR="/tmp/shapes-qwen3.6-27b")
    assert "FAILED" not in text  # no profile files to copy here: that is not the stage's failure


def test_two_gpus_take_one_preset_each_and_a_carried_reference_is_used(tmp_path):
    carried = tmp_path / "carried"
    carried.mkdir()
    (carried / "hf-reference-qwen3.6-27b.json").write_text("{}")
    text, calls, out = run_stage(tmp_path, 2, SHAPES_REFERENCE_DIR=str(carried))
    runs = sorted(c for c in calls if c.startswith("benchmarks/e2e_bench.py"))
    assert [(r.split()[2], r.rsplit("=", 1)[1]) for r in runs] == [
        ("/tmp/shapes-qwen3.6-27b", "0"), ("/tmp/shapes-qwen3.6-35b-a3b", "1")]
    assert (out / "hf-reference-qwen3.6-27b.json").read_text() == "{}"
    assert not (out / "hf-reference-qwen3.6-35b-a3b.json").exists()
    assert "stage shapes FAILED" in text  # the DEFECT of the run beside it still fails the stage

    (tmp_path / "one").mkdir()
    text, _, _ = run_stage(tmp_path / "one", 2, SHAPES_PRESETS="qwen3.6-27b")
    assert "stage shapes FAILED" not in text and "total" in text


def test_a_checkpoint_made_by_an_earlier_call_is_reused(tmp_path):
    """On a warm machine a second call (one configuration group per call on an 80 GB card) skips
    the 108 s of making the 35B-A3B checkpoint again; one whose making did not finish (no
    marker) is made."""
    root = tmp_path / "models"
    (root / "shapes-qwen3.6-27b").mkdir(parents=True)
    (root / "shapes-qwen3.6-27b" / ".made").touch()
    text, calls, _ = run_stage(tmp_path, 1, SHAPES_MODEL_ROOT=str(root))
    makes = [c.split()[5] for c in calls if c.startswith("-m sglang_fl.cli make-tiny-model")]
    assert makes == ["qwen3.6-35b-a3b"]
    assert f"{root}/shapes-qwen3.6-27b kept from an earlier call" in text
    runs = [c.split()[2] for c in calls if c.startswith("benchmarks/e2e_bench.py")]
    assert runs == [f"{root}/shapes-qwen3.6-27b", f"{root}/shapes-qwen3.6-35b-a3b"]


FAKE_TIMEOUT = """#!/usr/bin/env bash
# records the limit it was given, then runs the command as coreutils' timeout would
echo "timeout $1" >> "$CALLS"
shift
exec "$@"
"""


def with_fake_timeout(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "timeout").write_text(FAKE_TIMEOUT)
    (bin_dir / "timeout").chmod(stat.S_IRWXU)


def test_a_call_deadline_cuts_the_stage_and_ends_the_repeats_before_the_hf_check(tmp_path):
    """With CALL_END (the call script's deadline) e2e_bench runs under a timeout that ends
    PACK_RESERVE s before it, whatever SHAPES_TIMEOUT says, and is told by --end-by to stop
    its repeats JUDGE_RESERVE s before that: 2026-12-07's first call lost its whole shapes
    stage to a fixed timeout counted from the stage's own start."""
    with_fake_timeout(tmp_path)
    end = int(time.time()) + 100
    text, calls, _ = run_stage(tmp_path, 1, SHAPES_PRESETS="qwen3.6-27b", SHAPES_TIMEOUT="360",
                               CALL_END=str(end))
    limits = [int(c.split()[1]) for c in calls if c.startswith("timeout ")]
    assert len(limits) == 1 and 1 <= limits[0] <= 75
    assert "budget: 360 s cut to" in text
    run = next(c for c in calls if c.startswith("benchmarks/e2e_bench.py"))
    assert f"--end-by {end - 85} --repeats 2" in run

    (tmp_path / "free").mkdir()
    with_fake_timeout(tmp_path / "free")
    text, calls, _ = run_stage(tmp_path / "free", 1, SHAPES_PRESETS="qwen3.6-27b",
                               SHAPES_TIMEOUT="360")
    assert [c for c in calls if c.startswith("timeout ")] == ["timeout 360"]
    assert "--end-by" not in next(c for c in calls if c.startswith("benchmarks/e2e_bench.py"))


def test_a_call_deadline_that_is_not_unix_seconds_is_refused_by_name(tmp_path):
    proc = subprocess.run(["bash", "benchmarks/gpu_session.sh", "shapes"], cwd=ROOT,
                          env={**os.environ, "OUT": str(tmp_path / "out"), "CALL_END": "+545"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "CALL_END must be Unix seconds" in proc.stderr and "'+545'" in proc.stderr
