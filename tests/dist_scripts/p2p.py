"""send, recv, isend, irecv, recv from any source, tags and batch_isend_irecv: a part of parts.py. Each rank
knows what every rank sends (seeded generators), so it checks what it receives itself. Returns "sources":
the ranks a recv from any source named, in order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def data(src: int, dst: int, n: int, salt: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + 31 * src + 7 * dst + n)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 3).to(dtype)
    return torch.randint(0, 1000, (n,), generator=g).to(dtype)


def run(rank: int, world: int, checks, wd) -> dict:
    check = checks.check

    # 1. blocking ping-pong between ranks 0 and 1, two tags, the second message sent first
    if rank == 0:
        sends = [dist.isend(data(0, 1, 9, 1), dst=1, tag=5), dist.isend(data(0, 1, 4, 2, torch.int64), dst=1, tag=3)]
        back = torch.zeros(6)
        dist.recv(back, src=1, tag=0)
        for w in sends:
            w.wait()
        check("ping_pong/back", back, data(1, 0, 6, 3))
    elif rank == 1:
        second = torch.zeros(4, dtype=torch.int64)
        dist.recv(second, src=0, tag=3)  # tag 3 was sent after tag 5: tags are matched apart
        first = torch.zeros(9)
        dist.recv(first, src=0, tag=5)
        check("ping_pong/tag3", second, data(0, 1, 4, 2, torch.int64))
        check("ping_pong/tag5", first, data(0, 1, 9, 1))
        dist.send(data(1, 0, 6, 3), dst=0)

    # 2. in order: three messages with one tag, received in the order they were sent
    if rank == 1:
        works = [dist.isend(data(1, 0, 5, 10 + k), dst=0, tag=7) for k in range(3)]
        for w in works:
            w.wait()
    elif rank == 0:
        outs = [torch.zeros(5) for _ in range(3)]
        works = [dist.irecv(o, src=1, tag=7) for o in outs]
        for k, (w, o) in enumerate(zip(works, outs)):
            w.wait()
            check(f"in_order/{k}", o, data(1, 0, 5, 10 + k))

    # 3. recv from any source: every other rank sends rank 0 one message
    sources = []
    if rank == 0:
        came = {}
        for _ in range(world - 1):
            t = torch.zeros(3, dtype=torch.int64)
            src = dist.recv(t, tag=9)
            sources.append(src)
            came[src] = t
        for src in sorted(came):  # (in rank order: the order they come in is the room's)
            check(f"any_source/from{src}", came[src], data(src, 0, 3, 20, torch.int64))
        checks.cases["any_source/all"] = sorted(sources) == list(range(1, world))
    else:
        dist.send(data(rank, 0, 3, 20, torch.int64), dst=0, tag=9)

    # 4. a ring of batch_isend_irecv: each rank sends to the next and receives from the previous
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    inbox = torch.zeros(8, dtype=torch.float64)
    ops = [dist.P2POp(dist.isend, data(rank, nxt, 8, 30, torch.float64), nxt),
           dist.P2POp(dist.irecv, inbox, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check("ring", inbox, data(prv, rank, 8, 30, torch.float64))
    return {"sources": sources}
