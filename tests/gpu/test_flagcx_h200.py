"""The FlagCX engine on a real GPU and a real libflagcx.so (``FLAGCX_PATH``).

Run on a CUDA host with FlagCX built from source (``make USE_NVIDIA=1``; see docs/distributed.md):

    FLAGCX_PATH=/path/to/FlagCX pytest tests/gpu/test_flagcx_h200.py -m gpu

- the binding's prototypes against the real ``flagcx/include/flagcx.h`` of that checkout;
- a world-size-1 communicator: unique id, CommInitRank, every collective on a side stream;
- two ranks through SGLang's GroupCoordinator (needs two GPUs; skipped with one).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))  # l3_helpers
from l3_helpers import binding_mismatches, clean_env, run_ranks  # noqa: E402

from sglang_fl.distributed import flagcx as fx  # noqa: E402

FLAGCX_PATH = os.environ.get("FLAGCX_PATH")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not FLAGCX_PATH, reason="needs FLAGCX_PATH (a FlagCX build with "
                                               "build/lib/libflagcx.so)"),
]


def test_binding_matches_the_real_header():
    root = Path(FLAGCX_PATH)
    headers = [p for p in (root / "flagcx" / "include" / "flagcx.h", root / "include" / "flagcx.h")
               if p.is_file()]
    if not headers:
        pytest.skip(f"no flagcx.h under {root} (an install prefix without headers)")
    assert binding_mismatches(headers[0].read_text()) == []


@pytest.fixture(scope="module")
def engine():
    torch.cuda.set_device(0)
    eng = fx.FlagCXEngine(fx.load_library(FLAGCX_PATH), rank=0, world_size=1,
                          device=torch.device("cuda", 0))
    yield eng
    eng.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_single_rank_collectives_on_a_side_stream(engine, dtype):
    dev = engine.device
    x = (torch.arange(4096, device=dev) % 77 - 38).to(dtype).reshape(64, 64)
    want = x.clone()
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        engine.all_reduce(x)
        gathered = torch.empty_like(x)
        engine.all_gather_into(gathered, x)
        scattered = torch.empty_like(x)
        engine.reduce_scatter_into(scattered, x)
        engine.broadcast(x, 0)
        v_out = torch.empty_like(x)
        engine.all_gatherv_into(v_out, x, [64])
        rv_out = torch.empty_like(x)
        engine.reduce_scatterv_into(rv_out, x, [64])
    side.synchronize()
    for name, got in [("all_reduce", x), ("all_gather", gathered), ("reduce_scatter", scattered),
                      ("all_gatherv", v_out), ("reduce_scatterv", rv_out)]:
        assert torch.equal(got, want), name
    assert side.cuda_stream in engine._streams


def test_one_flagcx_stream_per_torch_stream(engine):
    x = torch.ones(8, device=engine.device)
    s1, s2 = torch.cuda.Stream(engine.device), torch.cuda.Stream(engine.device)
    before = set(engine._streams)  # the module-scoped engine already saw earlier tests' streams
    for s in (s1, s2, s1, s2):
        with torch.cuda.stream(s):
            engine.all_reduce(x)
    torch.cuda.synchronize()
    # exactly one FlagCX stream per torch stream: reusing s1/s2 adds nothing
    assert set(engine._streams) - before == {s1.cuda_stream, s2.cuda_stream} - before
    assert {s1.cuda_stream, s2.cuda_stream} <= set(engine._streams)


def test_two_ranks_through_sglang(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("multi-rank FlagCX needs 2 GPUs; this host has "
                    f"{torch.cuda.device_count()} (the device tool lends one H200)")
    env = clean_env(SGLANG_FL_DIST_BACKEND="flagcx", FLAGCX_PATH=FLAGCX_PATH)
    for rep in run_ranks(tmp_path, 2, tp=2, env=env, timeout=600):
        assert rep["engine"] == {"world": "flagcx", "tp": "flagcx"}
        assert rep["calls"]["tp"]["all_gatherv"] == 9
