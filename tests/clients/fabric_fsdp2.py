"""Lightning Fabric with ``ModelParallelStrategy``: FSDP2 applied in the user's ``parallelize_fn``.

    python tests/clients/fabric_fsdp2.py --devices 2 --log-losses out-{rank}.txt

Fabric starts its own processes (``fabric.launch()``); the parallelize function shards every block
with ``fully_shard`` and then the whole model, as Lightning's FSDP2 examples do. ``--parallelize FILE``
takes the ``parallelize(model, device_mesh)`` a file defines instead (``fsdpviz whatif RUN --code
--stack lightning`` writes one), as a user pastes another sharding into their script.
"""

from __future__ import annotations

import argparse
import runpy

import lightning as L
import torch
import torch.nn.functional as F
from lightning.fabric.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard

VOCAB, SEQ = 64, 8


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


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


def parallelize(model: Model, device_mesh: object) -> Model:
    mesh = device_mesh["data_parallel"]
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--log-losses", default="")
    parser.add_argument("--parallelize", default="", help="a file defining parallelize(model, device_mesh)")
    args = parser.parse_args()
    parallelize_fn = runpy.run_path(args.parallelize)["parallelize"] if args.parallelize else parallelize
    strategy = ModelParallelStrategy(parallelize_fn=parallelize_fn, data_parallel_size=args.devices,
                                     tensor_parallel_size=1)
    fabric = L.Fabric(accelerator="cpu", devices=args.devices, strategy=strategy)
    fabric.launch()
    fabric.seed_everything(0)
    model = fabric.setup(Model())
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    generator = torch.Generator().manual_seed(5 + fabric.global_rank)
    losses = []
    for step in range(args.steps):
        batch = torch.randint(VOCAB, (4, SEQ + 1), generator=generator)
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        fabric.print(f"step {step} loss {losses[-1]:.6f}")
    if args.log_losses:
        with open(args.log_losses.format(rank=fabric.global_rank), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(losses))
    del model, optimizer
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
