"""A Lightning ``Trainer`` with automatic optimization, sharded with FSDP2 in ``configure_model``.

    python tests/clients/lightning_trainer.py --devices 2 --log-losses out-{rank}.txt [--accumulate 2]

Lightning's automatic optimization steps the optimizer with a closure (``optimizer.step(closure)``): the
training step's forward and its backward run inside the optimizer's step. ``ModelParallelStrategy``
(Lightning's FSDP2 strategy; its ``FSDPStrategy`` needs a GPU) starts its own processes on the CPU; the
module shards every block and then the whole model in ``configure_model``, as Lightning's FSDP2 examples
do. ``--accumulate N``: ``accumulate_grad_batches``, whose earlier micro-batches run their closure
without an optimizer step, the last inside it.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

VOCAB, SEQ, DIM = 64, 8, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, 4 * DIM)
        self.fc2 = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Language(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.losses: list[float] = []

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        tokens, targets = batch
        loss = F.cross_entropy(self.model(tokens).reshape(-1, VOCAB), targets.reshape(-1))
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--log-losses", default="")
    parser.add_argument("--accumulate", type=int, default=1)
    args = parser.parse_args()
    L.seed_everything(0, verbose=False)
    data = torch.randint(VOCAB, (args.steps * args.accumulate * args.devices * 4, SEQ + 1),
                         generator=torch.Generator().manual_seed(5))
    loader = DataLoader(TensorDataset(data[:, :-1], data[:, 1:]), batch_size=4)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, max_steps=args.steps, logger=False,
                        strategy=ModelParallelStrategy(data_parallel_size=args.devices, tensor_parallel_size=1,
                                                       process_group_backend="gloo"),
                        accumulate_grad_batches=args.accumulate, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    module = Language()
    trainer.fit(module, loader)
    if args.log_losses:
        with open(args.log_losses.format(rank=trainer.global_rank), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(module.losses))


if __name__ == "__main__":
    main()
