"""Subgroups (new_group, new_subgroups_by_enumeration), their collectives interleaved with the world's: a
part of parts.py, on three ranks. Each rank knows every rank's inputs (seeded generators) and checks its
results itself.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def data(rank: int, n: int, salt: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    return (torch.randn(n, generator=g) * 3).round()  # whole numbers: any order of sums is exact


def run(rank: int, world: int, checks, wd) -> dict:
    assert world == 3, "groups runs on three ranks"
    check = checks.check

    g01 = dist.new_group([0, 1])
    g12 = dist.new_group([1, 2])
    pairs, _ = dist.new_subgroups_by_enumeration([[0, 2], [1]])

    # two groups alive at once, their collectives interleaved with the world's (rank 1 is in both)
    works = []
    x01 = data(rank, 6, 1)
    x12 = data(rank, 5, 2)
    if rank in (0, 1):
        works.append(dist.all_reduce(x01, group=g01, async_op=True))
    if rank in (1, 2):
        works.append(dist.all_reduce(x12, group=g12, async_op=True))
    xw = data(rank, 4, 3)
    dist.all_reduce(xw)
    for w in works:
        w.wait()
    if rank in (0, 1):
        check("g01/all_reduce", x01, data(0, 6, 1) + data(1, 6, 1))
    if rank in (1, 2):
        check("g12/all_reduce", x12, data(1, 5, 2) + data(2, 5, 2))
    check("world/all_reduce", xw, data(0, 4, 3) + data(1, 4, 3) + data(2, 4, 3))

    # broadcast, all_gather, reduce_scatter and a barrier on the enumerated subgroup of ranks 0 and 2
    members = [0, 2] if rank in (0, 2) else [1]
    b = data(rank, 7, 4)
    dist.broadcast(b, src=members[-1], group=pairs)
    check("pairs/broadcast", b, data(members[-1], 7, 4))
    outs = [torch.zeros(3) for _ in members]
    dist.all_gather(outs, data(rank, 3, 5), group=pairs)
    for r, o in zip(members, outs):
        check(f"pairs/all_gather/from{r}", o, data(r, 3, 5))
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, [data(rank, 2, 6 + k) for k in range(len(members))], group=pairs)
    me = members.index(rank)
    check("pairs/reduce_scatter", rs, sum(data(r, 2, 6 + me) for r in members))
    dist.barrier(group=pairs)

    # point to point inside a group, by group rank: g12's rank 1 (world rank 2) sends to its rank 0 (world 1)
    if rank == 2:
        dist.send(data(2, 4, 8), group_dst=0, group=g12)
    elif rank == 1:
        t = torch.zeros(4)
        dist.recv(t, group_src=1, group=g12)
        check("g12/send_recv", t, data(2, 4, 8))

    # a subgroup destroyed; the world goes on
    if rank in (0, 1):
        dist.destroy_process_group(g01)
    z = data(rank, 3, 9)
    dist.all_reduce(z)
    check("world/after_destroy", z, data(0, 3, 9) + data(1, 3, 9) + data(2, 3, 9))
    return {}
