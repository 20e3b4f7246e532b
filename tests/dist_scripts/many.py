"""all_reduce and all_to_all_single (uneven splits) on any number of ranks, each result checked on every rank
against what it must be (computed from the ranks' seeded inputs). Prints one JSON line a rank: rank, ok, the
checks that failed, and the room seconds each collective took.

    python -m wccl.launch --config ROOM.toml tests/dist_scripts/many.py
    torchrun --nproc-per-node N tests/dist_scripts/many.py --backend gloo
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist


def clock(backend: str):
    if backend == "wccl":
        import wccl.distributed as wd

        return wd.sim_seconds
    return time.perf_counter


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="wccl")
    p.add_argument("--numel", type=int, default=512, help="float32 elements of the all_reduce")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.backend == "wccl":
        import wccl.distributed  # noqa: F401
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    now = clock(args.backend)
    failed, took = [], {}

    def mine(r: int) -> torch.Tensor:  # whole numbers: their sum is exact in any order the ranks fold them
        return torch.randint(-1000, 1000, (args.numel,), generator=torch.Generator().manual_seed(100 + r)).float()

    t = now()
    x = mine(rank)
    dist.all_reduce(x)
    took["all_reduce"] = round(now() - t, 3)
    want = torch.zeros(args.numel)
    for r in range(world):
        want += mine(r)
    if not torch.equal(x, want):
        failed.append("all_reduce")

    # rank r sends (r + d) % 3 + 1 rows of 4 values to rank d: uneven, every pair different
    rows = [(rank + d) % 3 + 1 for d in range(world)]
    back = [(s + rank) % 3 + 1 for s in range(world)]
    out_rows = torch.cat([torch.full((n, 4), float(100 * rank + d)) for d, n in enumerate(rows)])
    got = torch.empty(sum(back), 4)
    t = now()
    dist.all_to_all_single(got, out_rows, output_split_sizes=back, input_split_sizes=rows)
    took["all_to_all_single"] = round(now() - t, 3)
    expect = torch.cat([torch.full((n, 4), float(100 * s + rank)) for s, n in enumerate(back)])
    if not torch.equal(got, expect):
        failed.append("all_to_all_single")
    print(json.dumps({"rank": rank, "world": world, "ok": not failed, "failed": failed, "took": took}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
