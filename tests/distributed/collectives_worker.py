"""One rank of the multi-process collective tests; run as ``python collectives_worker.py``.

It goes through the same path as a served model: SGLang's ``load_plugins()`` (which runs
sglang-fl's plugin and applies its hooks), then SGLang's ``init_distributed_environment`` /
``initialize_model_parallel`` and real ``GroupCoordinator`` objects. Every collective is compared
exactly with an expectation computed locally from the data every rank can regenerate.
Data are small integers, so sums are exact in bf16 too.

Writes ``{"calls": {group: {method: n}}, "checks": n}`` to ``--out``; any mismatch raises.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

DTYPES = ("float32", "bfloat16", "int64")


def data(torch, rank: int, shape, dtype: str, salt: int = 0):
    """Deterministic per-rank tensor of small integers (|x| <= 40), exact in every dtype."""
    n = 1
    for s in shape:
        n *= s
    base = (torch.arange(n, dtype=torch.int64) * (rank + 2) + 7 * rank + 3 * salt) % 81 - 40
    return base.reshape(shape).to(getattr(torch, dtype))


class Checker:
    def __init__(self, torch, group, label):
        self.torch, self.g, self.label, self.count = torch, group, label, 0
        self.me, self.ws = group.rank_in_group, group.world_size

    def same(self, got, want, what):
        got = got.cpu()
        if got.dtype != want.dtype or got.shape != want.shape or not self.torch.equal(got, want):
            raise AssertionError(f"[{self.label} rank {self.me}] {what}: got {got.dtype} "
                                 f"{tuple(got.shape)} {got.flatten()[:8].tolist()} want "
                                 f"{want.dtype} {tuple(want.shape)} {want.flatten()[:8].tolist()}")
        self.count += 1

    def on_device(self, t):
        return t.to(self.g.device)

    def run_all(self, uneven_sizes):
        torch, g, me, ws = self.torch, self.g, self.me, self.ws
        for dt in DTYPES:
            def mine(shape, salt=0, dt=dt):
                return data(torch, me, shape, dt, salt)

            def every(shape, salt=0, dt=dt):
                return [data(torch, r, shape, dt, salt) for r in range(ws)]

            # all_reduce: in place, returns the tensor
            x = self.on_device(mine((5, 3)))
            self.same(g.all_reduce(x), sum(every((5, 3))), f"all_reduce {dt}")
            self.same(x, sum(every((5, 3))), f"all_reduce in place {dt}")
            # non-contiguous input keeps its layout and gets the result
            xt = self.on_device(mine((3, 4), 1)).t()
            self.same(g.all_reduce(xt), sum(t.t() for t in every((3, 4), 1)), f"all_reduce non-contig {dt}")

            # all_gather along dim 0 and -1, and into a list
            self.same(g.all_gather(self.on_device(mine((2, 3), 2)), dim=0),
                      torch.cat(every((2, 3), 2), dim=0), f"all_gather dim0 {dt}")
            self.same(g.all_gather(self.on_device(mine((2, 3), 3))),
                      torch.cat(every((2, 3), 3), dim=-1), f"all_gather dim-1 {dt}")
            outs = [self.on_device(torch.empty((4,), dtype=getattr(torch, dt))) for _ in range(ws)]
            assert g.all_gather(self.on_device(mine((4,), 4)), output_tensor_list=outs) is None
            for r, o in enumerate(outs):
                self.same(o, data(torch, r, (4,), dt, 4), f"all_gather list[{r}] {dt}")

            # all_gather_into_tensor
            out = self.on_device(torch.empty((ws * 3, 2), dtype=getattr(torch, dt)))
            g.all_gather_into_tensor(out, self.on_device(mine((3, 2), 5)))
            self.same(out, torch.cat(every((3, 2), 5)), f"all_gather_into_tensor {dt}")

            # reduce_scatter_tensor and reduce_scatter (list)
            full = sum(every((ws * 2, 3), 6))
            out = self.on_device(torch.empty((2, 3), dtype=getattr(torch, dt)))
            g.reduce_scatter_tensor(out, self.on_device(mine((ws * 2, 3), 6)))
            self.same(out, full[me * 2:(me + 1) * 2], f"reduce_scatter_tensor {dt}")
            parts = [self.on_device(mine((3,), 7 + r)) for r in range(ws)]
            out = self.on_device(torch.empty((3,), dtype=getattr(torch, dt)))
            g.reduce_scatter(out, parts)
            self.same(out, sum(data(torch, r, (3,), dt, 7 + me) for r in range(ws)), f"reduce_scatter {dt}")

            # all_gatherv: uneven rows (including a rank with none), tensor and list inputs
            sizes = uneven_sizes
            got = g.all_gatherv(self.on_device(mine((sizes[me], 3), 8)), sizes=sizes)
            assert isinstance(got, list) and len(got) == 1
            want = torch.cat([data(torch, r, (sizes[r], 3), dt, 8) for r in range(ws)])
            self.same(got[0], want, f"all_gatherv {dt}")
            got = g.all_gatherv([self.on_device(mine((sizes[me], 2), 9)),
                                 self.on_device(mine((sizes[me],), 10))], sizes=sizes)
            self.same(got[0], torch.cat([data(torch, r, (sizes[r], 2), dt, 9) for r in range(ws)]),
                      f"all_gatherv list[0] {dt}")
            self.same(got[1], torch.cat([data(torch, r, (sizes[r],), dt, 10) for r in range(ws)]),
                      f"all_gatherv list[1] {dt}")
            got = g.all_gatherv(self.on_device(mine((2, 2), 11)))  # sizes=None: even
            self.same(got[0], torch.cat(every((2, 2), 11)), f"all_gatherv even {dt}")

            # reduce_scatterv: uneven and even
            total = sum(sizes)
            full = sum(every((total, 2), 12))
            start = sum(sizes[:me])
            out = g.reduce_scatterv(self.on_device(mine((total, 2), 12)), sizes=sizes)
            self.same(out, full[start:start + sizes[me]], f"reduce_scatterv {dt}")
            full = sum(every((ws * 2, 2), 13))
            out = self.on_device(torch.empty((2, 2), dtype=getattr(torch, dt)))
            ret = g.reduce_scatterv(self.on_device(mine((ws * 2, 2), 13)), output=out)
            assert ret is out
            self.same(out, full[me * 2:(me + 1) * 2], f"reduce_scatterv even {dt}")

            # broadcast from the last rank, in place
            src = ws - 1
            b = self.on_device(mine((6,), 14))
            self.same(g.broadcast(b, src=src), data(torch, src, (6,), dt, 14), f"broadcast {dt}")

            # send/recv ring (even ranks send first, odd ranks receive first)
            nxt, prv = (me + 1) % ws, (me - 1) % ws
            payload = self.on_device(mine((2, 5), 15))
            if me % 2 == 0:
                g.send(payload, dst=nxt)
                got = g.recv(torch.Size((2, 5)), getattr(torch, dt), src=prv)
            else:
                got = g.recv(torch.Size((2, 5)), getattr(torch, dt), src=prv)
                g.send(payload, dst=nxt)
            self.same(got, data(torch, prv, (2, 5), dt, 15), f"send/recv ring {dt}")

    def tensor_dicts(self, label_salt=20):
        torch, g, me, ws = self.torch, self.g, self.me, self.ws

        def make(r):
            d = {f"t_{dt}": self.on_device(data(torch, r, (3, 2), dt, label_salt)) for dt in DTYPES}
            d["empty"] = self.on_device(torch.empty((0, 4)))
            d["host"] = data(torch, r, (5,), "int64", label_salt + 1)  # stays on the CPU group
            d["meta"] = {"rank": r, "tag": "x"}
            return d

        def check(got, r, what):
            want = make(r)
            assert set(got) == set(want), f"{what}: keys {sorted(got)}"
            assert got["meta"] == want["meta"], f"{what}: meta {got['meta']}"
            assert got["empty"].shape == (0, 4)
            assert got["host"].device.type == "cpu"
            for k in want:
                if k != "meta":
                    self.same(got[k], want[k].cpu(), f"{what} [{k}]")

        src = 0  # SGLang's shared-memory broadcaster (TP group) only serves src=0
        got = g.broadcast_tensor_dict(make(me) if me == src else None, src=src)
        check(got, src, "broadcast_tensor_dict")
        nxt, prv = (me + 1) % ws, (me - 1) % ws
        if me % 2 == 0:
            g.send_tensor_dict(make(me), dst=nxt)
            got = g.recv_tensor_dict(src=prv)
        else:
            got = g.recv_tensor_dict(src=prv)
            g.send_tensor_dict(make(me), dst=nxt)
        check(got, prv, "send/recv_tensor_dict")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rank, ws = args.rank, args.world_size

    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    from sglang.srt.plugins import load_plugins

    load_plugins()  # runs sglang_fl's plugin -> register_hooks -> HookRegistry.apply_hooks

    import torch
    from sglang.srt.distributed import parallel_state as ps

    from sglang_fl.config import get_settings
    from sglang_fl.distributed import dist_backend_string

    assert hasattr(ps.GroupCoordinator.all_reduce, "__wrapped__"), "Layer-3 hooks not applied"
    settings = get_settings()
    if settings.platform == "cuda":
        torch.cuda.set_device(rank)
    ps.init_distributed_environment(
        world_size=ws, rank=rank, local_rank=rank, backend=dist_backend_string(settings),
        distributed_init_method=f"tcp://127.0.0.1:{args.port}", timeout=120)
    from sglang_fl.sglang_glue.adapters import get_adapter

    get_adapter().initialize_model_parallel(tp_size=args.tp, pp_size=args.pp, rank=rank)

    groups = {"world": ps.get_world_group(), "tp": ps.get_tp_group()}
    checks = 0
    for label, group in groups.items():
        if group.world_size == 1:
            assert group.fl_communicator is None
            continue
        c = Checker(torch, group, label)
        # uneven sizes with a zero: [1, 3] for 2 ranks, [2, 0, 3, 1] for 4
        sizes = [1, 3] if group.world_size == 2 else [2, 0, 3, 1][: group.world_size]
        c.run_all(sizes)
        c.tensor_dicts()
        checks += c.count

    pp = ps.get_pp_group()
    if pp.world_size > 1:
        # pipeline stage hand-off as SGLang does it: send a slice, receiver all-gathers over TP
        c = Checker(torch, pp, "pp")
        tp = groups["tp"]
        me = pp.rank_in_group
        tensors = {"h": c.on_device(data(torch, 0, (4, 6), "bfloat16", 30)), "n": 7}
        if me == 0:
            pp.send_tensor_dict(tensors, dst=1, all_gather_group=tp)
        else:
            got = pp.recv_tensor_dict(src=0, all_gather_group=tp)
            assert got["n"] == 7
            c.same(got["h"], tensors["h"].cpu(), "pp send/recv_tensor_dict with TP all-gather")
        checks += c.count

    calls = {label: dict(g.fl_communicator.calls)
             for label, g in {**groups, "pp": pp}.items() if g.fl_communicator is not None}
    with open(args.out, "w") as f:
        json.dump({"calls": calls, "checks": checks,
                   "engine": {k: g.fl_communicator.engine_name for k, g in groups.items()
                              if g.fl_communicator is not None}}, f)
    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


if __name__ == "__main__":
    sys.exit(main())
