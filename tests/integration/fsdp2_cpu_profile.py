"""A tiny FSDP2 training job on CPU/gloo profiled with plain torch.profiler (no fsdpviz).

Run under ``torchrun --nproc_per_node 2``; writes ``rank{R}.trace.json.gz`` and
``rank{R}.clock.json`` (the wall clock, ``time.time_ns()``, just before and just after every
``prof.step()``) to OUT_DIR.
Model: 4 ``Linear(256, 256)`` units under a root, so each unit gathers 65,792 float32 parameters.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile, schedule

DIM = 256
N_UNITS = 4
STEPS = 5  # wait 1, warmup 1, active 3 -> ProfilerStep#2, #3, #4


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(DIM, DIM) for _ in range(N_UNITS)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, DIM)
    boundaries_ns: list[tuple[int, int]] = []
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3),
        record_shapes=True,
        profile_memory=True,
    ) as prof:
        for _ in range(STEPS):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            before = time.time_ns()
            prof.step()
            boundaries_ns.append((before, time.time_ns()))
    prof.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.trace.json.gz"))
    with open(os.path.join(out_dir, f"rank{rank}.clock.json"), "w") as fh:
        json.dump({"step_boundaries_ns": boundaries_ns}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
