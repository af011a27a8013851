"""DeepSpeed ZeRO-3 on CPU/gloo (``DS_ACCELERATOR=cpu``) printing its own memory truth: the bytes of
DeepSpeed's own tensors, measured on them after every step.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 zero3_memory_train.py --truth truth-{rank}.json

``--truth`` (with ``{rank}``) gets one JSON object per rank with, per step after ``engine.step()``:
``master_bytes`` (DeepSpeed's fp32 partitioned copy of the parameters,
``engine.optimizer.fp32_partitioned_groups_flat``, which its optimizer steps on),
``state_bytes`` (every tensor in the wrapped torch optimizer's ``state``) and ``partition_bytes``
(each parameter's ``ds_tensor``, the partition ZeRO-3 gathers from), ``grad_partition_bytes`` (the
gradient partitions DeepSpeed's stage-3 optimizer keeps: each parameter's partition elements,
``ds_tensor.numel()``, at its gradient accumulation dtype's size); and ``param_numel`` (the model's
parameters).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--truth", required=True)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(args.dim, args.dim) for _ in range(args.layers)])
    numel = sum(p.numel() for p in model.parameters())
    config = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10**9,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=config)
    generator = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(args.steps):
        x = torch.randn(8, args.dim, generator=generator)
        engine.backward(F.mse_loss(engine(x), x))
        engine.step()
        inner = ds_optimizer.optimizer
        steps.append({
            "master_bytes": nbytes(ds_optimizer.fp32_partitioned_groups_flat),
            "state_bytes": nbytes(t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor)),
            "partition_bytes": nbytes(p.ds_tensor for p in engine.module.parameters()),
            "grad_partition_bytes": sum(p.ds_tensor.numel() for p in engine.module.parameters())
            * torch.empty(0, dtype=ds_optimizer.gradient_accumulation_dtype).element_size(),
        })
    with open(args.truth.format(rank=rank), "w", encoding="utf-8") as out:
        json.dump({"rank": rank, "param_numel": numel, "steps": steps}, out)
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads finish releasing the last collective (see examples/train.py)


if __name__ == "__main__":
    main()
