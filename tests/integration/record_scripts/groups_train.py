"""Two same-size all-gathers in two gloo groups every step, the one issued first finishing last.

    torchrun --nproc_per_node 2 groups_train.py --truth truth.json

A small FSDP2 model trains (so that ``fsdpviz record`` profiles its steps); beside it, each step,
the script makes two groups of the same two ranks, ``first`` and ``second``, each run one
all-gather of ``NUMEL`` floats. Rank 0 issues ``first``'s all-gather before ``second``'s, but
``first``'s gloo workers are still busy with all-reduces that rank 1 joins only ``DELAY_S`` later,
so on rank 0 ``second``'s all-gather runs (and ends) before ``first``'s. Paired in issue order by
size, the two would swap.

The truth (``--truth``, rank 0): each group's name, and per step the time from the end of
``second``'s all-gather to the end of ``first``'s, by the script's own clock, read in a callback of
each work's future: gloo completes the future on the thread that ran the collective, as it ends, where a
thread waiting on the work would read it whenever the machine next ran that thread.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

NUMEL = 777  # no FSDP gather of the model has this size
DELAY_S = 0.15  # rank 1 joins ``first``'s all-reduces this much later
BLOCKERS = 3  # all-reduces that hold ``first``'s gloo workers (two threads per group)


def ended_at(work: dist.Work, out: dict[str, int], key: str) -> threading.Event:
    """Note when ``work`` ended (monotonic ns), from its future's callback; the event is set once noted."""
    noted = threading.Event()

    def note(_: torch.futures.Future) -> None:
        out[key] = time.monotonic_ns()
        noted.set()

    work.get_future().add_done_callback(note)
    return noted


def exchange(first: dist.ProcessGroup, second: dist.ProcessGroup) -> dict[str, int]:
    """One step's two all-gathers; rank 0 returns when each ended."""
    rank = dist.get_rank()
    shard = torch.full((NUMEL,), float(rank))
    out = {name: torch.empty(NUMEL * 2) for name in ("first", "second")}
    blockers = [torch.ones(4096) for _ in range(BLOCKERS)]
    ends: dict[str, int] = {}
    if rank == 0:
        works = [dist.all_reduce(b, group=first, async_op=True) for b in blockers]
        gather_first = dist.all_gather_into_tensor(out["first"], shard, group=first, async_op=True)
        gather_second = dist.all_gather_into_tensor(out["second"], shard, group=second, async_op=True)
        noted = [ended_at(gather_first, ends, "first"), ended_at(gather_second, ends, "second")]
        for event in noted:
            event.wait()
        gather_first.wait()
        gather_second.wait()
        for w in works:
            w.wait()
    else:
        dist.all_gather_into_tensor(out["second"], shard, group=second)
        time.sleep(DELAY_S)
        works = [dist.all_reduce(b, group=first, async_op=True) for b in blockers]
        dist.all_gather_into_tensor(out["first"], shard, group=first)
        for w in works:
            w.wait()
    for name, gathered in out.items():  # the gathers moved real data: rank r's shard at r * NUMEL
        assert torch.equal(gathered, torch.cat([torch.zeros(NUMEL), torch.ones(NUMEL)])), name
    return ends


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    first = dist.new_group([0, 1])
    second = dist.new_group([0, 1])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    lag_ms = []
    for _ in range(args.steps):
        loss = model(torch.randn(8, 32, generator=generator)).square().mean()
        loss.backward()
        ends = exchange(first, second)
        if ends:
            lag_ms.append((ends["first"] - ends["second"]) / 1e6)
        optimizer.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        with open(args.truth, "w") as f:
            json.dump({"groups": {"first": first.group_name, "second": second.group_name}, "numel": NUMEL,
                       "first_ends_after_second_ms": lag_ms}, f)
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads finish releasing the last collective (see examples/train.py)


if __name__ == "__main__":
    main()
