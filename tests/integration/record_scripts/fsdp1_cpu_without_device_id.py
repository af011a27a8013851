"""FSDP1 on CPU as it is often first written: ``FullyShardedDataParallel(model)`` without
``device_id=torch.device("cpu")``. FSDP1 then looks for a GPU and raises before the first forward.

    torchrun --nproc_per_node 2 fsdp1_cpu_without_device_id.py
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

dist.init_process_group("gloo")
model = FullyShardedDataParallel(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4)))  # no device_id
optimizer = torch.optim.AdamW(model.parameters())
for _ in range(3):
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
