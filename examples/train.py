"""A small GPT-like model trained with FSDP2, FSDP1 or DeepSpeed ZeRO-3: the example fsdpviz records.

Plain PyTorch with no profiling code, so it shows what ``fsdpviz record`` does to an unchanged
script. The model is an embedding, ``--layers`` transformer blocks in ``model.blocks`` and a final
norm + head; the data are fixed random tokens, so every run with the same flags computes the same
losses bit for bit (on the same machine and world size).

    torchrun --nproc_per_node 2 examples/train.py --framework fsdp2 --wrap block
    fsdpviz record --out runs/block -- torchrun --nproc_per_node 2 examples/train.py --wrap block

Wrap policies (which modules are FSDP units):
  block      every ``blocks.N`` is a unit; the root unit holds the embeddings, norm and head
  pair       two consecutive blocks form one unit: ``model.blocks`` becomes a ``ModuleDict`` of
             ``BlockPair`` containers named ``"0+1"``, ``"2+3"``, ... (unit ``blocks.0+1``)
  pair-list  FSDP2 only: two consecutive blocks form one unit through ``fully_shard([blocks[0],
             blocks[1]])``; the model keeps its structure (unit ``[blocks.0, blocks.1]``)
  root       one unit for the whole model
  submodule  ZeRO-3 only: DeepSpeed's own default, every submodule with parameters is fetched
             on its own (``block``/``pair``/``root`` mark those modules as ZeRO-3 leaf modules)

``--prefetch N``: FSDP2 sets explicit forward/backward prefetch N units ahead (0 = FSDP2's implicit
default). FSDP1 prefetches at most one unit ahead: N >= 1 turns on ``forward_prefetch``, N >= 2 also
lifts the all-gather rate limiter (``limit_all_gathers=False``); backward prefetch is always
``BACKWARD_PRE`` (FSDP1's default). ZeRO-3: ``stage3_prefetch_bucket_size`` = N units' parameters
(0 = DeepSpeed's default).

``--shard-code FILE``: shard with the code ``fsdpviz whatif RUN ... --code`` wrote for this architecture
(its ``shard_model(model)`` for FSDP2 / FSDP1, ``zero_config(config)`` for ZeRO-3) instead of ``--wrap``,
``--prefetch`` and ``--reshard-after-forward``.

``--grad-accum N``: gradient accumulation, N micro-batches (forward + backward each) per optimizer
step; a step's gradients are the mean over its micro-batches. FSDP2 / FSDP1 reduce-scatter the
gradients after every micro-batch's backward (their default) and accumulate the sharded gradients;
ZeRO-3 gets DeepSpeed's ``gradient_accumulation_steps`` = N (``engine.backward`` scales the loss,
``engine.step`` steps the optimizer on every N-th call). The logged loss of a step is the mean over
its micro-batches. ``--checkpoint``: activation checkpointing of every child of ``model.blocks`` (a
block, or a pair under ``--wrap pair``) with ``torch.utils.checkpoint`` (non-reentrant): its forward
runs again inside the backward.

``--fake-world N``: one process is rank 0 of a world of N under torch's fake process group
(``torch.testing._internal.distributed.fake_pg``): FSDP shards over N for real and runs every copy-in,
copy-out and reduction buffer, while the collectives move nothing and take no time. Memory is then
exactly what a rank of N holds, on one CPU core or one GPU. ``--bf16``: FSDP's mixed precision as on a
GPU, bf16 parameters for compute and fp32 gradient reductions (FSDP2 ``MixedPrecisionPolicy``, FSDP1
``MixedPrecision``).

Runs on CPU with gloo (ZeRO-3 needs ``DS_ACCELERATOR=cpu``) and on GPUs with NCCL.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

VOCAB_SIZE = 256
SEQ_LEN = 32
BATCH_SIZE = 4
HEADS = 4
LEARNING_RATE = 3e-3

StepCallback = Callable[[int, float], None]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.fc_in = nn.Linear(dim, 4 * dim)
        self.fc_out = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(dim, dim=-1)
        q, k, v = (t.view(batch, seq, HEADS, dim // HEADS).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc_out(F.gelu(self.fc_in(self.mlp_norm(x))))


class BlockPair(nn.Sequential):
    """Two consecutive blocks that form one FSDP unit under ``--wrap pair``."""


class GPT(nn.Module):
    def __init__(self, layers: int, dim: int, checkpoint: bool = False) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.tok_emb = nn.Embedding(VOCAB_SIZE, dim)
        self.pos_emb = nn.Embedding(SEQ_LEN, dim)
        self.blocks: nn.Module = nn.ModuleList(Block(dim) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, VOCAB_SIZE, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks.children():
            if self.checkpoint and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.norm(x))

    def group_blocks_in_pairs(self) -> None:
        """Regroup ``blocks`` into ``BlockPair`` containers named ``"0+1"``, ``"2+3"``, ...

        The parameters are the same objects, so the model computes exactly what it did before.
        """
        blocks = list(self.blocks.children())
        pairs = nn.ModuleDict()
        for first in range(0, len(blocks), 2):
            group = blocks[first : first + 2]
            name = "+".join(str(first + i) for i in range(len(group)))
            pairs[name] = BlockPair(*group)
        self.blocks = pairs


@dataclass(frozen=True)
class Distributed:
    rank: int
    world_size: int
    device: torch.device


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=["fsdp2", "fsdp1", "zero3"], default="fsdp2")
    parser.add_argument("--wrap", choices=["block", "pair", "pair-list", "root", "submodule"], default="block",
                        help="which modules are units (submodule: ZeRO-3's own default)")
    parser.add_argument("--prefetch", type=int, default=0, metavar="N",
                        help="prefetch N units ahead (0 = the framework's default)")
    parser.add_argument("--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
                        help="free gathered parameters after each unit's forward (default: yes)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps")
    parser.add_argument("--grad-accum", type=int, default=1, metavar="N",
                        help="micro-batches (forward + backward) per optimizer step (default: 1)")
    parser.add_argument("--checkpoint", action="store_true",
                        help="activation checkpointing per block (recomputed in backward)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=BATCH_SIZE, help="sequences per micro-batch and rank")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fake-world", type=int, default=0, metavar="N",
                        help="one process as rank 0 of N under torch's fake process group (no communication)")
    parser.add_argument("--bf16", action="store_true",
                        help="mixed precision: bf16 parameters for compute, fp32 gradient reductions")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help=argparse.SUPPRESS)  # passed by the deepspeed launcher; LOCAL_RANK says the same
    parser.add_argument("--shard-code", metavar="FILE",
                        help="shard with the code fsdpviz whatif --code wrote: its shard_model(model) (FSDP2, FSDP1) "
                             "or zero_config(config) (ZeRO-3) replaces --wrap, --prefetch and --reshard-after-forward")
    parser.add_argument("--log-losses", metavar="FILE",
                        help="write each step's loss per rank (FILE may contain {rank}; else .rank{R} is appended)")
    args = parser.parse_args(argv)
    if args.wrap == "submodule" and args.framework != "zero3":
        parser.error("--wrap submodule is ZeRO-3's default fetching and needs --framework zero3")
    if args.wrap == "pair-list" and args.framework != "fsdp2":
        parser.error("--wrap pair-list shards lists of modules with fully_shard and needs --framework fsdp2")
    if args.prefetch < 0 or args.steps < 1 or args.layers < 1 or args.batch < 1 or args.dim % HEADS:
        parser.error(f"--prefetch >= 0, --steps >= 1, --layers >= 1, --batch >= 1 and --dim divisible by {HEADS}")
    if args.grad_accum < 1:
        parser.error("--grad-accum must be at least 1")
    if args.fake_world < 0 or (args.fake_world and args.framework == "zero3"):
        parser.error("--fake-world N needs N >= 1 and FSDP2 or FSDP1")
    if args.bf16 and args.framework == "zero3":
        parser.error("--bf16 is FSDP2's or FSDP1's mixed precision")
    return args


def init_distributed(device_choice: str, fake_world: int = 0) -> Distributed:
    use_cuda = device_choice == "cuda" or (device_choice == "auto" and torch.cuda.is_available())
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if fake_world:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", rank=0, world_size=fake_world, store=FakeStore())
        return Distributed(0, fake_world, device)
    if "RANK" not in os.environ:  # plain `python train.py`: a world of one
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("nccl" if use_cuda else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size(), device)


def build_model(args: argparse.Namespace) -> GPT:
    torch.manual_seed(args.seed)  # the same initial weights on every rank and for every wrap policy
    model = GPT(args.layers, args.dim, checkpoint=args.checkpoint)
    if args.wrap == "pair":
        model.group_blocks_in_pairs()
    return model


def unit_modules(model: GPT, wrap: str) -> list[nn.Module | list[nn.Module]]:
    """The non-root units in forward order (a list of modules: one ``fully_shard`` call on them)."""
    if wrap == "root":
        return []
    blocks = list(model.blocks.children())
    if wrap == "pair-list":
        return [blocks[first : first + 2] for first in range(0, len(blocks), 2)]
    return blocks


def shard_code(path: str) -> dict:
    """The functions of a file ``fsdpviz whatif --code`` wrote (``shard_model``, ``zero_config``)."""
    namespace: dict = {}
    exec(compile(Path(path).read_text(), path, "exec"), namespace)  # noqa: S102 - the user's own sharding code
    return namespace


def shard_fsdp2(model: GPT, args: argparse.Namespace, ddp: Distributed) -> nn.Module:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        from torch.distributed._composable.fsdp import fully_shard

    model.to(ddp.device)
    units = unit_modules(model, args.wrap)
    extra = {}
    if args.bf16:
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy
        except ImportError:  # torch < 2.6
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy
        extra["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if args.shard_code:
        return shard_code(args.shard_code)["shard_model"](model, **extra)
    for module in units:
        fully_shard(module, reshard_after_forward=args.reshard_after_forward, **extra)
    # The root keeps its parameters gathered after forward (the head is used first in backward).
    fully_shard(model, reshard_after_forward=False, **extra)
    if args.prefetch > 0 and units:
        # a module list shares one FSDP state: its first module stands for it
        units = [u[0] if isinstance(u, list) else u for u in units]
        forward_order = [model, *units]
        backward_order = [model, *reversed(units)]
        for i, module in enumerate(forward_order):
            module.set_modules_to_forward_prefetch(forward_order[i + 1 : i + 1 + args.prefetch])
        for i, module in enumerate(backward_order):
            module.set_modules_to_backward_prefetch(backward_order[i + 1 : i + 1 + args.prefetch])
    return model


def shard_fsdp1(model: GPT, args: argparse.Namespace, ddp: Distributed) -> nn.Module:
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    mixed = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if args.bf16 else None
    if args.shard_code:
        return shard_code(args.shard_code)["shard_model"](model, device_id=ddp.device, mixed_precision=mixed)
    wrap_classes = {"block": {Block}, "pair": {BlockPair}, "root": set()}[args.wrap]
    return FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy(wrap_classes) if wrap_classes else None,
        sharding_strategy=(ShardingStrategy.FULL_SHARD if args.reshard_after_forward
                           else ShardingStrategy.SHARD_GRAD_OP),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        forward_prefetch=args.prefetch >= 1,
        limit_all_gathers=args.prefetch < 2,
        device_id=ddp.device,  # FSDP1 needs it explicitly to run on CPU
        mixed_precision=mixed,
    )


def deepspeed_config(model: GPT, args: argparse.Namespace) -> dict:
    """A ZeRO-3 config for this model: every parameter partitioned, prefetch from ``--prefetch``."""
    total_numel = sum(p.numel() for p in model.parameters())
    zero: dict = {
        "stage": 3,
        # DeepSpeed keeps parameters under 1e5 elements unpartitioned by default: all of this model's.
        "stage3_param_persistence_threshold": 0,
        "overlap_comm": True,
    }
    if args.prefetch > 0:
        unit_numel = max((sum(p.numel() for p in m.parameters()) for m in (model.blocks.children() if args.wrap != "root" else ())),
                         default=total_numel)
        zero["stage3_prefetch_bucket_size"] = args.prefetch * unit_numel
    if not args.reshard_after_forward:
        # Keep a gathered parameter until backward if it is reused within the whole model's size.
        zero["stage3_max_reuse_distance"] = 2 * total_numel
        zero["stage3_max_live_parameters"] = 2 * total_numel
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": args.grad_accum,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def shard_zero3(model: GPT, args: argparse.Namespace, ddp: Distributed) -> tuple[nn.Module, object]:
    import deepspeed
    from deepspeed.utils import set_z3_leaf_modules

    leaf_classes = {"block": [Block], "pair": [BlockPair], "root": [GPT], "submodule": []}[args.wrap]
    if leaf_classes:
        set_z3_leaf_modules(model, leaf_classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    config = deepspeed_config(model, args)
    if args.shard_code:
        config = shard_code(args.shard_code)["zero_config"](config)
    engine, ds_optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine, ds_optimizer


def make_batches(args: argparse.Namespace, ddp: Distributed) -> list[torch.Tensor]:
    """Fixed token batches (one per micro-batch), different per rank, the same in every run.

    Each sequence starts at a random token and follows ``next = (5 * token + 3) % VOCAB_SIZE``, a rule
    the model can learn, so the loss visibly falls.
    """
    generator = torch.Generator().manual_seed(args.seed * 1000 + ddp.rank)
    batches = []
    for _ in range(args.steps * args.grad_accum):
        tokens = torch.empty(args.batch, SEQ_LEN + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(VOCAB_SIZE, (args.batch,), generator=generator)
        for t in range(1, SEQ_LEN + 1):
            tokens[:, t] = (5 * tokens[:, t - 1] + 3) % VOCAB_SIZE
        batches.append(tokens)
    return batches


def loss_path(template: str, rank: int) -> str:
    return template.format(rank=rank) if "{rank}" in template else f"{template}.rank{rank}"


def train(args: argparse.Namespace, after_step: StepCallback | None = None) -> list[float]:
    """Train for ``args.steps`` steps and return this rank's losses.

    ``after_step(step, loss)`` runs after each optimizer step (tests use it to inject faults).
    """
    ddp = init_distributed(args.device, args.fake_world)
    model = build_model(args)
    batches = make_batches(args, ddp)
    engine = None
    if args.framework == "zero3":
        engine, optimizer = shard_zero3(model, args, ddp)
        sharded = engine
    else:
        sharded = shard_fsdp2(model, args, ddp) if args.framework == "fsdp2" else shard_fsdp1(model, args, ddp)
        optimizer = torch.optim.AdamW(sharded.parameters(), lr=LEARNING_RATE)

    losses: list[float] = []
    n_micro = args.grad_accum
    for step in range(args.steps):
        micro_losses = []
        for batch in batches[step * n_micro : (step + 1) * n_micro]:
            batch = batch.to(ddp.device)
            logits = sharded(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), batch[:, 1:].reshape(-1))
            if engine is not None:
                engine.backward(loss)  # scales by 1 / gradient_accumulation_steps itself
                engine.step()  # steps the optimizer at the accumulation boundary only
            else:
                (loss / n_micro if n_micro > 1 else loss).backward()
            micro_losses.append(loss.item())
        if engine is None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        losses.append(micro_losses[0] if n_micro == 1 else sum(micro_losses) / n_micro)
        if ddp.rank == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)
        if after_step is not None:
            after_step(step, losses[-1])

    if args.log_losses:
        with open(loss_path(args.log_losses, ddp.rank), "w") as out:
            out.writelines(f"{step} {loss.hex()}\n" for step, loss in enumerate(losses))
    if not math.isfinite(losses[-1]):
        raise RuntimeError(f"loss diverged: {losses[-1]}")
    dist.destroy_process_group()
    # gloo's worker threads may still be releasing the last collective, which takes the GIL; an
    # interpreter that finalizes meanwhile aborts the rank ("terminate called without an active
    # exception"; how often: docs/testing.md).
    time.sleep(0.1)
    return losses


def main(argv: Sequence[str] | None = None) -> int:
    train(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
