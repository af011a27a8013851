"""FSDP2 on a 2-D device mesh of 4 ranks: tensor parallel x FSDP (``--mode tp``) or HSDP (``--mode hsdp``).

    torchrun --nproc_per_node 4 mesh_train.py --mode tp --truth truth.json

``tp``: a 2 x 2 mesh ("dp", "tp"); every block's ``w1`` is ``ColwiseParallel`` and its ``w2``
``RowwiseParallel`` over "tp" (so each block all-reduces its activations forward and backward),
then ``fully_shard`` over "dp" of every block and the root.
``hsdp``: a 2 x 2 mesh ("replicate", "shard") and ``fully_shard(mesh=mesh)``: reduce-scatter within
a shard group, then all-reduce across the replicas.
``--extras``: a ``dist.barrier()`` and a ``dist.all_gather_object`` every step, communication
that is not FSDP's.

Rank 0 writes what the script itself knows to ``--truth`` (JSON): the mesh's dimension names and
sizes, and each unit's parameter bytes on a rank after tensor parallelism and before FSDP shards
them (``DTensor.to_local()``), so with "global" bytes for comparison.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

DIM = 32
LAYERS = 2
BATCH = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, 4 * DIM)
        self.w2 = nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(torch.relu(self.w1(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIM, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def local_bytes(module: nn.Module, *, exclude: nn.Module | None = None) -> tuple[int, int]:
    """(bytes on this rank, bytes of the whole parameters) of ``module``'s parameters."""
    skip = {id(p) for p in exclude.parameters()} if exclude is not None else set()
    local = whole = 0
    for p in module.parameters():
        if id(p) in skip:
            continue
        if isinstance(p, DTensor):
            local += p.to_local().numel() * p.element_size()
        else:
            local += p.numel() * p.element_size()
        whole += p.numel() * p.element_size()
    return local, whole


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("tp", "hsdp"), required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--extras", action="store_true")
    parser.add_argument("--truth", default="")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    names = ("dp", "tp") if args.mode == "tp" else ("replicate", "shard")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
    torch.manual_seed(0)
    model = Model()
    if args.mode == "tp":
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fsdp_mesh = mesh["dp"]
    else:
        fsdp_mesh = mesh
    units = {f"blocks.{i}": local_bytes(b) for i, b in enumerate(model.blocks)}
    units["(root)"] = local_bytes(model, exclude=model.blocks)
    for block in model.blocks:
        fully_shard(block, mesh=fsdp_mesh)
    fully_shard(model, mesh=fsdp_mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # Ranks of one tensor-parallel group must see the same batch; replicas and shards differ.
    data_rank = mesh.get_local_rank("dp") if args.mode == "tp" else dist.get_rank()
    generator = torch.Generator().manual_seed(data_rank)
    for _ in range(args.steps):
        loss = model(torch.randn(BATCH, DIM, generator=generator)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if args.extras:
            dist.barrier()
            found: list[object] = [None] * dist.get_world_size()
            dist.all_gather_object(found, float(loss))
    if dist.get_rank() == 0 and args.truth:
        truth = {"mesh": dict(zip(names, mesh.shape)),
                 "units": {u: {"local_bytes": lb, "global_bytes": gb} for u, (lb, gb) in units.items()}}
        with open(args.truth, "w", encoding="utf-8") as f:
            json.dump(truth, f)
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads finish releasing the last all-reduce (see examples/train.py)


if __name__ == "__main__":
    main()
