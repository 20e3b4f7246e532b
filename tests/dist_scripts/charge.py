"""Rank 0 computes for CPU_S seconds of CPU between two collectives; both ranks report the simulated
seconds the second collective took from the first one's end (the compute must be charged, the waiting
rank must wait for it)."""

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
t0 = wd.sim_seconds()
if rank == 0:
    cpu_s = float(os.environ.get("CPU_S", "0.4"))
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        sum(i * i for i in range(1000))
dist.all_reduce(x)
sys.stdout.write(json.dumps({"rank": rank, "took_s": wd.sim_seconds() - t0}) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
