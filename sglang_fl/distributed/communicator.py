"""`CommunicatorFL`: the collectives of one SGLang `GroupCoordinator`, on an engine we choose.

The hooks in `sglang_fl.distributed.hooks` hand each `GroupCoordinator` call here. Methods keep
SGLang's names, parameters and return conventions, so a hook is one line and SGLang's callers
(model layers, the MoE dispatcher, pipeline-parallel scheduling) see no difference.

Two engines implement the device primitives (ranks are ranks *in the group*):

- `TorchEngine`: torch.distributed on the group's device process group (gloo on CPU).
- `FlagCXEngine` (`sglang_fl.distributed.flagcx`): libflagcx.so through ctypes.

Host tensors met by a device-bound engine (e.g. CPU metadata on a FlagCX group) go over the
group's CPU (gloo) process group, as SGLang itself does. A group of one rank gets no
communicator: SGLang's methods already short-circuit that case.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from sglang_fl.logging_setup import get_logger
from sglang_fl.metrics import track_communicator

logger = get_logger("sglang_fl.distributed")

# torch >= 2.13 names these *_single and deprecates the old names; 2.11 has only the old ones.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class TorchEngine:
    """torch.distributed on one process group; in place, blocking like SGLang's own fallbacks."""

    def __init__(self, group, ranks: Sequence[int], rank: int):
        self.group, self.ranks, self.rank, self.world_size = group, list(ranks), rank, len(ranks)

    def all_reduce(self, tensor) -> None:
        dist.all_reduce(tensor, group=self.group)

    def all_gather_into(self, output, input_) -> None:
        # flat views: gloo insists on output shape (world * input rows, ...) exactly
        _all_gather_single(output.view(-1), input_.view(-1), group=self.group)

    def reduce_scatter_into(self, output, input_) -> None:
        _reduce_scatter_single(output.view(-1), input_.view(-1), group=self.group)

    def broadcast(self, tensor, src: int) -> None:
        dist.broadcast(tensor, src=self.ranks[src], group=self.group)

    def send(self, tensor, dst: int) -> None:
        dist.send(tensor, self.ranks[dst], group=self.group)

    def isend(self, tensor, dst: int):
        return dist.isend(tensor, self.ranks[dst], group=self.group)

    def recv(self, tensor, src: int) -> None:
        dist.recv(tensor, self.ranks[src], group=self.group)

    def all_gatherv_into(self, output, input_, sizes: Sequence[int]) -> None:
        """Uneven all-gather as an even one over rows padded to ``max(sizes)``."""
        most, rest = max(sizes), tuple(input_.shape[1:])
        padded = input_.new_zeros((most,) + rest)
        padded[: input_.shape[0]] = input_
        gathered = input_.new_empty((self.world_size * most,) + rest)
        self.all_gather_into(gathered, padded)
        offset = 0
        for r, n in enumerate(sizes):
            output[offset:offset + n] = gathered[r * most: r * most + n]
            offset += n

    def reduce_scatterv_into(self, output, input_, sizes: Sequence[int]) -> None:
        """Uneven reduce-scatter as an even one over chunks padded to ``max(sizes)`` rows."""
        most, rest = max(sizes), tuple(input_.shape[1:])
        padded = input_.new_zeros((self.world_size * most,) + rest)
        offset = 0
        for r, n in enumerate(sizes):
            padded[r * most: r * most + n] = input_[offset:offset + n]
            offset += n
        reduced = input_.new_empty((most,) + rest)
        self.reduce_scatter_into(reduced, padded)
        output.copy_(reduced[: sizes[self.rank]])

    def close(self) -> None:
        """Nothing to free: SGLang destroys its process groups itself."""


def _sglang_tensor_dict_parts():
    """SGLang's tensor-dict split, its metadata type and its async-send handle (the adapter
    knows where they live in the installed version)."""
    from sglang_fl.sglang_glue.adapters import get_adapter

    return get_adapter().tensor_dict_parts()


def _contiguous(tensor):
    return tensor if tensor.is_contiguous() else tensor.contiguous()


class CommunicatorFL:
    """Collectives for one GroupCoordinator; ``calls`` counts each method (cheap, and lets tests
    and ``sglang-fl`` diagnostics prove the hooks are taken). The log shows the count of each
    method of each group and rank whenever it reaches a power of two (1, 2, 4, ...): a running
    tally of what a server sent through Layer 3, at most ~30 lines per method in a server's
    life."""

    def __init__(self, *, rank_in_group: int, ranks: Sequence[int], device, engine,
                 cpu_group=None, engine_name: str = "torch", name: str = "group"):
        self.name, self.rank_in_group, self.ranks = name, rank_in_group, list(ranks)
        self.world_size = len(self.ranks)
        self.device, self.engine, self.engine_name = device, engine, engine_name
        self.host_engine = (TorchEngine(cpu_group, ranks, rank_in_group)
                            if cpu_group is not None and device.type != "cpu" else engine)
        self.calls: Counter[str] = Counter()
        self.failed = False
        track_communicator(self)  # exports ``calls`` from a thread: nothing per call

    @classmethod
    def for_group(cls, group, engine_kind: str, flagcx_path: str | None = None):
        """The communicator of a freshly built GroupCoordinator, or None for a group of one."""
        if group.world_size == 1:
            return None
        if engine_kind == "flagcx":
            from sglang_fl.distributed.flagcx import FlagCXEngine, FlagCXError, load_library

            if group.device.type == "cpu":
                raise FlagCXError(
                    f"SGLANG_FL_DIST_BACKEND=flagcx but {group.unique_name} runs on the CPU: "
                    "FlagCX has no CPU device adaptor; use SGLANG_FL_DIST_BACKEND=gloo")

            engine = FlagCXEngine(load_library(flagcx_path), rank=group.rank_in_group,
                                  world_size=group.world_size, device=group.device,
                                  cpu_group=group.cpu_group, ranks=group.ranks)
        elif engine_kind == "torch":
            engine = TorchEngine(group.device_group, group.ranks, group.rank_in_group)
        else:
            raise ValueError(f"unknown Layer-3 engine {engine_kind!r}; expected 'flagcx' or 'torch'")
        logger.info("CommunicatorFL(%s) for %s: ranks %s, device %s", engine_kind,
                    group.unique_name, group.ranks, group.device)
        return cls(rank_in_group=group.rank_in_group, ranks=group.ranks, device=group.device,
                   engine=engine, cpu_group=group.cpu_group, engine_name=engine_kind,
                   name=group.unique_name)

    def _count(self, method: str) -> None:
        n = self.calls[method] = self.calls[method] + 1
        if n & (n - 1):  # not a power of two: nothing to log
            return
        if n == 1:  # the list of collectives a server really used
            logger.info("%s rank %d: first %s through CommunicatorFL(%s)", self.name,
                        self.rank_in_group, method, self.engine_name)
        else:
            logger.info("%s rank %d: %s call %d through CommunicatorFL(%s)", self.name,
                        self.rank_in_group, method, n, self.engine_name)

    def _engine(self, tensor):
        return self.host_engine if tensor.is_cpu else self.engine

    # --- SGLang GroupCoordinator surface ---------------------------------------------------

    def all_reduce(self, input_):
        self._count("all_reduce")
        work = _contiguous(input_)
        self._engine(input_).all_reduce(work)
        if work is not input_:
            input_.copy_(work)
        return input_

    def all_gather_into_tensor(self, output, input):  # noqa: A002  (SGLang's parameter name)
        self._count("all_gather_into_tensor")
        self._gather_into(output, _contiguous(input))

    def _gather_into(self, output, input_) -> None:
        work = _contiguous(output)
        self._engine(input_).all_gather_into(work, input_)
        if work is not output:
            output.copy_(work)

    def all_gather(self, input_, dim: int = -1, output_tensor_list=None):
        self._count("all_gather")
        ws, src = self.world_size, _contiguous(input_)
        if output_tensor_list is not None:
            flat = src.new_empty((ws,) + tuple(src.shape))
            self._gather_into(flat, src)
            for out, part in zip(output_tensor_list, flat, strict=True):
                out.copy_(part)
            return None
        assert -input_.dim() <= dim < input_.dim(), f"Invalid dim ({dim}) for {input_.size()}"
        dim += input_.dim() if dim < 0 else 0
        size = tuple(input_.shape)
        out = src.new_empty((size[0] * ws,) + size[1:])
        self._gather_into(out, src)
        out = out.reshape((ws,) + size).movedim(0, dim)
        return out.reshape(size[:dim] + (ws * size[dim],) + size[dim + 1:])

    def reduce_scatter_tensor(self, output, input):  # noqa: A002
        self._count("reduce_scatter_tensor")
        self._scatter_into(output, _contiguous(input))
        return output

    def _scatter_into(self, output, input_) -> None:
        work = _contiguous(output)
        self._engine(input_).reduce_scatter_into(work, input_)
        if work is not output:
            output.copy_(work)

    def reduce_scatter(self, output, input_list):
        self._count("reduce_scatter")
        self._scatter_into(output, torch.cat([t.reshape(-1) for t in input_list]))
        return output

    def all_gatherv(self, input_, sizes: Sequence[int] | None = None, output=None):
        """Like SGLang's: a tensor or a list of tensors in, always a list out. ``output`` (SGLang
        0.5.23's signature): a buffer for a single tensor's result, returned in the list."""
        self._count("all_gatherv")
        inputs = [input_] if isinstance(input_, torch.Tensor) else list(input_)
        if output is not None and not isinstance(input_, torch.Tensor):
            raise ValueError("all_gatherv `output` requires a single-tensor input")
        if sizes is not None:
            assert len(sizes) == self.world_size, f"sizes {sizes} != world size {self.world_size}"
        outputs = []
        for inp in inputs:
            inp = _contiguous(inp)
            rest = tuple(inp.shape[1:])
            if sizes is None or len(set(sizes)) == 1:
                out = inp.new_empty((inp.shape[0] * self.world_size,) + rest)
                self._gather_into(out, inp)
            else:
                assert inp.shape[0] == sizes[self.rank_in_group], (
                    f"rank {self.rank_in_group} has {inp.shape[0]} rows, sizes says "
                    f"{sizes[self.rank_in_group]}")
                out = inp.new_empty((sum(sizes),) + rest)
                self._engine(inp).all_gatherv_into(out, inp, sizes)
            if output is not None:
                output.copy_(out.view_as(output))
                out = output
            outputs.append(out)
        return outputs

    def reduce_scatterv(self, input_, output=None, sizes: Sequence[int] | None = None):
        self._count("reduce_scatterv")
        input_ = _contiguous(input_)
        if sizes is not None:
            assert len(sizes) == self.world_size and input_.shape[0] == sum(sizes), (
                f"sizes {sizes} do not split {input_.shape[0]} rows over {self.world_size} ranks")
            rows = sizes[self.rank_in_group]
        else:
            assert input_.shape[0] % self.world_size == 0
            rows = input_.shape[0] // self.world_size
        shape = (rows,) + tuple(input_.shape[1:])
        if output is None:
            output = input_.new_empty(shape)
        assert tuple(output.shape) == shape, f"output {tuple(output.shape)} != {shape}"
        if sizes is None or len(set(sizes)) == 1:
            self._scatter_into(output, input_)
        else:
            work = _contiguous(output)
            self._engine(input_).reduce_scatterv_into(work, input_, sizes)
            if work is not output:
                output.copy_(work)
        return output

    def broadcast(self, input_, src: int = 0):
        self._count("broadcast")
        assert src < self.world_size, f"Invalid src rank ({src})"
        work = _contiguous(input_)
        self._engine(input_).broadcast(work, src)
        if work is not input_:
            input_.copy_(work)
        return input_

    def send(self, tensor, dst: int | None = None) -> None:
        self._count("send")
        dst = (self.rank_in_group + 1) % self.world_size if dst is None else dst
        self._engine(tensor).send(_contiguous(tensor), dst)

    def recv(self, size, dtype, src: int | None = None):
        self._count("recv")
        src = (self.rank_in_group - 1) % self.world_size if src is None else src
        tensor = torch.empty(size, dtype=dtype, device=self.device)
        self._engine(tensor).recv(tensor, src)
        return tensor

    # --- tensor dictionaries (pipeline parallelism) ------------------------------------------
    # Metadata goes through SGLang's own object channel (CPU group or its shared-memory queue);
    # tensors go through the engines above.

    def _empty_like_meta(self, meta):
        device = self.device if meta.device == self.device.type else meta.device
        return torch.empty(meta.size, dtype=meta.dtype, device=device)

    def broadcast_tensor_dict(self, coordinator, tensor_dict=None, src: int = 0, group=None,
                              metadata_group=None):
        """``group``/``metadata_group`` are accepted and ignored, as SGLang does."""
        _split_tensor_dict, TensorMetadata, _ = _sglang_tensor_dict_parts()
        self._count("broadcast_tensor_dict")
        assert src < self.world_size, f"Invalid src rank ({src})"
        if self.rank_in_group == src:
            assert isinstance(tensor_dict, dict), f"Expecting a dictionary, got {type(tensor_dict)}"
            metadata, tensors = _split_tensor_dict(tensor_dict)
            coordinator.broadcast_object(metadata, src=src)
            for tensor in tensors:
                if tensor.numel():
                    self._engine(tensor).broadcast(_contiguous(tensor), src)
            return tensor_dict
        metadata = coordinator.broadcast_object(None, src=src)
        result = {}
        for key, value in metadata:
            if isinstance(value, TensorMetadata):
                value = self._empty_like_meta(value)
                if value.numel():
                    self._engine(value).broadcast(value, src)
            result[key] = value
        return result

    def send_tensor_dict(self, coordinator, tensor_dict, dst: int | None = None,
                         all_gather_group=None, async_send: bool = False):
        _split_tensor_dict, _, P2PWork = _sglang_tensor_dict_parts()
        self._count("send_tensor_dict")
        dst = (self.rank_in_group + 1) % self.world_size if dst is None else dst
        assert dst < self.world_size, f"Invalid dst rank ({dst})"
        assert isinstance(tensor_dict, dict), f"Expecting a dictionary, got {type(tensor_dict)}"
        ag_size = 1 if all_gather_group is None else all_gather_group.world_size
        ag_rank = 0 if all_gather_group is None else all_gather_group.rank_in_group
        metadata, tensors = _split_tensor_dict(tensor_dict)
        works = coordinator.send_object(metadata, dst=dst, async_send=async_send)
        for tensor in tensors:
            if tensor.numel() == 0:
                continue
            if all_gather_group is not None and tensor.numel() % ag_size == 0:
                tensor = tensor.reshape(ag_size, -1)[ag_rank]  # send a slice, peer all-gathers
            tensor, engine = _contiguous(tensor), self._engine(tensor)
            if async_send and isinstance(engine, TorchEngine):
                works.append(P2PWork(engine.isend(tensor, dst), tensor))
            else:
                engine.send(tensor, dst)  # FlagCX: stream-ordered, nothing to wait on
        return works

    def recv_tensor_dict(self, coordinator, src: int | None = None, all_gather_group=None):
        _, TensorMetadata, _ = _sglang_tensor_dict_parts()
        self._count("recv_tensor_dict")
        src = (self.rank_in_group - 1) % self.world_size if src is None else src
        assert src < self.world_size, f"Invalid src rank ({src})"
        ag_size = 1 if all_gather_group is None else all_gather_group.world_size
        ag_rank = 0 if all_gather_group is None else all_gather_group.rank_in_group
        result: dict[str, Any] = {}
        for key, value in coordinator.recv_object(src=src):
            if isinstance(value, TensorMetadata):
                tensor = self._empty_like_meta(value)
                if tensor.numel():
                    sliced = all_gather_group is not None and tensor.numel() % ag_size == 0
                    part = tensor.reshape(ag_size, -1)[ag_rank] if sliced else tensor
                    self._engine(part).recv(part, src)
                    if sliced:
                        tensor = all_gather_group.all_gather(part, dim=0).reshape(value.size)
                value = tensor
            result[key] = value
        return result

    def report_failure(self, method: str, exc: BaseException) -> None:
        """Log, once per communicator, which group, rank and call failed. Typically a peer
        process died (killed, out of memory, crashed): the transport error names no process,
        and the other ranks only see their peer vanish, so this line says where to look."""
        if self.failed:
            return
        self.failed = True
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        logger.error(
            "%s rank %d: %s through CommunicatorFL(%s) failed: %s. If a peer process of this "
            "group (global ranks %s) died, its log has the first error; SGLang stops the server.",
            self.name, self.rank_in_group, method, self.engine_name, first_line, self.ranks)

    def close(self) -> None:
        self.engine.close()
