"""benchmarks/launch_cost.py's CPU-checkable parts: the bound launch passes every kernel
parameter in signature order (positional arguments, then constexprs; launch options left
out), compiles once and makes its runner once, and the table reports each path and what a
bound launch would save."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import launch_cost  # noqa: E402


def test_every_parameter_in_signature_order():
    names = ["q", "k", "n", "HALF", "BLOCK"]
    assert launch_cost.ordered_args(names, ("Q", "K", 7), {"HALF": 32, "BLOCK": 64, "num_warps": 4}) \
        == ["Q", "K", 7, 32, 64]
    with pytest.raises(ValueError, match="no value for kernel parameter.s. BLOCK"):
        launch_cost.ordered_args(names, ("Q", "K", 7), {"HALF": 32})


def test_the_bound_call_compiles_once_and_runs_the_compiled_runner():
    events = []

    class Compiled:
        def __getitem__(self, grid):
            events.append(("runner", grid))
            return lambda *a: events.append(("launch", a))

    class Kernel:
        arg_names = ["x", "n", "BLOCK"]

        def run(self, *args, grid, warmup, **meta):
            events.append(("compile", args, grid, warmup, meta))
            return Compiled()

    call = launch_cost.bound_call(Kernel(), (8, 2), ("X", 3), {"BLOCK": 16, "num_warps": 2})
    call()
    call()
    assert events == [("compile", ("X", 3), (8, 2), True, {"BLOCK": 16, "num_warps": 2}),
                      ("runner", (8, 2, 1)),
                      ("launch", ("X", 3, 16)), ("launch", ("X", 3, 16))]


def test_the_table_reports_each_path_and_the_saving():
    def s(m):
        return {"median": m, "min": m - 1, "max": m + 1, "runs": [m]}

    doc = {"results": {1: {"wrapper": s(25.0), "wrapper-jit": s(40.0), "jit": s(30.0),
                           "launch": s(14.0), "bound": s(12.0), "graph": s(2.0)},
                       4096: {"wrapper": s(45.0), "jit": s(35.0), "graph": s(20.0),
                              "errors": {"launch": "RuntimeError: no runner"}}}}
    text = launch_cost.table(doc)
    assert ("| 1 | 25.00 (24.00-26.00) | 40.00 (39.00-41.00) | 30.00 (29.00-31.00) | "
            "14.00 (13.00-15.00) | 12.00 (11.00-13.00) | 2.00 ") in text
    assert "| -16.00 | +28.00 |" in text
    assert "RuntimeError: no runner" in text and "| - | +15.00 |" in text
