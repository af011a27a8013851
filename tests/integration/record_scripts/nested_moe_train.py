"""A small FSDP2 model with units inside units, trained on CPU ranks (gloo) for a few steps.

Six blocks of attention and a dense mixture of experts; the last two blocks' ``moe.experts`` are
``fully_shard``-ed before their block, so each is a unit of its own inside its block's unit
(``blocks.4.moe.experts`` in ``blocks.4``), and the block's unit holds only the parameters outside
it -- the nesting MoE models get when experts are sharded apart from the rest of their layer.

``--shard-code FILE``: shard with the ``shard_model(model)`` that ``fsdpviz whatif --code`` wrote for
this architecture instead. ``--framework fsdp1``: the same units with FSDP1 (``--fsdp1-backward-prefetch``
picks its ``backward_prefetch``). ``--forward-prefetch N`` / ``--backward-prefetch N``: explicit prefetch of
the next N units (``set_modules_to_*_prefetch``) in FSDP2's forward order (pre-order: a block before
its experts) and backward order (the reverse of the post-forward order: a block before its experts
too, as a block's pre-backward runs when its output's gradient arrives). ``--micro-batches N``:
gradient accumulation as training stacks run it, N forwards and backwards per optimizer step with
the gradients reduced in the last one only (FSDP2's ``set_requires_gradient_sync(False)`` before the
others, FSDP1's ``no_sync()`` around them). ``--keep-unsharded-between-micro-batches`` (FSDP2): the units
also keep their parameters unsharded from one micro-batch's backward into the next one's forward
(``set_reshard_after_backward(False)`` beside the sync setting, as FSDP2 documents for gradient
accumulation), so that forward gathers nothing.

Run: ``python -m torch.distributed.run --standalone --nproc_per_node 2 nested_moe_train.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard

VOCAB, SEQ, BATCH, EXPERTS = 128, 16, 4, 4
NESTED = (4, 5)  # the blocks whose experts are units of their own


class Experts(nn.Module):
    """Every expert on every token, weighted by the router (dense: no token dropping, so the same
    computation on every rank and in every run)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(EXPERTS, dim, 2 * dim) * dim ** -0.5)
        self.w_out = nn.Parameter(torch.randn(EXPERTS, 2 * dim, dim) * (2 * dim) ** -0.5)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        hidden = F.gelu(torch.einsum("btd,edh->bteh", x, self.w_in))
        return torch.einsum("bteh,ehd,bte->btd", hidden, self.w_out, weights)


class MoE(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.router = nn.Linear(dim, EXPERTS)
        self.experts = Experts(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.router(x).softmax(-1))


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 4, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.moe = MoE(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.moe(self.norm2(x))


class Model(nn.Module):
    def __init__(self, layers: int, dim: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def shard(model: Model, args: argparse.Namespace) -> None:
    """The recorded sharding: experts of the nested blocks first (FSDP2 shards children before
    parents), then every block, then the root; explicit prefetch where asked."""
    forward: list[nn.Module] = []
    for i, block in enumerate(model.blocks):
        if i in NESTED:
            fully_shard(block.moe.experts, reshard_after_forward=args.reshard_after_forward)
        fully_shard(block, reshard_after_forward=args.reshard_after_forward)
        forward += [block, block.moe.experts] if i in NESTED else [block]
    fully_shard(model, reshard_after_forward=False)
    # backward: the reverse of the post-forward order (experts end before their block's forward does)
    post_forward: list[nn.Module] = []
    for i, block in enumerate(model.blocks):
        post_forward += [block.moe.experts, block] if i in NESTED else [block]
    orders = ((args.forward_prefetch, [model, *forward], "set_modules_to_forward_prefetch"),
              (args.backward_prefetch, [model, *reversed(post_forward)], "set_modules_to_backward_prefetch"))
    for depth, order, method in orders:
        if depth:
            for i, unit in enumerate(order):
                getattr(unit, method)(order[i + 1:i + 1 + depth])


def shard_fsdp1(model: Model, args: argparse.Namespace) -> nn.Module:
    """FSDP1 with the same units: the blocks, the nested blocks' experts inside them, the root;
    ``--fsdp1-backward-prefetch`` and ``--forward-prefetch`` (any N > 0: FSDP1's one unit ahead)."""
    from torch.distributed.fsdp import BackwardPrefetch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import CustomPolicy

    units = {*model.blocks, *(model.blocks[i].moe.experts for i in NESTED)}
    backward = None if args.fsdp1_backward_prefetch == "none" else BackwardPrefetch[args.fsdp1_backward_prefetch]
    return FSDP(model, auto_wrap_policy=CustomPolicy(lambda module: module in units), backward_prefetch=backward,
                forward_prefetch=args.forward_prefetch > 0, device_id=torch.device("cpu"))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--forward-prefetch", type=int, default=0, metavar="N")
    parser.add_argument("--backward-prefetch", type=int, default=0, metavar="N")
    parser.add_argument("--framework", choices=["fsdp2", "fsdp1"], default="fsdp2")
    parser.add_argument("--fsdp1-backward-prefetch", choices=["BACKWARD_PRE", "BACKWARD_POST", "none"],
                        default="BACKWARD_PRE")
    parser.add_argument("--micro-batches", type=int, default=1, metavar="N",
                        help="forwards and backwards per optimizer step, the gradients reduced in the last only")
    parser.add_argument("--keep-unsharded-between-micro-batches", action="store_true",
                        help="FSDP2: no resharding after the backward of all micro-batches but the last")
    parser.add_argument("--shard-code", metavar="FILE")
    parser.add_argument("--log-losses", metavar="FILE", help="each step's loss, as float.hex, to FILE.rank{R} (or FILE with {rank} in it)")
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model = Model(args.layers, args.dim)
    if args.shard_code:
        namespace: dict = {}
        exec(compile(Path(args.shard_code).read_text(), args.shard_code, "exec"), namespace)  # noqa: S102
        # FSDP1 needs the device explicitly to run on CPU (examples/train.py passes it the same way)
        extra = {"device_id": torch.device("cpu")} if args.framework == "fsdp1" else {}
        model = namespace["shard_model"](model, **extra)
    elif args.framework == "fsdp1":
        model = shard_fsdp1(model, args)
    else:
        shard(model, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1000 + rank)
    losses = []
    n_micro = args.micro_batches
    for _ in range(args.steps):
        for micro in range(n_micro):
            last = micro == n_micro - 1
            tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=generator)
            sync: contextlib.AbstractContextManager = contextlib.nullcontext()
            if n_micro > 1 and args.framework == "fsdp1":  # no_sync() around the micro-batches that do not reduce
                sync = sync if last else model.no_sync()
            elif n_micro > 1:  # FSDP2: the root's setting reaches every unit under it
                model.set_requires_gradient_sync(last)
                if args.keep_unsharded_between_micro_batches:
                    model.set_reshard_after_backward(last)
            with sync:
                logits = model(tokens[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
                (loss / n_micro).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    if args.log_losses:
        # a ``{rank}`` template as examples/train.py takes it, else FILE.rank{R}
        path = args.log_losses.format(rank=rank) if "{rank}" in args.log_losses else f"{args.log_losses}.rank{rank}"
        Path(path).write_text("".join(f"{x.hex()}\n" for x in losses))
    dist.destroy_process_group()
    time.sleep(0.1)  # gloo's threads may still hold the GIL (examples/train.py)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
