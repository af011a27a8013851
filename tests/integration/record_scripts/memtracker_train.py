"""FSDP2 on CPU/gloo whose every step is measured by torch's own FSDP memory tracker.

    torchrun --nproc_per_node 2 memtracker_train.py --truth truth-{rank}.json

Each optimizer step (zero_grad, forward, backward, step) runs inside
``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``, which follows every tensor's storage
(module parameters and gradients, optimizer state, and every tensor an op makes) through
``__torch_dispatch__`` and keeps the highest total it saw: the step's peak of live tensor bytes, on
CPU too, where torch has no ``max_memory_allocated``. What it cannot see: tensors a collective makes
inside its own C++ implementation (gloo copies a reduce-scatter's input before reducing it), and
those made before the step that it was not told about (none here: the batch is made inside).

``--truth`` (with ``{rank}``) gets one JSON object per rank: ``peak_bytes`` per step (the tracker's
peak of the ``cpu`` device) and ``unit_bytes`` (the largest unit's unsharded parameter bytes, the
size of its reduce-scatter input that gloo copies).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    """A residual MLP block: enough parameters per unit that its buffers show in the peak."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[Block(args.dim) for _ in range(args.layers)])
    unit_bytes = max(sum(p.numel() * p.element_size() for p in block.parameters()) for block in model)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    peaks = []
    for _ in range(args.steps):
        tracker = FSDPMemTracker(model, optimizer)
        with tracker:
            optimizer.zero_grad()
            batch = torch.randn(16, 32, args.dim, generator=generator)
            model(batch).square().mean().backward()
            optimizer.step()
        peaks.append(int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]))
    with open(args.truth.format(rank=rank), "w", encoding="utf-8") as out:
        json.dump({"rank": rank, "peak_bytes": peaks, "unit_bytes": unit_bytes}, out)
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads finish releasing the last collective (see examples/train.py)


if __name__ == "__main__":
    main()
