"""Model B of the shared GPU recordings (a small GPT, FSDP2 on torch's fake process group of 8): a training
script to record and to run bare, and the in-process truth of its settings' step times.

The model and settings are those of ``../shared/gpu/inproc_truth.py`` and ``../shared/traces/gpu-h200/``
(d 1024, 12 blocks, 8 heads, batch 8 x 2048, bf16 parameters with fp32 reductions, AdamW, vocab 512), so
that a recording made with this script stands beside those recordings and their bare truth.

    python benchmarks/gpu_model_b.py train --wrap block --steps 12      # one JSON line a step
    python benchmarks/gpu_model_b.py truth --rounds 3 --steps 12        # one JSON line a round, then the ratios

``train`` is an unchanged training script as a user's would be: each step it prints its own synchronised
wall time and its own ``torch.cuda.max_memory_allocated()`` (reset at the start of each step), the two
numbers a recording must leave as a bare run has them. ``truth`` builds and times every setting inside one
process, in alternating order round by round, and prints each round's median step of steps >= 3 and the
median over rounds of each setting's ratio to the block wrap: the interleaved truth that separate processes
of a launch-bound step (which drift by up to 35 % on a shared GPU machine) cannot give.
Run on a GPU by ``benchmarks/gpu_model_b_check.sh`` (``../shared/gpu/README.md``); results in
docs/whatif.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

VOCAB = 512
SETTINGS = ("block", "root", "pair", "reshard_false")


class Attn(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.h, self.qkv, self.out = h, nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, d // self.h).unbind(2)
        y = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, h: int) -> None:
        super().__init__()
        self.n1, self.attn, self.n2 = nn.LayerNorm(d), Attn(d, h), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class GPT(nn.Module):
    def __init__(self, d: int, n: int, h: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.norm, self.lm_head = nn.LayerNorm(d), nn.Linear(d, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.norm(x))


def build(a: argparse.Namespace, setting: str, dev: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model sharded as ``setting`` says, and its optimizer (the same seed for every setting)."""
    torch.manual_seed(0)
    m = GPT(a.dim, a.layers, a.heads).to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    kw: dict = {"mp_policy": mp}
    if setting == "reshard_false":
        kw["reshard_after_forward"] = False
    if setting in ("block", "reshard_false"):
        for b in m.blocks:
            fully_shard(b, **kw)
    elif setting == "pair":
        for i in range(0, len(m.blocks), 2):
            fully_shard(list(m.blocks[i:i + 2]), **kw)
    fully_shard(m, mp_policy=mp)
    return m, torch.optim.AdamW(m.parameters(), lr=3e-4)


def steps(a: argparse.Namespace, m: nn.Module, opt: torch.optim.Optimizer, dev: torch.device):
    """Train ``a.steps`` steps; yield each step's wall time (ms, synchronised by ``loss.item()``) and peak."""
    for step in range(a.steps):
        g = torch.Generator().manual_seed(1000 * step)
        idx = torch.randint(0, VOCAB, (a.batch, a.seq), generator=g).to(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        loss = nn.functional.cross_entropy(m(idx).view(-1, VOCAB), idx.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        value = loss.item()
        ms = (time.perf_counter() - t0) * 1e3
        peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else None
        yield step, ms, peak, value


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["train", "truth"])
    for k, v in (("dim", 1024), ("layers", 12), ("heads", 8), ("batch", 8), ("seq", 2048), ("rounds", 3),
                 ("steps", 12)):
        p.add_argument(f"--{k}", type=int, default=v)
    p.add_argument("--wrap", choices=SETTINGS, default="block", help="train: the setting")
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS), help="truth: the settings")
    a = p.parse_args()
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
    if a.mode == "train":
        m, opt = build(a, a.wrap, dev)
        for step, ms, peak, loss in steps(a, m, opt, dev):
            print(json.dumps({"step": step, "ms": round(ms, 3), "peak": peak, "loss": loss}), flush=True)
        return
    rounds = []
    for r in range(a.rounds):
        order = a.settings if r % 2 == 0 else a.settings[::-1]
        ms: dict[str, float] = {}
        for s in order:
            m, opt = build(a, s, dev)
            ms[s] = statistics.median(t for i, t, _, _ in steps(a, m, opt, dev) if i >= 3)
            del m, opt
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        rounds.append({s: round(ms[s], 3) for s in a.settings})
        # a line a round, so that a run stopped early still gives the rounds it finished
        print(json.dumps({"round": r, "ms": rounds[-1]}), flush=True)
    ratios = {s: statistics.median(rd[s] / rd["block"] for rd in rounds) for s in a.settings} \
        if "block" in a.settings else None
    print(json.dumps({"model": vars(a), "device": str(dev), "ratio_median": ratios}))


if __name__ == "__main__":
    main()
