"""Runs parts of torch.distributed's API in one process group, each part checked on each rank, bit for bit.

    python -m wccl.launch --config ROOM tests/dist_scripts/parts.py spread p2p groups
    torchrun --nproc-per-node 3 tests/dist_scripts/parts.py spread p2p groups --backend gloo

A part is a module of this folder with `run(rank, world, checks, wd) -> dict` (`wd` is wccl.distributed, or
None on another backend); it checks its results with `checks.check(name, got, want)` and returns what else
it measured. Each rank prints one JSON line per part: {"rank", "world", "part", "cases": {name: ok},
"digest": sha256 of every result, ...what the part returned}. One launch for several parts saves a room's
start-up and every rank's imports per part.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json

import torch
import torch.distributed as dist


class Checks:
    """A part's cases and results."""

    def __init__(self) -> None:
        self.cases: dict[str, bool] = {}
        self.results: list[torch.Tensor] = []

    def check(self, name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        self.cases[name] = bool(torch.equal(got, want))
        self.results.append(got.reshape(-1).double())

    def digest(self) -> str:
        return hashlib.sha256(torch.cat(self.results).numpy().tobytes() if self.results else b"").hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("parts", nargs="+", help="modules of tests/dist_scripts with a run() function")
    p.add_argument("--backend", default="wccl")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.backend == "wccl":
        import wccl.distributed as wd
    else:
        wd = None
    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    for name in a.parts:
        checks = Checks()
        extra = importlib.import_module(name).run(rank, world, checks, wd)
        dist.barrier()
        print(json.dumps({"rank": rank, "world": world, "part": name, "cases": checks.cases,
                          "digest": checks.digest(), **extra}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
