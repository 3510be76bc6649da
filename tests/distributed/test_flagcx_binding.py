"""The FlagCX engine without a GPU: prototypes vs the C declarations, behaviour vs a test double.

``flagcx_double.c`` is a single-rank libflagcx.so compiled here with gcc against
``flagcx_api.h``; it copies data as a one-rank communicator does and rejects what FlagCX would
reject (foreign comm/stream, bad enum values, an id it did not issue). Multi-rank FlagCX needs two
GPUs and is in tests/gpu/test_flagcx_h200.py.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from l3_helpers import binding_mismatches, clean_env, free_port, parse_prototypes

from sglang_fl.distributed import flagcx as fx
from sglang_fl.distributed.communicator import CommunicatorFL

pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parent
API_H = HERE / "flagcx_api.h"

DTYPE_ENUM = {torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6,
              torch.float32: 7, torch.float64: 8, torch.bfloat16: 9}


class Trace(ctypes.Structure):
    """Mirror of ``Trace`` in flagcx_double.c."""

    _fields_ = [("call", ctypes.c_char * 32), ("sendbuff", ctypes.c_void_p),
                ("recvbuff", ctypes.c_void_p), ("count", ctypes.c_size_t),
                ("datatype", ctypes.c_int), ("op", ctypes.c_int), ("root", ctypes.c_int),
                ("comm", ctypes.c_void_p), ("stream", ctypes.c_void_p),
                ("lastRawStream", ctypes.c_void_p)] + [
        (n, ctypes.c_int) for n in ("streamCopies", "streamFrees", "groupStarts", "groupEnds",
                                    "opsInGroup", "commDestroys", "handleFrees")]


def compile_double(out_dir: Path, *defines: str) -> Path:
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the FlagCX test double")
    lib = out_dir / "build" / "lib" / "libflagcx.so"
    lib.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *defines, f"-I{HERE}",
                    "-o", str(lib), str(HERE / "flagcx_double.c")], check=True)
    return out_dir


@pytest.fixture
def flagcx_home(tmp_path) -> Path:
    """A fresh FLAGCX_PATH (fresh library state: each path is its own dlopen)."""
    return compile_double(tmp_path / "flagcx")


@pytest.fixture
def engine(flagcx_home):
    lib = fx.FlagCXLibrary(fx.find_library(str(flagcx_home)))
    eng = fx.FlagCXEngine(lib, rank=0, world_size=1, device=torch.device("cpu"))
    yield eng
    eng.close()


def trace_of(engine) -> Trace:
    return Trace.in_dll(engine.lib._lib, "trace")


# --- the binding against the declarations ------------------------------------------------------


def test_prototypes_match_declarations():
    assert binding_mismatches(API_H.read_text()) == []


def test_prototype_check_catches_a_wrong_binding(monkeypatch):
    """The check above can fail: a binding with a swapped argument type is reported."""
    bad = dict(fx.PROTOTYPES)
    ret, args = bad["flagcxSend"]
    bad["flagcxSend"] = (ret, (args[0], ctypes.c_int) + args[2:])
    monkeypatch.setattr(fx, "PROTOTYPES", bad)
    problems = binding_mismatches(API_H.read_text())
    assert problems == ["flagcxSend parameter 1: declared 'size_t', binding has "
                        f"{ctypes.c_int}"]


def test_parser_reads_every_declared_call():
    assert set(parse_prototypes(API_H.read_text())) == set(fx.PROTOTYPES)


# --- finding and loading the library ------------------------------------------------------------


@pytest.mark.parametrize("layout", ["build/lib", "lib", "file"])
def test_library_found_in_each_layout(flagcx_home, tmp_path, layout):
    built = flagcx_home / "build" / "lib" / "libflagcx.so"
    if layout == "build/lib":
        assert fx.find_library(str(flagcx_home)) == str(built)
    elif layout == "lib":
        prefix = tmp_path / "prefix"
        (prefix / "lib").mkdir(parents=True)
        shutil.copy(built, prefix / "lib" / "libflagcx.so")
        assert fx.find_library(str(prefix)) == str(prefix / "lib" / "libflagcx.so")
    else:
        assert fx.find_library(str(built)) == str(built)


def test_missing_library_names_variable_and_files(tmp_path):
    with pytest.raises(fx.FlagCXError) as err:
        fx.find_library(str(tmp_path))
    msg = str(err.value)
    assert "FLAGCX_PATH" in msg
    for sub in ("build/lib", "lib", "lib64"):
        assert str(tmp_path / sub / "libflagcx.so") in msg


def test_missing_symbol_names_it_and_the_version(tmp_path):
    home = compile_double(tmp_path / "old", "-DOMIT_DEVICE_HANDLE_INIT")
    with pytest.raises(fx.FlagCXError) as err:
        fx.FlagCXLibrary(fx.find_library(str(home)))
    msg = str(err.value)
    assert "flagcxDeviceHandleInit" in msg and fx.FLAGCX_MIN_VERSION in msg


def test_unloadable_file_is_reported(tmp_path):
    bogus = tmp_path / "build" / "lib" / "libflagcx.so"
    bogus.parent.mkdir(parents=True)
    bogus.write_text("not an ELF file")
    with pytest.raises(fx.FlagCXError, match="cannot load FlagCX library"):
        fx.FlagCXLibrary(fx.find_library(str(tmp_path)))


# --- engine behaviour against the double --------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPE_ENUM))
def test_collectives_pass_exact_arguments(engine, dtype):
    t = trace_of(engine)
    x = (torch.arange(12) % 7 - 3).to(dtype).reshape(3, 4)
    before = x.clone()
    engine.all_reduce(x)
    assert (t.call, t.sendbuff, t.recvbuff) == (b"AllReduce", x.data_ptr(), x.data_ptr())
    assert (t.count, t.datatype, t.op) == (12, DTYPE_ENUM[dtype], 0)
    assert torch.equal(x, before)  # a one-rank sum

    out = torch.empty(3, 4, dtype=dtype)
    engine.all_gather_into(out, x)
    assert (t.call, t.sendbuff, t.recvbuff, t.count) == (b"AllGather", x.data_ptr(),
                                                          out.data_ptr(), 12)
    assert torch.equal(out, x)

    out = torch.zeros(3, 4, dtype=dtype)
    engine.reduce_scatter_into(out, x)
    assert (t.call, t.count, t.op, t.recvbuff) == (b"ReduceScatter", 12, 0, out.data_ptr())
    assert torch.equal(out, x)

    engine.broadcast(x, 0)
    assert (t.call, t.root, t.sendbuff, t.recvbuff) == (b"Broadcast", 0, x.data_ptr(),
                                                        x.data_ptr())

    engine.send(x, 0)
    assert (t.call, t.root, t.count) == (b"Send", 0, 12)
    got = torch.empty_like(x)
    engine.recv(got, 0)
    assert (t.call, t.recvbuff) == (b"Recv", got.data_ptr())
    assert torch.equal(got, x)


def test_uneven_variants_are_grouped(engine):
    t = trace_of(engine)
    x = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    out = torch.empty(3, 2)
    engine.all_gatherv_into(out, x, [3])
    assert (t.groupStarts, t.groupEnds, t.opsInGroup) == (1, 1, 1)
    assert (t.call, t.count) == (b"Broadcast", 6)
    assert torch.equal(out, x)
    out = torch.empty(3, 2)
    engine.reduce_scatterv_into(out, x, [3])
    assert (t.groupStarts, t.groupEnds, t.opsInGroup) == (2, 2, 2)
    assert (t.call, t.root, t.count, t.recvbuff) == (b"Reduce", 0, 6, out.data_ptr())
    assert torch.equal(out, x)


def test_one_flagcx_stream_per_device_stream(engine):
    t = trace_of(engine)
    x = torch.ones(4)
    for _ in range(5):
        engine.all_reduce(x)
    assert t.streamCopies == 1 and t.lastRawStream is None  # host tensors: raw handle 0
    assert t.stream == engine._streams[0].value


def test_failed_call_raises_with_flagcx_message(engine):
    ctypes.c_int.in_dll(engine.lib._lib, "failNext").value = 5
    with pytest.raises(fx.FlagCXError, match=r"flagcxAllReduce failed with flagcxResult 5: "
                                             r"invalid usage"):
        engine.all_reduce(torch.ones(2))


def test_unsupported_dtype_is_refused_before_the_call(engine):
    with pytest.raises(fx.FlagCXError, match="complex64"):
        engine.all_reduce(torch.ones(2, dtype=torch.complex64))


def test_close_frees_streams_comm_and_handle(engine):
    t = trace_of(engine)
    engine.all_reduce(torch.ones(3))
    engine.close()
    assert (t.streamFrees, t.commDestroys, t.handleFrees) == (1, 1, 1)
    engine.close()  # idempotent
    assert t.commDestroys == 1


def test_communicator_over_flagcx_engine(engine):
    """CommunicatorFL's reshaping and bookkeeping around the FlagCX engine (one rank)."""
    comm = CommunicatorFL(rank_in_group=0, ranks=[0], device=torch.device("cpu"), engine=engine,
                          engine_name="flagcx")
    x = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    assert torch.equal(comm.all_gather(x, dim=-1), x)
    xt = x.t()
    assert comm.all_reduce(xt) is xt and torch.equal(xt, x.t())
    a, b = comm.all_gatherv([x, x[:, 0]], sizes=[2])
    assert torch.equal(a, x) and torch.equal(b, x[:, 0])
    assert torch.equal(comm.reduce_scatterv(x, sizes=[2]), x)
    comm.send(x, 0)
    assert torch.equal(comm.recv(x.shape, x.dtype, 0), x)
    assert comm.calls == {"all_gather": 1, "all_reduce": 1, "all_gatherv": 1,
                          "reduce_scatterv": 1, "send": 1, "recv": 1}


# --- a one-rank SGLang group never makes a communicator -----------------------------------------

WS1_SCRIPT = r"""
import os, sys
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.distributed import parallel_state as ps
from sglang_fl.distributed import flagcx
assert hasattr(ps.GroupCoordinator.all_reduce, "__wrapped__"), "hooks not applied"
ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                distributed_init_method="tcp://127.0.0.1:" + sys.argv[1])
from sglang_fl.sglang_glue.adapters import get_adapter
get_adapter().initialize_model_parallel(tp_size=1)
import torch
for g in (ps.get_world_group(), ps.get_tp_group(), ps.get_pp_group()):
    assert g.fl_communicator is None, g
    x = torch.ones(3)
    assert g.all_reduce(x) is x
assert flagcx.load_library.cache_info().currsize == 0, "libflagcx.so was loaded"
print("WS1-OK")
"""


def test_world_size_one_never_creates_a_communicator(flagcx_home):
    env = clean_env(SGLANG_FL_DIST_BACKEND="flagcx", FLAGCX_PATH=str(flagcx_home))
    proc = subprocess.run([sys.executable, "-c", WS1_SCRIPT, str(free_port())], env=env,
                          capture_output=True, text=True, timeout=180)
    assert "WS1-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_flagcx_on_a_cpu_group_is_refused(flagcx_home):
    """FlagCX has no CPU device adaptor; a multi-rank CPU group must not get a FlagCX engine.
    (A plain namespace stands in for the GroupCoordinator: the check runs before any use of it.)"""
    from types import SimpleNamespace

    group = SimpleNamespace(world_size=2, rank_in_group=0, ranks=[0, 1], unique_name="tp:0",
                            device=torch.device("cpu"), cpu_group=None, device_group=None)
    with pytest.raises(fx.FlagCXError, match="no CPU device adaptor.*gloo"):
        CommunicatorFL.for_group(group, "flagcx", str(flagcx_home))


def test_doctor_loads_flagcx_and_says_why_it_makes_no_communicator_on_cpu(flagcx_home):
    """``sglang-fl doctor`` with FlagCX asked for: the library loads (its version is read through
    the binding), no one-rank communicator is tried on the CPU platform, and that is a warning."""
    proc = subprocess.run([sys.executable, "-m", "sglang_fl.cli", "doctor", "--json"],
                          env=clean_env(SGLANG_FL_DIST_BACKEND="flagcx",
                                        FLAGCX_PATH=str(flagcx_home)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    d = report["distributed"]
    assert d["flagcx_library"] == str(flagcx_home / "build" / "lib" / "libflagcx.so")
    assert isinstance(d["flagcx_version"], int)
    assert d["check"] == "not tried: FlagCX has no CPU device adaptor"
    (finding,) = report["findings"]
    assert finding["message"].startswith("SGLANG_FL_DIST_BACKEND=flagcx on the CPU platform")
