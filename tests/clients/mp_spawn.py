"""A plain ``python train.py`` that starts its own ranks with ``torch.multiprocessing.spawn`` (FSDP2).

    python tests/clients/mp_spawn.py --world-size 2 --port 29631 --log-losses out-{rank}.txt

No launcher sets ``RANK`` / ``WORLD_SIZE``: each spawned process joins the group by itself.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

VOCAB, SEQ = 64, 8


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Embedding(VOCAB, 32),
        nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)),
        nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)),
        nn.Linear(32, VOCAB),
    )


def worker(rank: int, world_size: int, port: int, steps: int, log_losses: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    model = build()
    for block in (model[1], model[2]):
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(11 + rank)
    losses = []
    for _ in range(steps):
        batch = torch.randint(VOCAB, (4, SEQ + 1), generator=generator)
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    if log_losses:
        with open(log_losses.format(rank=rank), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(losses))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--port", type=int, default=29631)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--log-losses", default="")
    args = parser.parse_args()
    mp.spawn(worker, args=(args.world_size, args.port, args.steps, args.log_losses), nprocs=args.world_size)


if __name__ == "__main__":
    main()
