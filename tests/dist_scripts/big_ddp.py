"""DDP around a model of about 20 MB whose ranks seed it alike: how long DDP's start takes.

Run by tests/test_distributed.py through `python -m wccl.launch`. DDP broadcasts rank 0's parameters at its
start; every rank already holds them, so only their digests cross. `--differ` seeds rank 1 otherwise (a
small model then: its real bytes cross); `--both` does the one, then the other, in one process group. Prints
one JSON line a model: {"rank", "phase" ("alike" or "differ"), "params_sha256", "model_bytes", "start_s" (the
room's time DDP's constructor took), "posted" (tensor bytes this rank posted meanwhile)}.
"""

from __future__ import annotations

import argparse
import hashlib
import json

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import wccl.distributed as wd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--differ", action="store_true", help="rank 1 seeds its (smaller) model otherwise")
    p.add_argument("--both", action="store_true", help="the model seeded alike, then the one seeded otherwise")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("wccl")
    rank = dist.get_rank()
    for differ in (False, True) if a.both else (a.differ,):
        torch.manual_seed(1 + (rank if differ else 0))
        width = 160 if differ else 1880  # 1880: 21 MB of float32 parameters; 160: 154 KB
        model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width // 2))
        posted, t0 = wd.bytes_posted(), wd.sim_seconds()
        ddp = DDP(model)
        start_s, posted = wd.sim_seconds() - t0, wd.bytes_posted() - posted
        flat = torch.cat([q.detach().reshape(-1) for q in ddp.module.parameters()])
        print(json.dumps({"rank": rank, "phase": "differ" if differ else "alike",
                          "params_sha256": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
                          "model_bytes": flat.numel() * 4, "start_s": round(start_s, 3), "posted": posted}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
