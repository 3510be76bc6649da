"""Fixtures of the end-to-end suite: the tiny models (Qwen2, Qwen3-MoE, the Qwen3.5 hybrids),
prompts and HF's greedy ids.

Every test here talks to a real ``python -m sglang.launch_server`` (or the offline Engine) with
sglang-fl installed, on CPU. Servers are shared per configuration (module-scoped fixtures) and
started one at a time: an idle SGLang scheduler busy-polls a core, and CI has two.
Helpers live in e2e_support.py (a unique module name: several test folders have a conftest).

A failing test says why at once (`pytest_runtest_makereport`): the failure and the last
`LOG_TAIL_LINES` lines of the server logs it registered (`e2e_support.register_log`) go to the
terminal as soon as the test fails and, when ``OUT`` names a directory, to
``$OUT/served-failures/<test>.log`` -- not only to pytest's summary at the end, which a
timeout can cut. Under pytest-xdist the worker writes the file and the controller prints.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import e2e_support
import pytest
from e2e_support import PROMPT_TEXTS, hf_greedy_ids

from sglang_fl.serving import log_tail

#: Lines of each server log a failure report shows.
LOG_TAIL_LINES = 60
#: The folder under $OUT (one level: a GPU host returns two levels below $OUT).
FAILURE_DIR = "served-failures"
#: Key of the report's user property that carries the report to the printing process.
_REPORT_KEY = "served_failure_report"


def _failure_logs(nodeid: str) -> list[Path]:
    """The server logs registered while this test ran (its own servers and those its fixtures
    set up); else the last one registered in its module (a module-scoped server)."""
    mine = [path for test, path in e2e_support.SERVER_LOGS if test == nodeid]
    if mine:
        return list(dict.fromkeys(mine))
    module = nodeid.split("::", 1)[0]
    earlier = [path for test, path in e2e_support.SERVER_LOGS if test.split("::", 1)[0] == module]
    return earlier[-1:]


def _failure_text(item, report, call) -> str:
    reason = call.excinfo.exconly() if call.excinfo is not None else report.longreprtext
    crash = getattr(report.longrepr, "reprcrash", None)
    raised = f" (raised at {crash.path}:{crash.lineno})" if crash is not None else ""
    parts = [f"=== {item.nodeid} failed ({report.when}){raised} ===", reason.rstrip()]
    logs = _failure_logs(item.nodeid)
    for path in logs:
        parts.append(f"--- last {LOG_TAIL_LINES} lines of {path} ---")
        parts.append(log_tail(path, LOG_TAIL_LINES))
    if not logs:
        parts.append("--- no server log registered for this test ---")
    return "\n".join(parts) + "\n"


def _write_failure(nodeid: str, text: str) -> Path | None:
    out = os.environ.get("OUT")
    if not out:
        return None
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid.rsplit("/", 1)[-1])[:150]
    path = Path(out) / FAILURE_DIR / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:  # setup and teardown may both fail
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Write a failed phase's report under $OUT the moment it fails, and pass it on with the
    report (`pytest_runtest_logreport` prints it, on the controller under xdist)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    text = _failure_text(item, report, call)
    try:
        path = _write_failure(item.nodeid, text)
    except OSError as exc:
        text += f"(could not write the report under $OUT: {exc})\n"
    else:
        if path is not None:
            text += f"(also in {path})\n"
    report.user_properties.append((_REPORT_KEY, text))


class _FailurePrinter:
    """Prints each failure report as soon as pytest learns of the failure, flushed (in the
    process that owns the terminal: the only one, or the xdist controller)."""

    def __init__(self, config):
        self.config = config

    @pytest.hookimpl(trylast=True)  # after the terminal's own "F" / "FAILED"
    def pytest_runtest_logreport(self, report):
        texts = [value for key, value in report.user_properties if key == _REPORT_KEY]
        terminal = self.config.pluginmanager.get_plugin("terminalreporter")
        for text in texts:
            if terminal is None:
                sys.stderr.write(text)
                sys.stderr.flush()
                continue
            terminal.write("\n" + text)
            terminal.flush()


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # an xdist worker's reports reach the controller
        config.pluginmanager.register(_FailurePrinter(config), "e2e-failure-printer")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen2")


@pytest.fixture(scope="session")
def prompt_ids(tiny_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="session")
def hf_ids(tiny_model, prompt_ids) -> list[list[int]]:
    return hf_greedy_ids(tiny_model, prompt_ids)


@pytest.fixture(scope="session")
def moe_model(tmp_path_factory) -> Path:
    """``make-tiny-model --preset qwen3-moe``: Qwen3-30B-A3B's routing at tiny sizes."""
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny-qwen3-moe", preset="qwen3-moe")


@pytest.fixture(scope="session")
def moe_prompt_ids(moe_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(moe_model)
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="session")
def moe_hf_ids(moe_model, moe_prompt_ids) -> list[list[int]]:
    return hf_greedy_ids(moe_model, moe_prompt_ids)


@pytest.fixture(scope="session", params=["qwen3.5", "qwen3.5-moe"])
def hybrid_model(request, tmp_path_factory) -> Path:
    """``make-tiny-model --preset qwen3.5`` / ``qwen3.5-moe``: Gated DeltaNet and gated full
    attention alternating (the MoE one with a shared expert), image-text checkpoints."""
    from sglang_fl.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / f"tiny-{request.param}",
                           preset=request.param)


@pytest.fixture(scope="session")
def hybrid_prompt_ids(hybrid_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hybrid_model)
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="session")
def hybrid_hf_ids(hybrid_model, hybrid_prompt_ids) -> list[list[int]]:
    return hf_greedy_ids(hybrid_model, hybrid_prompt_ids)
