"""All-reduces until stopped (Ctrl-C tests)."""
import sys

import torch
import torch.distributed as dist

import wccl.distributed  # noqa: F401

dist.init_process_group("wccl")
print("started", flush=True)
while True:
    dist.all_reduce(torch.ones(100))
