"""All-reduces until stopped (Ctrl-C tests)."""
import sys

import torch
import torch.distributed as dist

import wccl.distributed  # noqa: F401

dist.init_process_group("wccl")
sys.stdout.write("started\n")  # one write: the ranks share the output
sys.stdout.flush()
while True:
    dist.all_reduce(torch.ones(100))
