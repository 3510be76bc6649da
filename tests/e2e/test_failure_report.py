"""A failing served test says why at once: a pytest run of this folder's conftest and helpers
over a served test whose server cannot start (an unknown flag) writes the reason and the
server log's tail under ``$OUT/served-failures/`` before its next test runs, and prints both
before pytest's end-of-session summary; under pytest-xdist the controller prints what the
worker reported."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("sglang")
pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent

FAILING_RUN = textwrap.dedent('''
    import os
    from pathlib import Path

    from e2e_support import SERVER_ARGS, hermetic_env, launch


    def test_a_server_that_cannot_start(tmp_path):
        with launch(tmp_path / "no-model", (*SERVER_ARGS, "--no-such-flag"), hermetic_env(tmp_path),
                    tmp_path / "server.log", timeout=120):
            pass


    def test_the_reason_is_written_before_the_run_ends():
        reports = sorted((Path(os.environ["OUT"]) / "served-failures").glob("*.log"))
        assert [p.name for p in reports] == [
            "test_failing.py_test_a_server_that_cannot_start.log"], reports
''')


@pytest.mark.parametrize("workers", [None, 1], ids=["one-process", "xdist"])
def test_a_failed_served_test_reports_reason_and_log_tail_at_once(tmp_path, workers):
    if workers:
        pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    suite.mkdir()
    for name in ("conftest.py", "e2e_support.py"):
        shutil.copy(HERE / name, suite / name)
    (suite / "test_failing.py").write_text(FAILING_RUN, encoding="utf-8")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out)}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=",
               "--rootdir", str(suite), str(suite / "test_failing.py")]
    if workers:
        command += ["-p", "xdist", "-n", str(workers)]
    run = subprocess.run(command, cwd=suite, env=env, capture_output=True, text=True, timeout=400)
    console = run.stdout + run.stderr

    assert run.returncode == 1, console
    assert "1 failed, 1 passed" in console, console
    report = (out / "served-failures" / "test_failing.py_test_a_server_that_cannot_start.log")
    text = report.read_text(encoding="utf-8")
    assert "ServerStartError" in text and "failed (call)" in text, text
    assert "--- last 60 lines of" in text and "unrecognized arguments: --no-such-flag" in text, text
    # On the console as soon as it failed: before the FAILURES section of the summary.
    printed = console.find("test_a_server_that_cannot_start failed (call)")
    assert -1 < printed < console.find("= FAILURES ="), console
