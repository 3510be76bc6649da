"""The sglang_fl_* series in prometheus multiprocess mode, as SGLang runs it: each process writes
its own files under PROMETHEUS_MULTIPROC_DIR and the reader merges them. Two real processes,
each with a real CommunicatorFL on a one-rank gloo group and a real stand-in, record before and
after their export starts; the merged counts must be the sums, the info series one value."""

from __future__ import annotations

import pytest

import sglang_fl.metrics as metrics
from tests.integration.conftest import run_python

pytestmark = pytest.mark.integration

CHILD = r'''
import torch, torch.distributed as dist
import sglang_fl.metrics as metrics
from sglang_fl.compat.standins import Standin, StandinCalledError
from sglang_fl.distributed.communicator import CommunicatorFL, TorchEngine
from sglang_fl.sglang_glue.metrics_export import info_labels

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
group = dist.new_group([0])
comm = CommunicatorFL(rank_in_group=0, ranks=[0], device=torch.device("cpu"),
                      engine=TorchEngine(group, [0], 0), engine_name="torch", name="tp:0")
x = torch.ones(4)
comm.all_reduce(x)                       # before the export starts: replayed
metrics.record_route("rms_norm", "decode", "flagos")
try:
    Standin("sgl_kernel.rmsnorm")(x)
except StandinCalledError:
    pass
metrics.start_export(info_labels(), dispatch=True)
for _ in range(4):
    comm.all_reduce(x)
comm.broadcast(x, 0)
metrics.record_route("rms_norm", "decode", "reference")  # after a fallback
metrics.record_fallback("rms_norm", "flagos", "reference", "raised")
metrics.flush_collectives()
metrics.flush_collectives()              # nothing new: nothing added twice
dist.destroy_process_group()             # else gloo's threads may abort the exit (SIGABRT)
print("OK")
'''


def _merged(directory) -> dict:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect() for s in family.samples}


def test_two_processes_export_merged_series(tmp_path):
    pytest.importorskip("prometheus_client", reason="prometheus-client is in the stack's requirements")
    for _ in range(2):
        proc = run_python(CHILD, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
                                      "SGLANG_FL_PLATFORM": "cpu"})
        assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    got = _merged(tmp_path)
    coll = {dict(k[1])["op"]: v for k, v in got.items() if k[0] == "sglang_fl_collectives_total"}
    assert coll == {"all_reduce": 10.0, "broadcast": 2.0}
    assert {dict(k[1])["backend"] for k in got if k[0] == "sglang_fl_collectives_total"} == {"gloo"}
    assert got[("sglang_fl_standin_calls_total", (("name", "sgl_kernel.rmsnorm"),))] == 2.0
    assert got[("sglang_fl_fallbacks_total", (("from_impl", "flagos"), ("op", "rms_norm"),
                                              ("reason", "raised"), ("to_impl", "reference")))] == 2.0
    route = {dict(k[1])["impl"]: v for k, v in got.items() if k[0] == "sglang_fl_op_route"}
    assert route == {"flagos": 0.0, "reference": 1.0}
    (info,) = [dict(k[1]) | {"value": v} for k, v in got.items() if k[0] == "sglang_fl_info"]
    assert info["value"] == 1.0 and info["platform"] == "cpu" and info["dist_backend"] == "gloo"


def test_a_fallback_reason_outside_the_classes_is_refused():
    with pytest.raises(ValueError, match=r"fallback reason 'oom' of op 'rms_norm': accepted: "
                                         r"unavailable, raised, declined"):
        metrics.record_fallback("rms_norm", "flagos", "reference", "oom")


def test_records_before_any_export_are_kept_in_process():
    metrics.record_standin_call("flashinfer.sampling.top_k")
    metrics.record_route("topk", "prefill", "vendor.cuda")
    snap = metrics.snapshot()
    assert snap["standins"]["flashinfer.sampling.top_k"] >= 1
    assert snap["routes"][("topk", "prefill")] == "vendor.cuda"
