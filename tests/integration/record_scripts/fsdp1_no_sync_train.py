"""An FSDP1 training script written as users write one, with gradient accumulation under ``no_sync()``.

Five residual MLP blocks of dim 128 wrapped by ``ModuleWrapPolicy`` (``--root``: one root unit), AdamW,
activation checkpointing on the blocks, two micro-batches per optimizer step with ``no_sync()`` around
the first. ``--sharding-strategy SHARD_GRAD_OP`` keeps the parameters unsharded after forward, and inside
``no_sync()`` FSDP1 does not free them after backward either (``_should_free_in_backward``), so the second
micro-batch's forward gathers nothing; under ``FULL_SHARD`` it gathers every block again.

Run: ``python -m torch.distributed.run --standalone --nproc_per_node 2 fsdp1_no_sync_train.py``.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

DIM, BLOCKS, BATCH, CLASSES = 128, 5, 64, 8


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList(Block(DIM) for _ in range(BLOCKS))
        self.out = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", action="store_true", help="one root unit instead of a unit per block")
    parser.add_argument("--sharding-strategy", choices=["FULL_SHARD", "SHARD_GRAD_OP"], default="FULL_SHARD")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--log-losses", metavar="FILE", help="each step's loss, as float.hex, to FILE.rank{R}")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = FSDP(Net(), auto_wrap_policy=None if args.root else ModuleWrapPolicy({Block}),
                 sharding_strategy=ShardingStrategy[args.sharding_strategy], device_id=torch.device("cpu"))
    apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                   check_fn=lambda m: isinstance(m, Block))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(args.steps):
        for micro in range(2):
            x = torch.randn(BATCH, DIM, generator=data)
            y = torch.randint(0, CLASSES, (BATCH,), generator=data)
            with model.no_sync() if micro == 0 else contextlib.nullcontext():
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    if args.log_losses:
        with open(f"{args.log_losses}.rank{rank}", "w") as f:
            f.writelines(f"{v.hex()}\n" for v in losses)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
