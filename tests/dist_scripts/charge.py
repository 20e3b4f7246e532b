"""Rank 0 computes for CPU_S seconds of CPU between two collectives; both ranks report the simulated
seconds the second collective took from the first one's end (the compute must be charged, the waiting
rank must wait for it). With MODE=callback the compute and the second collective happen inside a
callback on the first one's future (as a comm hook's do)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import wccl.distributed as wd

dist.init_process_group("wccl")
rank = dist.get_rank()
x = torch.ones(8)
dist.all_reduce(x)


def busy() -> None:
    if rank == 0:
        cpu_s = float(os.environ.get("CPU_S", "0.4"))
        start = time.thread_time()
        while time.thread_time() - start < cpu_s:
            sum(i * i for i in range(1000))


t0 = wd.sim_seconds()
if os.environ.get("MODE") == "callback":
    def then(fut):
        busy()
        y = torch.ones(8)
        dist.all_reduce(y)
        return y

    dist.all_reduce(x, async_op=True).get_future().then(then).wait()
else:
    busy()
    dist.all_reduce(x)
sys.stdout.write(json.dumps({"rank": rank, "took_s": wd.sim_seconds() - t0}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
