"""FSDP2 in one plain ``python`` process (no torchrun, no RANK variable) that never steps a torch optimizer.

    python no_optimizer_train.py SECONDS MASTER_PORT

Updates the weights by hand for SECONDS seconds: fsdpviz must fall back to a time window.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard


def main() -> None:
    seconds, port = float(sys.argv[1]), sys.argv[2]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32))
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    x = torch.randn(8, 32)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        model(x).square().mean().backward()
        with torch.no_grad():
            for param in model.parameters():
                param -= 0.01 * param.grad
                param.grad = None
        time.sleep(0.005)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
