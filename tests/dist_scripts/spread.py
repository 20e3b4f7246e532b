"""scatter, all_to_all, all_to_all_single (even and uneven) and the digest-first broadcast: a part of
parts.py. Each rank knows every rank's inputs (seeded generators), so it checks its results itself. Returns
the room time and the bytes this rank posted for a 256 KB broadcast that every rank already holds
("big_equal_s", "big_equal_posted"), and for one that only the root holds ("big_differ_posted").
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def data(rank: int, n: int, salt: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 3).to(dtype)
    return torch.randint(0, 100, (n,), generator=g).to(dtype)


def run(rank: int, world: int, checks, wd) -> dict:
    check = checks.check

    for root in range(world):
        for dtype in (torch.float32, torch.int64):
            out = torch.zeros(5, dtype=dtype)
            chunks = [data(root, 5, 10 + r, dtype) for r in range(world)] if rank == root else None
            dist.scatter(out, chunks, src=root)
            check(f"scatter/root{root}/{str(dtype)[6:]}", out, data(root, 5, 10 + rank, dtype))

    # all_to_all: rank r sends rank j a tensor of 3 elements (gloo takes equal sizes only)
    ins = [data(rank, 3, 20 + j) for j in range(world)]
    outs = [torch.zeros(3) for r in range(world)]
    dist.all_to_all(outs, ins)
    for r in range(world):
        check(f"all_to_all/from{r}", outs[r], data(r, 3, 20 + rank))

    # all_to_all_single, even: 3 rows of 4 to every rank
    x = data(rank, 12 * world, 30).reshape(3 * world, 4)
    y = torch.zeros(3 * world, 4)
    dist.all_to_all_single(y, x)
    want = torch.cat([data(r, 12 * world, 30).reshape(3 * world, 4)[3 * rank:3 * rank + 3] for r in range(world)])
    check("all_to_all_single/even", y, want)

    # all_to_all_single, uneven: rank r sends rank j (r + 2 * j) % 3 + 1 rows of 2 (int64)
    def rows(r: int, j: int) -> int:
        return (r + 2 * j) % 3 + 1

    in_splits = [rows(rank, j) for j in range(world)]
    out_splits = [rows(r, rank) for r in range(world)]
    x = data(rank, 2 * sum(in_splits), 40, torch.int64).reshape(-1, 2)
    y = torch.zeros(sum(out_splits), 2, dtype=torch.int64)
    work = dist.all_to_all_single(y, x, out_splits, in_splits, async_op=True)
    work.wait()
    parts = []
    for r in range(world):
        xr = data(r, 2 * sum(rows(r, j) for j in range(world)), 40, torch.int64).reshape(-1, 2)
        start = sum(rows(r, j) for j in range(rank))
        parts.append(xr[start:start + rows(r, rank)])
    check("all_to_all_single/uneven", y, torch.cat(parts))

    # all_to_all_single where rank 0 sends no rows at all (its input is 0 x 3): the others send it none either,
    # and one row each to every other rank
    sends = [0] * world if rank == 0 else [0] + [1] * (world - 1)
    x = data(rank, 3 * sum(sends), 45).reshape(-1, 3)
    gets = [0] * world if rank == 0 else [0] + [1] * (world - 1)
    y = torch.zeros(sum(gets), 3)
    dist.all_to_all_single(y, x, gets, sends)
    want = torch.zeros(0, 3) if rank == 0 else torch.cat(
        [data(r, 3 * (world - 1), 45).reshape(-1, 3)[rank - 1:rank] for r in range(1, world)])
    check("all_to_all_single/no_rows", y, want)

    # a 256 KB broadcast every rank already holds (seeded alike), then one only the root holds
    n = 64 * 1024
    posted = wd.bytes_posted() if wd else 0
    t0 = wd.sim_seconds() if wd else time.monotonic()
    same = data(0, n, 50)
    dist.broadcast(same, src=0)
    big_equal_s = (wd.sim_seconds() if wd else time.monotonic()) - t0
    big_equal_posted = (wd.bytes_posted() if wd else 0) - posted
    check("broadcast/256KB/held", same, data(0, n, 50))
    posted = wd.bytes_posted() if wd else 0
    differ = data(rank, n, 60)
    dist.broadcast(differ, src=world - 1)
    big_differ_posted = (wd.bytes_posted() if wd else 0) - posted
    check("broadcast/256KB/new", differ, data(world - 1, n, 60))
    return {"big_equal_s": round(big_equal_s, 3), "big_equal_posted": big_equal_posted,
            "big_differ_posted": big_differ_posted}
