"""FSDP1 with activation checkpointing by ``checkpoint_wrapper``, outside or inside the FSDP units.

    torchrun --nproc_per_node 2 tests/clients/fsdp1_checkpoint.py --checkpoint outside --log-losses out-{rank}.txt

``outside``: the model is wrapped with FSDP per block first, then ``apply_activation_checkpointing``
wraps each FSDP unit in a ``CheckpointWrapper`` (the order torch's FSDP tutorial uses).
``inside``: each block's MLP is wrapped in a ``CheckpointWrapper`` before FSDP wraps the blocks, so
the checkpointed region is part of the unit.
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

VOCAB, SEQ = 64, 8


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp: nn.Module = Mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", choices=["outside", "inside"], default="outside")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--log-losses", default="")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Model()
    non_reentrant = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    if args.checkpoint == "inside":
        for block in model.blocks:
            block.mlp = non_reentrant(block.mlp)
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), device_id=torch.device("cpu"))
    if args.checkpoint == "outside":
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=non_reentrant,
                                       check_fn=lambda m: isinstance(m, FSDP) and isinstance(m.module, Block))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(17 + rank)
    losses = []
    for step in range(args.steps):
        batch = torch.randint(VOCAB, (4, SEQ + 1), generator=generator)
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
    if args.log_losses:
        with open(args.log_losses.format(rank=rank), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(losses))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
