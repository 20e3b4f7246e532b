"""Hello, collectives: all_reduce, broadcast, all_gather and barrier on small tensors.

    python -m wccl.launch --config rooms/two-laptops-sim.toml examples/collectives_hello.py
    torchrun --nproc-per-node 2 examples/collectives_hello.py --backend gloo

Every rank prints one JSON line with what it got; the values are the same
on every rank, whatever the backend.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="wccl")
    args = p.parse_args()
    if args.backend == "wccl":
        import wccl.distributed  # noqa: F401
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    x = torch.arange(4, dtype=torch.float32) + 10 * rank
    dist.all_reduce(x)                                     # sum over ranks
    b = torch.tensor([42, 7], dtype=torch.int64) if rank == 0 else torch.zeros(2, dtype=torch.int64)
    dist.broadcast(b, src=0)                               # rank 0's tensor everywhere
    got = [torch.zeros(3, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(got, torch.full((3,), rank, dtype=torch.int32))
    work = dist.all_reduce(torch.ones(2), op=dist.ReduceOp.MAX, async_op=True)
    work.wait()
    dist.barrier()
    print(json.dumps({"rank": rank, "all_reduce": x.tolist(), "broadcast": b.tolist(),
                      "all_gather": [g.tolist() for g in got]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
