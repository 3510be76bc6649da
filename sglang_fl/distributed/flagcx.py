"""FlagCX engine: SGLang's device collectives through ``libflagcx.so`` via ctypes.

FlagCX is a C library (built from source, not on PyPI) that speaks one API over each chip's own
collective library (NCCL, HCCL, MCCL, ...) and can bridge chips of different vendors. We bind only
the calls Layer 3 needs, as declared in FlagCX's ``flagcx/include/flagcx.h`` from version 0.13
on (caller-allocated ``flagcxUniqueId``, ``flagcxDeviceHandleInit``); ``PROTOTYPES`` is that
binding and ``tests/distributed/test_flagcx_binding.py`` checks it against the C prototypes.

How a communicator is made: group rank 0 calls ``flagcxGetUniqueId``; the 256 id bytes travel
over the group's CPU (gloo) process group; every rank calls ``flagcxCommInitRank``. Work is
enqueued on the caller's current device stream: each torch stream is wrapped once into a
``flagcxStream_t`` (``streamCopy`` from the device handle) and the wrapper is reused, so FlagCX
orders with the surrounding kernels exactly like NCCL on the same stream would.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sglang_fl.logging_setup import get_logger

logger = get_logger("sglang_fl.distributed.flagcx")

FLAGCX_MIN_VERSION = "0.13.0"
UNIQUE_ID_BYTES = 256


class FlagCXError(RuntimeError):
    """FlagCX cannot be loaded or a FlagCX call failed."""


# --- C types (flagcx.h) ----------------------------------------------------------------------

flagcxResult_t = ctypes.c_int
flagcxDataType_t = ctypes.c_int
flagcxRedOp_t = ctypes.c_int
flagcxComm_t = ctypes.c_void_p
flagcxStream_t = ctypes.c_void_p


class flagcxUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


_STREAM_COPY = ctypes.CFUNCTYPE(flagcxResult_t, ctypes.POINTER(flagcxStream_t), ctypes.c_void_p)
_STREAM_FREE = ctypes.CFUNCTYPE(flagcxResult_t, flagcxStream_t)


class flagcxDeviceHandle(ctypes.Structure):
    """The leading members of ``struct flagcxDeviceHandle`` up to ``streamFree``.

    Only ``streamCopy``/``streamFree`` are called; the members before them are declared as plain
    pointers to keep the layout (their order is unchanged since FlagCX 0.9).
    """

    _fields_ = [
        ("deviceSynchronize", ctypes.c_void_p),
        ("deviceMemcpy", ctypes.c_void_p),
        ("deviceMemset", ctypes.c_void_p),
        ("deviceMalloc", ctypes.c_void_p),
        ("deviceFree", ctypes.c_void_p),
        ("setDevice", ctypes.c_void_p),
        ("getDevice", ctypes.c_void_p),
        ("getDeviceCount", ctypes.c_void_p),
        ("getVendor", ctypes.c_void_p),
        ("hostGetDevicePointer", ctypes.c_void_p),
        ("streamCreate", ctypes.c_void_p),
        ("streamDestroy", ctypes.c_void_p),
        ("streamCopy", _STREAM_COPY),
        ("streamFree", _STREAM_FREE),
    ]


flagcxDeviceHandle_t = ctypes.POINTER(flagcxDeviceHandle)
_PTR = ctypes.c_void_p
_SIZE = ctypes.c_size_t
_INT = ctypes.c_int

# name -> (restype, argtypes); one entry per C prototype we call.
PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    "flagcxGetErrorString": (ctypes.c_char_p, (flagcxResult_t,)),
    "flagcxGetVersion": (flagcxResult_t, (ctypes.POINTER(_INT),)),
    "flagcxDeviceHandleInit": (flagcxResult_t, (ctypes.POINTER(flagcxDeviceHandle_t),)),
    "flagcxDeviceHandleFree": (flagcxResult_t, (flagcxDeviceHandle_t,)),
    "flagcxGetUniqueId": (flagcxResult_t, (ctypes.POINTER(flagcxUniqueId),)),
    "flagcxCommInitRank": (flagcxResult_t, (ctypes.POINTER(flagcxComm_t), _INT,
                                            ctypes.POINTER(flagcxUniqueId), _INT)),
    "flagcxCommDestroy": (flagcxResult_t, (flagcxComm_t,)),
    "flagcxAllReduce": (flagcxResult_t, (_PTR, _PTR, _SIZE, flagcxDataType_t, flagcxRedOp_t,
                                         flagcxComm_t, flagcxStream_t)),
    "flagcxReduce": (flagcxResult_t, (_PTR, _PTR, _SIZE, flagcxDataType_t, flagcxRedOp_t, _INT,
                                      flagcxComm_t, flagcxStream_t)),
    "flagcxAllGather": (flagcxResult_t, (_PTR, _PTR, _SIZE, flagcxDataType_t, flagcxComm_t,
                                         flagcxStream_t)),
    "flagcxReduceScatter": (flagcxResult_t, (_PTR, _PTR, _SIZE, flagcxDataType_t, flagcxRedOp_t,
                                             flagcxComm_t, flagcxStream_t)),
    "flagcxBroadcast": (flagcxResult_t, (_PTR, _PTR, _SIZE, flagcxDataType_t, _INT, flagcxComm_t,
                                         flagcxStream_t)),
    "flagcxSend": (flagcxResult_t, (_PTR, _SIZE, flagcxDataType_t, _INT, flagcxComm_t,
                                    flagcxStream_t)),
    "flagcxRecv": (flagcxResult_t, (_PTR, _SIZE, flagcxDataType_t, _INT, flagcxComm_t,
                                    flagcxStream_t)),
    "flagcxGroupStart": (flagcxResult_t, (flagcxComm_t,)),
    "flagcxGroupEnd": (flagcxResult_t, (flagcxComm_t,)),
}

# flagcxDataType_t / flagcxRedOp_t values.
FLAGCX_SUM = 0
_DTYPE_NAMES = {
    "int8": 0, "uint8": 1, "int32": 2, "int64": 4, "float16": 6, "float32": 7, "float64": 8,
    "bfloat16": 9, "bool": 1,  # bool travels as uint8 (same size); never reduced
}


# --- locating and loading the library ----------------------------------------------------------


def library_candidates(flagcx_path: str | None) -> list[str]:
    """Where ``libflagcx.so`` is looked for, in order."""
    if not flagcx_path:
        return ["libflagcx.so (system loader: LD_LIBRARY_PATH, ldconfig)"]
    root = Path(flagcx_path)
    if root.suffix == ".so" or root.name.startswith("libflagcx.so"):
        return [str(root)]
    return [str(root / sub / "libflagcx.so") for sub in ("build/lib", "lib", "lib64", ".")]


def find_library(flagcx_path: str | None) -> str:
    """Path (or loader name) of ``libflagcx.so``; raises `FlagCXError` naming what was tried."""
    candidates = library_candidates(flagcx_path)
    if not flagcx_path:
        return "libflagcx.so"
    for cand in candidates:
        if os.path.isfile(cand):
            return cand
    raise FlagCXError(
        f"SGLANG_FL_DIST_BACKEND=flagcx but libflagcx.so was not found under "
        f"FLAGCX_PATH={flagcx_path!r}; looked for: {', '.join(candidates)}. Build FlagCX "
        f"(make USE_NVIDIA=1 / USE_ASCEND=1 / USE_MUSA=1 ...) or point FLAGCX_PATH at the checkout "
        f"or install prefix that holds it."
    )


class FlagCXLibrary:
    """The loaded library with every `PROTOTYPES` entry bound and checked present."""

    def __init__(self, path: str):
        self.path = path
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            hint = "" if os.sep in path else " (FLAGCX_PATH is not set)"
            raise FlagCXError(f"cannot load FlagCX library {path}{hint}: {exc}") from exc
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                raise FlagCXError(
                    f"{path} has no symbol {name}; sglang-fl needs FlagCX >= {FLAGCX_MIN_VERSION} "
                    f"(the flagcx.h API with flagcxDeviceHandleInit and a caller-allocated "
                    f"flagcxUniqueId). Rebuild FlagCX from a newer checkout."
                ) from None
            fn.restype, fn.argtypes = restype, list(argtypes)
            setattr(self, name, fn)

    def check(self, result: int, call: str) -> None:
        if result != 0:
            msg = self.flagcxGetErrorString(result)
            text = msg.decode(errors="replace") if msg else "unknown error"
            raise FlagCXError(f"{call} failed with flagcxResult {result}: {text}")

    def version(self) -> int:
        v = _INT(0)
        self.check(self.flagcxGetVersion(ctypes.byref(v)), "flagcxGetVersion")
        return v.value


@functools.cache
def load_library(flagcx_path: str | None) -> FlagCXLibrary:
    """Load (once per process and path) the FlagCX library found through ``FLAGCX_PATH``."""
    lib = FlagCXLibrary(find_library(flagcx_path))
    logger.info("FlagCX loaded from %s (flagcxGetVersion=%d)", lib.path, lib.version())
    return lib


# --- the engine --------------------------------------------------------------------------------


def _raw_stream(device) -> int:
    """The native handle (cudaStream_t, aclrtStream, ...) of ``device``'s current torch stream."""
    import torch

    if device.type == "cpu":
        return 0  # host tensors have no stream; only a test double of the library accepts them
    stream = torch.get_device_module(device).current_stream(device)
    for attr in ("cuda_stream", "npu_stream", "musa_stream"):
        handle = getattr(stream, attr, None)
        if handle is not None:
            return int(handle)
    raise FlagCXError(f"cannot find the native handle of {type(stream).__name__} for {device}")


class FlagCXEngine:
    """One FlagCX communicator for one process group; tensors must be contiguous.

    Every method enqueues on the current stream and returns; results are ordered with later work
    on that stream (like NCCL). In-place where FlagCX allows (same send and receive buffer).
    """

    def __init__(self, lib: FlagCXLibrary, *, rank: int, world_size: int, device,
                 cpu_group=None, ranks: Sequence[int] | None = None):
        self.lib, self.rank, self.world_size, self.device = lib, rank, world_size, device
        self._streams: dict[int, flagcxStream_t] = {}
        self._dev = flagcxDeviceHandle_t()
        lib.check(lib.flagcxDeviceHandleInit(ctypes.byref(self._dev)), "flagcxDeviceHandleInit")
        uid = flagcxUniqueId()
        if rank == 0:
            lib.check(lib.flagcxGetUniqueId(ctypes.byref(uid)), "flagcxGetUniqueId")
        if world_size > 1:
            uid = self._share_unique_id(uid, cpu_group, ranks)
        self.comm = flagcxComm_t()
        lib.check(lib.flagcxCommInitRank(ctypes.byref(self.comm), world_size, ctypes.byref(uid),
                                         rank), "flagcxCommInitRank")

    @staticmethod
    def _share_unique_id(uid: flagcxUniqueId, cpu_group, ranks) -> flagcxUniqueId:
        import torch
        import torch.distributed as dist

        buf = torch.frombuffer(bytearray(bytes(uid)), dtype=torch.uint8)
        dist.broadcast(buf, src=ranks[0], group=cpu_group)
        return flagcxUniqueId.from_buffer_copy(buf.numpy().tobytes())

    # helpers
    def _stream(self) -> flagcxStream_t:
        raw = _raw_stream(self.device)
        stream = self._streams.get(raw)
        if stream is None:
            stream = flagcxStream_t()
            self.lib.check(self._dev.contents.streamCopy(ctypes.byref(stream), raw),
                           "flagcxDeviceHandle.streamCopy")
            self._streams[raw] = stream
        return stream

    @staticmethod
    def _dtype(tensor) -> int:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in _DTYPE_NAMES:
            raise FlagCXError(f"FlagCX has no data type for {tensor.dtype}")
        return _DTYPE_NAMES[name]

    @staticmethod
    def _ptr(tensor) -> int | None:
        return tensor.data_ptr() if tensor is not None and tensor.numel() else None

    # collectives (ranks are ranks in the group)
    def all_reduce(self, tensor) -> None:
        p = self._ptr(tensor)
        self.lib.check(self.lib.flagcxAllReduce(p, p, tensor.numel(), self._dtype(tensor),
                                                FLAGCX_SUM, self.comm, self._stream()),
                       "flagcxAllReduce")

    def all_gather_into(self, output, input_) -> None:
        self.lib.check(self.lib.flagcxAllGather(self._ptr(input_), self._ptr(output),
                                                input_.numel(), self._dtype(input_), self.comm,
                                                self._stream()), "flagcxAllGather")

    def reduce_scatter_into(self, output, input_) -> None:
        self.lib.check(self.lib.flagcxReduceScatter(self._ptr(input_), self._ptr(output),
                                                    output.numel(), self._dtype(input_),
                                                    FLAGCX_SUM, self.comm, self._stream()),
                       "flagcxReduceScatter")

    def broadcast(self, tensor, src: int) -> None:
        p = self._ptr(tensor)
        self.lib.check(self.lib.flagcxBroadcast(p, p, tensor.numel(), self._dtype(tensor), src,
                                                self.comm, self._stream()), "flagcxBroadcast")

    def send(self, tensor, dst: int) -> None:
        self.lib.check(self.lib.flagcxSend(self._ptr(tensor), tensor.numel(), self._dtype(tensor),
                                           dst, self.comm, self._stream()), "flagcxSend")

    def recv(self, tensor, src: int) -> None:
        self.lib.check(self.lib.flagcxRecv(self._ptr(tensor), tensor.numel(), self._dtype(tensor),
                                           src, self.comm, self._stream()), "flagcxRecv")

    def all_gatherv_into(self, output, input_, sizes: Sequence[int]) -> None:
        """Rank r's ``sizes[r]`` rows land at row offset ``sum(sizes[:r])``: one broadcast per
        root, fused in a FlagCX group (FlagCX has no all-gather-v)."""
        row = math.prod(input_.shape[1:])
        stream, dtype, offset = self._stream(), self._dtype(output), 0
        self._group(True)
        try:
            for root, n in enumerate(sizes):
                dst = output[offset:offset + n]
                src = input_ if root == self.rank else dst
                self.lib.check(self.lib.flagcxBroadcast(self._ptr(src), self._ptr(dst), n * row,
                                                        dtype, root, self.comm, stream),
                               "flagcxBroadcast")
                offset += n
        finally:
            self._group(False)

    def reduce_scatterv_into(self, output, input_, sizes: Sequence[int]) -> None:
        """Rows ``sizes[r]`` of the sum land on rank r: one reduce per root in a FlagCX group."""
        row = math.prod(input_.shape[1:])
        stream, dtype, offset = self._stream(), self._dtype(input_), 0
        self._group(True)
        try:
            for root, n in enumerate(sizes):
                chunk = input_[offset:offset + n]
                recv = output if root == self.rank else None
                self.lib.check(self.lib.flagcxReduce(self._ptr(chunk), self._ptr(recv), n * row,
                                                     dtype, FLAGCX_SUM, root, self.comm, stream),
                               "flagcxReduce")
                offset += n
        finally:
            self._group(False)

    def _group(self, start: bool) -> None:
        fn = self.lib.flagcxGroupStart if start else self.lib.flagcxGroupEnd
        self.lib.check(fn(self.comm), fn.__name__)

    def close(self) -> None:
        """Free stream wrappers, the communicator and the device handle (collective: every rank
        of the group must call it, as ``GroupCoordinator.destroy`` does)."""
        if self.comm is None:
            return
        for stream in self._streams.values():
            self._dev.contents.streamFree(stream)
        self._streams.clear()
        self.lib.check(self.lib.flagcxCommDestroy(self.comm), "flagcxCommDestroy")
        self.lib.flagcxDeviceHandleFree(self._dev)
        self.comm = None
