"""An ``accelerate launch`` training loop, written the way accelerate's examples write it.

    accelerate launch --num_processes 2 --use_fsdp --fsdp_version 2 \
        --fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP --fsdp_transformer_layer_cls_to_wrap Block \
        tests/clients/accelerate_loop.py --log-losses out-{rank}.txt

A small model of two blocks, fixed random data, ``Accelerator.prepare`` and ``accelerator.backward``.
``--no-cpu`` creates ``Accelerator()`` instead of ``Accelerator(cpu=True)``: on a machine without GPUs,
``accelerate launch --multi_gpu --num_processes 2`` then starts two processes that never connect
(accelerate decides there is nothing to distribute), each training alone.

On CPU accelerate runs the processes as ``MULTI_CPU`` and wraps the model in
``DistributedDataParallel``, whatever ``--use_fsdp`` asked. ``--force-fsdp`` makes it take the FSDP
path anyway, as ``hf_trainer.py --force-fsdp`` does: the shared state says a multi-GPU job before the
``Accelerator`` is made, so the FSDP plugin that ``accelerate launch``'s FSDP flags describe is applied
(``Accelerator()``: with ``cpu=True`` accelerate would keep ``MULTI_CPU``); the model stays on the CPU.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, SEQ = 64, 8


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, dim: int = 32, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def force_fsdp() -> None:
    """Make accelerate apply its FSDP plugin on CPU ranks (see the module docstring)."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    PartialState().distributed_type = DistributedType.MULTI_GPU


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--log-losses", default="")
    parser.add_argument("--cpu", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--force-fsdp", action="store_true")
    args = parser.parse_args()
    if args.force_fsdp:
        force_fsdp()
    accelerator = Accelerator(cpu=True) if args.cpu and not args.force_fsdp else Accelerator()
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(3)
    data = torch.randint(VOCAB, (8 * args.steps, SEQ + 1), generator=generator)
    loader = DataLoader(TensorDataset(data), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (batch,) in enumerate(loader):
        if step == args.steps:
            break
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        accelerator.print(f"step {step} loss {losses[-1]:.6f}")
    if args.log_losses:
        rank = int(os.environ.get("RANK", accelerator.process_index))  # unconnected processes are all index 0
        with open(args.log_losses.format(rank=rank), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(losses))
    accelerator.end_training()
    # As torch asks, and before the DDP model goes: destroying a DDP reducer whose gloo group still
    # runs can deadlock on the GIL (PyTorch: ~ProcessGroupGloo joins a worker thread that waits for
    # the GIL to free a finished work item; seen in ~1 of 5 runs here).
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
