"""Rank 1 dies after the first collective; rank 0's next all_reduce must fail with a clear error after
the timeout given to init_process_group (never hang, never hand back a wrong tensor)."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import wccl.distributed  # noqa: F401

dist.init_process_group("wccl", timeout=timedelta(seconds=float(os.environ.get("DEAD_TIMEOUT_S", "5"))))
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
if rank == 1:
    # Bob has alice's part, but she may not have read his yet: stay on screen a moment (the room's time
    # runs on while he sleeps) so that the collective that fails is the next one, as the test says.
    time.sleep(1.0)
    os._exit(3)  # the laptop is gone: no goodbye
y = torch.full((4,), 7.0)
try:
    dist.all_reduce(y)
    print(json.dumps({"rank": rank, "error": None, "y": y.tolist()}), flush=True)
except Exception as e:  # noqa: BLE001
    print(json.dumps({"rank": rank, "error": str(e), "y": y.tolist(), "type": type(e).__name__}), flush=True)
os._exit(0)
