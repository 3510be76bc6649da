"""The failure report logged when SGLang stops the server: it names a process killed from outside
even when a peer's failure reaches launch_server before that process is seen to have exited."""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time

import pytest

from sglang_fl.sglang_glue import process_report


class _Adapter:
    def __init__(self, children):
        self.children = children

    def server_children(self, signal_handler):
        return self.children


@pytest.fixture
def records(monkeypatch):
    got: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            got.append(record.getMessage())

    handler = _Keep()
    logging.getLogger("sglang_fl").addHandler(handler)
    yield got
    logging.getLogger("sglang_fl").removeHandler(handler)


def _sleeper() -> multiprocessing.Process:
    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    proc.start()
    return proc


def test_a_process_killed_just_after_the_failure_signal_is_named(monkeypatch, records):
    victim, bystander = _sleeper(), _sleeper()
    try:
        monkeypatch.setattr(process_report, "get_adapter",
                            lambda: _Adapter([("scheduler_1 (PP1 TP0)", victim),
                                              ("detokenizer", bystander)]))
        threading.Timer(0.3, victim.kill).start()  # the peer's report arrives first
        process_report.report_dead_children(object())
        assert records == [f"server stopping: process scheduler_1 (PP1 TP0) (pid {victim.pid}) "
                           "was killed by SIGKILL"]
    finally:
        for proc in (victim, bystander):
            proc.kill()
            proc.join()


def test_a_failure_with_no_death_behind_it_is_reported_after_the_grace(monkeypatch, records):
    alive = _sleeper()
    try:
        monkeypatch.setattr(process_report, "DEATH_GRACE_S", 0.3)
        monkeypatch.setattr(process_report, "get_adapter",
                            lambda: _Adapter([("scheduler_0 (PP0 TP0)", alive)]))
        start = time.monotonic()
        process_report.report_dead_children(object())
        assert time.monotonic() - start >= 0.3
        assert records == ["server stopping: a server process reported a failure; its traceback "
                           "is above in the log"]
    finally:
        alive.kill()
        alive.join()


def test_a_broken_inspection_never_stops_sglangs_cleanup(monkeypatch, records):
    class _Broken:
        def server_children(self, signal_handler):
            raise AttributeError("no watchdog")

    monkeypatch.setattr(process_report, "get_adapter", lambda: _Broken())
    assert process_report.report_dead_children(object()) is None
    assert records == []
