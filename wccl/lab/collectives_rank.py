"""The rank program of `python -m wccl.lab collectives` (run by wccl.launch on every rank).

Issues each collective (all_reduce, broadcast, all_gather, reduce_scatter,
barrier) on float32 tensors of each size, one at a time, checks every result
against what it must be, and times it in the room's simulated seconds (from
issue to result; the program's compute between calls is charged too, and is
negligible here), from a barrier that every rank leaves together. Every
rank prints one JSON line with its rows; the lab keeps, per row, the
slowest rank.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist

import wccl.distributed as wd


def _one(op: str, nbytes: int, rank: int, world: int) -> bool:
    n = max(1, nbytes // 4)
    gen = torch.Generator().manual_seed(n * 31 + rank)
    if op == "all_reduce":
        x = torch.randn(n, generator=gen)
        want = sum(torch.randn(n, generator=torch.Generator().manual_seed(n * 31 + r)) for r in range(world))
        dist.all_reduce(x)
        return torch.allclose(x, want, rtol=1e-5, atol=1e-6)
    if op == "broadcast":
        x = torch.randn(n, generator=torch.Generator().manual_seed(n)) if rank == 0 else torch.zeros(n)
        dist.broadcast(x, src=0)
        return torch.equal(x, torch.randn(n, generator=torch.Generator().manual_seed(n)))
    if op == "all_gather":
        per = max(1, n // world)
        x = torch.full((per,), float(rank))
        out = torch.empty(per * world)
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(out, x)  # (renamed in torch 2.13)
        return torch.equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(per))
    if op == "reduce_scatter":
        per = max(1, n // world)
        x = torch.arange(per * world, dtype=torch.float32)
        out = torch.empty(per)
        getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, x)
        return torch.equal(out, world * torch.arange(rank * per, (rank + 1) * per, dtype=torch.float32))
    if op == "barrier":
        dist.barrier()
        return True
    raise ValueError(op)


def _received(op: str, nbytes: int, rank: int, world: int) -> int:
    """Tensor bytes this rank must read off other screens for the collective (all-see-all)."""
    n = max(1, nbytes // 4)
    per = max(1, n // world) * 4  # all_gather / reduce_scatter: one part per rank (as _one makes them)
    return {"all_reduce": n * 4 * (world - 1), "broadcast": n * 4 if rank != 0 else 0,
            "all_gather": per * (world - 1), "reduce_scatter": per * world * (world - 1),
            "barrier": world - 1}[op]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="4,2048,65536,1048576")
    p.add_argument("--ops", default="all_reduce,broadcast,all_gather,reduce_scatter,barrier")
    p.add_argument("--repeat", type=int, default=3, help="times each small collective (<= 2 KB) is run")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("wccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    for op in args.ops.split(","):
        for nbytes in [int(s) for s in args.sizes.split(",")]:
            if op == "barrier" and nbytes != 4:
                continue
            times, ok = [], True
            for _ in range(args.repeat if nbytes <= 2048 else 1):
                dist.barrier()  # not timed: every rank starts the measured call from the same point
                t0 = wd.sim_seconds()
                ok &= _one(op, nbytes, rank, world)
                times.append(wd.sim_seconds() - t0)
            rows.append({"op": op, "bytes": nbytes if op != "barrier" else 1, "correct": bool(ok),
                         "received_bytes": _received(op, nbytes, rank, world),
                         "latency_s": round(max(times), 4), "latency_min_s": round(min(times), 4)})
            print(f"[rank {rank}] {op} {nbytes} B: {max(times):.3f} s", file=sys.stderr, flush=True)
    dist.barrier()
    print(json.dumps({"rank": rank, "world": world, "rows": rows, "node": wd.node_results()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
