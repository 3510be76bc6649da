"""Every GroupCoordinator collective through the Layer-3 hooks, 2 and 4 real processes, gloo.

The workers install the hooks the way a server does (SGLang's ``load_plugins()``), build the
groups with SGLang's own functions and check each result exactly; here we check that they all
passed and that CommunicatorFL really served the calls (SGLang's CPU path would have crashed on
``all_gatherv``/``reduce_scatterv``, which need pynccl).
"""

from __future__ import annotations

import pytest
from l3_helpers import run_ranks

pytestmark = pytest.mark.distributed

# One Checker.run_all + tensor_dicts pass, per dtype where it applies (3 dtypes).
EXPECTED_CALLS = {
    "all_reduce": 2 * 3, "all_gather": 3 * 3, "all_gather_into_tensor": 3,
    "reduce_scatter_tensor": 3, "reduce_scatter": 3, "all_gatherv": 3 * 3,
    "reduce_scatterv": 2 * 3, "broadcast": 3, "send": 3, "recv": 3,
    "broadcast_tensor_dict": 1, "send_tensor_dict": 1, "recv_tensor_dict": 1,
}


def test_two_ranks_tp2(tmp_path):
    reports = run_ranks(tmp_path, 2, tp=2)
    for rep in reports:
        assert rep["engine"] == {"world": "torch", "tp": "torch"}
        assert rep["checks"] > 100
        for group in ("world", "tp"):
            assert rep["calls"][group] == EXPECTED_CALLS, group


def test_four_ranks_tp2_pp2(tmp_path):
    """World of 4, TP groups {0,1},{2,3} (group ranks != global ranks), PP groups {0,2},{1,3}
    with the pipeline hand-off that sends a slice and all-gathers it over TP."""
    reports = run_ranks(tmp_path, 4, tp=2, pp=2)
    for rank, rep in enumerate(reports):
        assert rep["calls"]["world"] == EXPECTED_CALLS
        tp_calls = dict(EXPECTED_CALLS)
        if rank >= 2:  # the receiving stage all-gathers the received slice over its TP group
            tp_calls["all_gather"] += 1
        assert rep["calls"]["tp"] == tp_calls
        want_pp = {"send_tensor_dict": 1} if rank < 2 else {"recv_tensor_dict": 1}
        assert rep["calls"]["pp"] == want_pp
