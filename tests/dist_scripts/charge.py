"""Rank 0 computes between two collectives; both ranks report the simulated seconds the second collective
took from the first one's end (the compute must be charged, the waiting rank must wait for it).

PHASES (default "inline:0.4") names the measurements, run one after the other in this one launch, each
after an all-reduce of its own that brings the ranks together: `inline:S` computes S seconds of CPU between
two all-reduces; `callback:S` computes them, and issues the second all-reduce, inside a callback on the
first one's future (as a comm hook's do). Each rank prints one JSON line: {"rank", "took_s": [one a phase]}."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import wccl.distributed as wd

dist.init_process_group("wccl")
rank = dist.get_rank()


def busy(cpu_s: float) -> None:
    if rank == 0:
        start = time.thread_time()
        while time.thread_time() - start < cpu_s:
            sum(i * i for i in range(1000))


took = []
for phase in os.environ.get("PHASES", "inline:0.4").split(","):
    mode, _, cpu = phase.partition(":")
    cpu_s = float(cpu)
    x = torch.ones(8)
    dist.all_reduce(x)
    t0 = wd.sim_seconds()
    if mode == "callback":
        def then(fut, cpu_s=cpu_s):
            busy(cpu_s)
            y = torch.ones(8)
            dist.all_reduce(y)
            return y

        dist.all_reduce(x, async_op=True).get_future().then(then).wait()
    else:
        assert mode == "inline", phase
        busy(cpu_s)
        dist.all_reduce(x)
    took.append(wd.sim_seconds() - t0)
sys.stdout.write(json.dumps({"rank": rank, "took_s": took}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
