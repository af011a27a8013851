"""A small FSDP2 trainer (2 CPU ranks) that profiles some of its own steps with torch.profiler, as
scripts that profile themselves do: ``own_profiler_train.py FIRST LAST OUT`` opens its profiler before
step FIRST and closes it after step LAST, then writes, per rank, the names its own profiler counted
(its ``my_step`` ranges, the ops, and any step range of another profiler's) and each step's loss to
``OUT/rank{R}.json``."""

from __future__ import annotations

import collections
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

STEPS = 8


def main() -> None:
    first, last, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(3)), nn.Linear(32, 1))
    for block in model[:3]:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(rank)
    prof = None
    counted: collections.Counter[str] = collections.Counter()
    losses = []
    for step in range(STEPS):
        if step == first:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        with torch.profiler.record_function("my_step"):
            x = torch.randn(16, 32, generator=data)
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(float(loss.detach()).hex())
        if step == last and prof is not None:
            prof.__exit__(None, None, None)
            counted.update(e.name for e in prof.events()
                           if e.name == "my_step" or e.name.startswith(("aten::", "ProfilerStep")))
            prof = None
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps({"counted": counted, "losses": losses}))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
