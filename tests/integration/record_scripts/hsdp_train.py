"""FSDP2 with hybrid sharding (HSDP): a 2 x 1 device mesh, so each rank is its own shard group of one
and the two ranks are replicas that all-reduce their gradients.

    torchrun --nproc_per_node 2 hsdp_train.py

Each rank keeps every parameter, gradient and optimizer state whole: the memory model must shard
over the shard group (1 rank), not the world (2).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

STEPS = 6


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(STEPS):
        loss = model(torch.randn(8, 32, generator=generator)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads finish releasing the last all-reduce (see examples/train.py)


if __name__ == "__main__":
    main()
