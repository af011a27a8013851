"""A DeepSpeed ZeRO-3 loop configured the way its users configure it: a JSON file on the command line.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/clients/deepspeed_json.py \
        --deepspeed_config ds_config.json --log-losses out-{rank}.txt

``--deepspeed_config`` is DeepSpeed's own argument (``deepspeed.add_config_arguments``), and the file
goes to ``deepspeed.initialize`` as it is (DeepSpeed reads it, comments included). A small model of
four blocks, fixed random data, ``engine.backward`` and ``engine.step``. Without a file, the config
below: ZeRO-3, every parameter partitioned (DeepSpeed keeps parameters under 1e5 elements whole by
default: all of this model's), DeepSpeed's defaults otherwise.
"""

from __future__ import annotations

import argparse
import os

import deepspeed
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, DIM, LAYERS = 64, 8, 32, 4
DEFAULT_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "steps_per_print": 10**9,
}


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(DIM) for _ in range(LAYERS))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--log-losses", default="")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Model()
    engine, _, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                           config=None if args.deepspeed_config else DEFAULT_CONFIG)
    rank = int(os.environ.get("RANK", "0"))
    generator = torch.Generator().manual_seed(11 + rank)
    losses = []
    for _ in range(args.steps):
        batch = torch.randint(VOCAB, (4, SEQ + 1), generator=generator)
        logits = engine(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if args.log_losses:
        with open(args.log_losses.format(rank=rank), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(losses))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
