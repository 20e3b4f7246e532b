"""An all_reduce and a broadcast, the two collectives whose algorithm the sight graph decides at a table
(the tree of sight for small tensors): each rank prints its results as one JSON line."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

import wccl.distributed  # noqa: F401  (registers the backend)


def main() -> None:
    dist.init_process_group("wccl")
    rank = dist.get_rank()
    x = torch.arange(4, dtype=torch.float32) + 10 * rank
    dist.all_reduce(x)
    b = torch.tensor([42, 7], dtype=torch.int64) if rank == 0 else torch.zeros(2, dtype=torch.int64)
    dist.broadcast(b, src=0)
    print(json.dumps({"rank": rank, "all_reduce": x.tolist(), "broadcast": b.tolist()}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
