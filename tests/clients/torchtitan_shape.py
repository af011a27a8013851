"""A torchtitan-shaped FSDP2 model, sharded the way torchtitan's ``apply_fsdp`` shards it.

The root owns parameters of its own (the token embedding), every block is a unit, the final norm
and the output projection form one unit of two modules (``fully_shard([model.norm, model.output])``)
and the last block keeps its parameters gathered after forward (``reshard_after_forward=False``:
backward needs them first). ``--compile BACKEND``: every block is compiled first, as torchtitan's
``apply_compile`` does (``torch.compile`` of the block, registered in its place), and then sharded.
Plain PyTorch, no profiling code:

    torchrun --nproc_per_node 2 tests/clients/torchtitan_shape.py --steps 6 --log-losses out-{rank}.txt
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard

VOCAB, SEQ, BATCH = 128, 16, 4


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, 4 * dim, bias=False)
        self.w2 = nn.Linear(4 * dim, dim, bias=False)
        self.w3 = nn.Linear(dim, 4 * dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attention_norm = nn.RMSNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.wqkv(self.attention_norm(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.wo(out)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(dim, heads) for i in range(layers)})
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h)
        return self.output(self.norm(h))


def apply_compile(model: Transformer, backend: str) -> None:
    """torchtitan's per-block compile: each block's forward one graph, the FSDP hooks outside it."""
    for layer_id, block in model.layers.named_children():
        model.layers.register_module(layer_id, torch.compile(block, backend=backend, fullgraph=True))


def apply_fsdp(model: Transformer) -> None:
    """torchtitan's wrapping: blocks, then [norm, output] as one unit, then the root."""
    last = len(model.layers) - 1
    for i, block in enumerate(model.layers.values()):
        fully_shard(block, reshard_after_forward=int(i) < last)
    fully_shard([model.norm, model.output], reshard_after_forward=False)
    fully_shard(model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--log-losses", default="")
    parser.add_argument("--compile", default="", metavar="BACKEND", help="compile each block (e.g. inductor)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Transformer(args.dim, args.layers, heads=4)
    if args.compile:
        apply_compile(model, args.compile)
    apply_fsdp(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(100 + rank)
    losses = []
    for step in range(args.steps):
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=generator)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
    if args.log_losses:
        with open(args.log_losses.format(rank=rank), "w") as out:
            out.writelines(f"{i} {v.hex()}\n" for i, v in enumerate(losses))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
