"""One rank of the Layer-3 smoke: ``python -m sglang_fl.smoke.layer3_worker --rank R ...``.

The same path as a served model: SGLang's ``load_plugins()`` (sglang-fl's hooks applied), then
SGLang's ``init_distributed_environment`` / ``initialize_model_parallel`` and its real TP
``GroupCoordinator``. Results are compared exactly (small integers, exact in float32)."""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rank, ws = args.rank, args.world_size

    from sglang_fl.config import get_settings

    settings = get_settings()
    if settings.platform == "cpu":
        os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from sglang_fl.sglang_glue.adapters import get_adapter

    adapter = get_adapter()
    adapter.load_plugins()
    import torch

    from sglang_fl.distributed import dist_backend_string
    from sglang_fl.smoke.checks import device_of

    ps = adapter.module("parallel_state")

    if not hasattr(ps.GroupCoordinator.all_reduce, "__wrapped__"):
        raise SystemExit("Layer-3 hooks are not applied to GroupCoordinator.all_reduce")
    dev = device_of(settings.platform)
    if dev != "cpu":
        getattr(torch, dev).set_device(rank)
    ps.init_distributed_environment(
        world_size=ws, rank=rank, local_rank=rank, backend=dist_backend_string(settings),
        distributed_init_method=f"tcp://127.0.0.1:{args.port}", timeout=120)
    adapter.initialize_model_parallel(tp_size=ws, rank=rank)
    group = ps.get_tp_group()
    comm = getattr(group, "fl_communicator", None)
    if comm is None:
        raise SystemExit("TP group has no CommunicatorFL: collectives are not sglang-fl's")

    checks = 0

    def same(got, want, what):
        nonlocal checks
        if not torch.equal(got.cpu(), want):
            raise SystemExit(f"rank {rank} {what}: got {got.cpu().tolist()} want {want.tolist()}")
        checks += 1

    def mine(r, n=6):
        return torch.arange(n, dtype=torch.float32) * (r + 1) + r

    x = mine(rank).to(group.device)
    same(group.all_reduce(x), sum(mine(r) for r in range(ws)), "all_reduce")
    same(group.all_gather(mine(rank).reshape(2, 3).to(group.device), dim=0),
         torch.cat([mine(r).reshape(2, 3) for r in range(ws)]), "all_gather")
    b = mine(rank).to(group.device)
    same(group.broadcast(b, src=ws - 1), mine(ws - 1), "broadcast")
    with open(args.out, "w") as f:
        json.dump({"rank": rank, "checks": checks, "communicator": type(comm).__name__}, f)
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


if __name__ == "__main__":
    main()
