"""Rank 1 raises RuntimeError: after init_process_group and one all_reduce (FAIL_AT=collective, the
default) or, 5 s after its start, before init_process_group (FAIL_AT=start). Rank 0 goes on
all-reducing (its timeout is long): only the launcher stopping it ends it."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import wccl.distributed  # noqa: F401

rank = int(os.environ["RANK"])
fail_at = os.environ.get("FAIL_AT", "collective")
if rank == 1 and fail_at == "start":
    time.sleep(5.0)  # (long enough for rank 0 to be greeting in init_process_group, however loaded the machine)
    raise RuntimeError("rank 1 fails before init_process_group")
dist.init_process_group("wccl", timeout=timedelta(seconds=600))
x = torch.ones(4)
dist.all_reduce(x)
if rank == 1:
    print("rank 1 is about to fail", file=sys.stderr, flush=True)
    raise RuntimeError("rank 1 fails after its first all_reduce")
while True:
    dist.all_reduce(x)
