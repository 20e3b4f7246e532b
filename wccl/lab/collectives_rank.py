"""The rank program of `python -m wccl.lab collectives` (run by wccl.launch on every rank).

Issues each collective (all_reduce, broadcast, all_gather, reduce_scatter,
barrier) on float32 tensors of each size, one at a time, checks every result
against what it must be, and times it in the room's simulated seconds (from
issue to result; the program's compute between calls is charged too, and is
negligible here), from a barrier that every rank leaves together. Every
rank prints one JSON line with its rows; the lab keeps, per row, the
slowest rank.

Each row also says which algorithm of protocols.algorithms carried the
collective (as the rank's node counted them: wccl.distributed.algorithms_used) and
how many tensor bytes this rank had to read off other screens under that
algorithm (`_received`: the algorithm's own plans played through in
memory, counting every transfer shown to this rank). A collective that
fails (e.g. an algorithm that cannot run in the room) gives a row with its
error, not a crash.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import wccl.distributed as wd
from wccl.cli import command_parser

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


def _call(op: str, nbytes: int, world: int) -> tuple[str, str, int, int]:
    """What the backend hands the algorithms for `_one(op, nbytes)`: (op, dtype, numel, payload bytes)."""
    n = max(1, nbytes // 4)
    per = max(1, n // world)
    return {"all_reduce": ("allreduce", "float32", n, 4 * n), "broadcast": ("broadcast", "float32", n, 4 * n),
            "all_gather": ("allgather", "float32", per, 4 * per),
            "reduce_scatter": ("reduce_scatter", "float32", per * world, 4 * per * world),
            "barrier": ("barrier", "uint8", 1, 1)}[op]


def _received(op: str, nbytes: int, world: int, algorithm: str, sight=None) -> list[int]:
    """Tensor bytes each rank must read off other screens for `_one(op, nbytes)` carried by `algorithm`
    (a name of protocols.algorithms): every rank's plan is played through in memory, and each transfer
    a plan shows counts once for every rank it is shown to (its `dest`). E.g. all_reduce of B bytes:
    all_see_all (n-1) B on every rank; ring 2(n-1)/n B; star (n-1) B on the hub, B on the others.
    (On the complete sight graph by default: which rank is the hub or the ring's order may differ in the
    room, but not the counts' largest and smallest, which the lab reports. A camera that reads a screen
    also decodes the transfers shown there for others: the node's own `bytes_received` counts those.)"""
    import functools

    from actors.collectives import fold
    from protocols.algorithms import Sight
    from protocols.registry import REGISTRY

    name, dtype, numel, size = _call(op, nbytes, world)
    cls = REGISTRY.get("algorithm", algorithm)
    sight = sight or Sight.complete(world, 20_000.0, 0.3)
    plans = [cls(r, world, name, dtype, numel, bytes(size), 0, "sum", sight,
                 functools.partial(fold, dtype=dtype, reduce_op="sum")) for r in range(world)]
    got = [0] * world
    queue = [(r, s) for r, p in enumerate(plans) for s in p.start()]
    steps = 0
    while queue:
        origin, send = queue.pop(0)
        steps += 1
        if steps > 100_000:
            raise RuntimeError(f"{algorithm} {name}: the plans do not finish")
        for r in range(world):
            if r != origin and send.dest >> r & 1:
                got[r] += len(send.payload)
                queue += [(r, s) for s in plans[r].received(origin, send.part, send.payload)]
    return got


def _configured() -> str:
    """The room's configured collective algorithm ("auto" or a name), from the rank's room file."""
    from wccl.config import load_config

    return load_config(os.environ["WCCL_CONFIG"]).collectives.algorithm


def main() -> None:
    p = command_parser("wccl.lab.collectives_rank")
    p.add_argument("--sizes", default="4,2048,65536,1048576")
    p.add_argument("--ops", default="all_reduce,broadcast,all_gather,reduce_scatter,barrier")
    p.add_argument("--repeat", type=int, default=3, help="times each small collective (<= 2 KB) is run")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("wccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    configured = _configured()
    rows = []
    for op in args.ops.split(","):
        for nbytes in [int(s) for s in args.sizes.split(",")]:
            if op == "barrier" and nbytes != 4:
                continue
            times, ok, error, ran = [], True, None, set()
            for _ in range(args.repeat if nbytes <= 2048 else 1):
                dist.barrier()  # not timed: every rank starts the measured call from the same point
                before = wd.algorithms_used()
                t0 = wd.sim_seconds()
                try:
                    ok &= _one(op, nbytes, rank, world)
                except Exception as e:  # noqa: BLE001 - the row says why (e.g. an algorithm the room cannot carry)
                    ok, error = False, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                times.append(wd.sim_seconds() - t0)
                ran.update(a for a, k in wd.algorithms_used().items() if k > before.get(a, 0))
                if error is not None:
                    break
            algorithm = ",".join(sorted(ran))
            try:
                got = _received(op, nbytes, world, algorithm)[rank] if len(ran) == 1 and error is None else None
            except Exception:  # noqa: BLE001 - a count the bench cannot make is left out, not a failure
                got = None
            row = {"op": op, "bytes": nbytes if op != "barrier" else 1, "correct": bool(ok),
                   "received_bytes": got, "algorithm": algorithm, "configured": configured,
                   "latency_s": round(max(times), 4), "latency_min_s": round(min(times), 4)}
            if error is not None:
                row["error"] = error
            rows.append(row)
            print(f"[rank {rank}] {op} {nbytes} B ({algorithm or configured}): {max(times):.3f} s"
                  + (f" FAILED: {error}" if error else ""), file=sys.stderr, flush=True)
    dist.barrier()
    print(json.dumps({"rank": rank, "world": world, "rows": rows, "node": wd.node_results()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
