"""A small FSDP2 trainer (2 CPU ranks) whose rank 0 writes, every step, lines to stdout and to stderr
in turn, each flushed: ``out S I`` then ``err S I`` for I in 0..LINES-1. Sent to one file (``2>&1``),
they read in that order, by construction."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

STEPS, LINES = 8, 20


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(2)), nn.Linear(32, 1))
    for block in model[:2]:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        model(torch.randn(8, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        if rank == 0:
            for i in range(LINES):
                print(f"out {step} {i}", flush=True)
                print(f"err {step} {i}", file=sys.stderr, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
