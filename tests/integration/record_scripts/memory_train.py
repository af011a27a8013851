"""FSDP2 on CPU/gloo with a choice of optimizers and ``zero_grad`` styles, printing its own memory
truth: what each rank's tensors hold, measured on them.

    torchrun --nproc_per_node 2 memory_train.py --optimizer sgd-momentum --truth truth-{rank}.json

``--optimizer``: ``adamw``; ``sgd-momentum`` (one state per parameter, made at the first step);
``adam-amsgrad`` (three states: exp_avg, exp_avg_sq, max_exp_avg_sq); ``own+sgd``: two optimizers,
this script's own class (:class:`Keeper`: two states the size of the parameter and one scalar) on
the first layer and SGD with momentum on the rest.
``--zero-grad``: ``optimizer`` (``optimizer.zero_grad()``), ``model`` (``model.zero_grad()``, as the
transformers Trainer does: no Optimizer range in the trace), ``keep``
(``optimizer.zero_grad(set_to_none=False)``: the gradients stay allocated from step to step).
``--micro-batches N``: gradient accumulation, N forwards and backwards per optimizer step (FSDP2
reduce-scatters after each and adds the result to the sharded gradients).

``--truth`` (with ``{rank}``) gets one JSON object per rank: per step, measured after its optimizer
step -- ``optimizer_state_bytes`` (every tensor in every ``optimizer.state``, ``DTensor.to_local()``),
``sharded_param_bytes`` (``p.to_local()`` of every parameter) -- and ``grad_bytes`` (the sharded
gradients, ``p.grad.to_local()``) measured just before it; ``micro_grad_bytes``: the same after each
micro-batch's backward.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

DIM = 32


class Keeper(torch.optim.Optimizer):
    """A made-up optimizer: a running mean and a running absolute maximum of the gradient per
    parameter, and a step count (a scalar tensor)."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["mean"] = torch.zeros_like(p)
                    state["peak"] = torch.zeros_like(p)
                    state["count"] = torch.zeros((), dtype=torch.float32)
                state["count"] += 1
                state["mean"].mul_(0.9).add_(p.grad, alpha=0.1)
                torch.maximum(state["peak"], p.grad.abs(), out=state["peak"])
                p.add_(state["mean"], alpha=-group["lr"])


def local_bytes(tensor: torch.Tensor) -> int:
    t = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return t.numel() * t.element_size()


def optimizers_for(model: nn.Sequential, kind: str) -> list[torch.optim.Optimizer]:
    if kind == "adamw":
        return [torch.optim.AdamW(model.parameters(), lr=1e-3)]
    if kind == "sgd-momentum":
        return [torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)]
    if kind == "adam-amsgrad":
        return [torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)]
    first = list(model[0].parameters())
    rest = [p for p in model.parameters() if all(p is not q for q in first)]
    return [Keeper(first), torch.optim.SGD(rest, lr=1e-2, momentum=0.9)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--optimizer", choices=["adamw", "sgd-momentum", "adam-amsgrad", "own+sgd"], default="adamw")
    parser.add_argument("--zero-grad", choices=["optimizer", "model", "keep"], default="optimizer")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--micro-batches", type=int, default=1)
    parser.add_argument("--truth", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(DIM, DIM) for _ in range(args.layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizers = optimizers_for(model, args.optimizer)
    generator = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(args.steps):
        if args.zero_grad == "model":
            model.zero_grad()
        elif args.zero_grad == "keep":
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=False)
        else:
            for optimizer in optimizers:
                optimizer.zero_grad()
        micro_grads = []
        for _ in range(args.micro_batches):
            loss = model(torch.randn(8, DIM, generator=generator)).square().mean()
            (loss / args.micro_batches).backward()
            micro_grads.append(sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None))
        grads = micro_grads[-1]
        for optimizer in optimizers:
            optimizer.step()
        steps.append({
            "optimizer_state_bytes": sum(local_bytes(t) for o in optimizers for s in o.state.values()
                                         for t in s.values() if isinstance(t, torch.Tensor)),
            "sharded_param_bytes": sum(local_bytes(p) for p in model.parameters()),
            "grad_bytes": grads,
            "micro_grad_bytes": micro_grads,
        })
    with open(args.truth.format(rank=rank), "w", encoding="utf-8") as out:
        json.dump({"rank": rank, "steps": steps}, out)
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads finish releasing the last collective (see examples/train.py)


if __name__ == "__main__":
    main()
