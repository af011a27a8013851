"""How much idle a device-bound FSDP2 step keeps without the profiler: run on a GPU (docs/whatif.md,
"What is left, and what would settle it").

The bound keeps the trace's other idle (gaps the device waited out after their work was launched), and
the replay holds almost none of it; which of the two a bare run is like, the shared recordings cannot
say. This script measures it. Inside one process, on torch's fake process group of 8, it builds the
small GPT of ``../shared/traces/gpu-h200/README.md`` (model B by default) once per setting, mode and
round, and times steady steps three ways, in rotating order round by round:

- ``bare``: no profiler;
- ``cuda``: ``torch.profiler`` with CUDA activity alone (the device's work traced, the host's ops not);
- ``full``: CPU and CUDA activity with ``record_shapes`` and ``profile_memory``, as ``fsdpviz record``
  profiles.

Each step ends in ``loss.item()`` (the script's own synchronised wall time, as the truth of the shared
recordings). A profiled mode's device busy time is the union of its traced kernels, copies and sets over
its profiled steps, per step. The bare idle is the bare step less the ``cuda`` mode's busy time: an
upper bound on the bare run's other idle, since it also holds the host's launch of each step's first
kernels after the synchronisation. Against it: the ``full`` mode's idle, and the bound's figures for the
recording of the same setting (Broot: other idle 2.06 ms a step of 2.86 ms idle; the replay without the
profiler holds 0.0). Prints one line per round and measurement to stderr and one JSON object (every
round's figures, and each setting's and mode's median over rounds) to stdout.

    python benchmarks/gpu_device_idle.py --settings root block --rounds 9 > device-idle.json   # ~4 min on an H200

On a machine without a GPU it runs on the CPU (``--dim 64 --layers 2 --seq 64`` for a quick pass), with
no device time to read (busy and idle null).
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.profiler import ProfilerActivity
from torch.testing._internal.distributed.fake_pg import FakeStore

MODES = ("bare", "cuda", "full")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
VOCAB = 512


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


def build(args: argparse.Namespace, setting: str, dev: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    """Model B (or the sizes given) under ``setting``: ``root`` (one unit), ``block`` or ``pair``."""
    torch.manual_seed(0)
    model = GPT(args.dim, args.layers, args.heads).to(dev)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if setting == "block":
        for b in model.blocks:
            fully_shard(b, mp_policy=mp)
    elif setting == "pair":
        for i in range(0, len(model.blocks), 2):
            fully_shard(list(model.blocks[i:i + 2]), mp_policy=mp)
    elif setting != "root":
        raise SystemExit(f"gpu_device_idle: unknown setting {setting!r} (root, block or pair)")
    fully_shard(model, mp_policy=mp)
    return model, torch.optim.AdamW(model.parameters(), lr=3e-4)


def device_busy_ms(trace: Path) -> float | None:
    """The union of the trace's device work (kernels, copies, sets), ms; None where it holds none."""
    opener: Callable[..., Any] = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                   for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS)
    if not spans:
        return None
    total, start, end = 0.0, spans[0][0], spans[0][1]
    for a, b in spans[1:]:
        if a > end:
            total, start = total + end - start, a
        end = max(end, b)
    return (total + end - start) / 1e3  # µs to ms


def timed_step(args: argparse.Namespace, model: nn.Module, opt: torch.optim.Optimizer, dev: torch.device,
               i: int) -> float:
    """One training step on batch ``i``, ms of wall time up to its loss on the host (a synchronisation)."""
    g = torch.Generator().manual_seed(1000 * i)
    idx = torch.randint(0, VOCAB, (args.batch, args.seq), generator=g).to(dev)
    t0 = time.perf_counter()
    loss = nn.functional.cross_entropy(model(idx).view(-1, VOCAB), idx.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    loss.item()
    return (time.perf_counter() - t0) * 1e3


def run_mode(args: argparse.Namespace, setting: str, mode: str, dev: torch.device, folder: Path) -> dict[str, Any]:
    """One model under ``setting`` and ``mode``: the median of its timed steps, and in a profiled mode the
    device's busy time per timed step."""
    model, opt = build(args, setting, dev)
    for i in range(args.warmup):
        timed_step(args, model, opt, dev, i)
    times: list[float] = []
    busy: float | None = None
    if mode == "bare":
        times = [timed_step(args, model, opt, dev, args.warmup + i) for i in range(args.steps)]
    else:
        activities = [ProfilerActivity.CUDA] if mode == "cuda" else [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        if dev.type != "cuda":
            activities = [ProfilerActivity.CPU]
        with torch.profiler.profile(activities=activities, record_shapes=mode == "full",
                                    profile_memory=mode == "full") as prof:
            times = [timed_step(args, model, opt, dev, args.warmup + i) for i in range(args.steps)]
        trace = folder / f"{setting}-{mode}.json"
        prof.export_chrome_trace(str(trace))
        total = device_busy_ms(trace)
        busy = None if total is None else total / args.steps
        trace.unlink()
    del model, opt
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"step_ms": statistics.median(times), "busy_ms": busy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("dim", 1024), ("layers", 12), ("heads", 8), ("batch", 8), ("seq", 2048),
                          ("rounds", 9), ("steps", 6), ("warmup", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--settings", nargs="+", default=["root", "block"])
    args = parser.parse_args()
    dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
    rounds: list[dict[str, dict[str, dict[str, Any]]]] = []
    with tempfile.TemporaryDirectory(prefix="fsdpviz-device-idle-") as tmp:
        for r in range(args.rounds):
            # settings and modes in a new order each round: a drift of the host's speed falls on each alike
            settings = args.settings if r % 2 == 0 else args.settings[::-1]
            modes = MODES[r % len(MODES):] + MODES[:r % len(MODES)]
            row: dict[str, dict[str, dict[str, Any]]] = {}
            for setting in settings:
                for mode in modes:
                    got = run_mode(args, setting, mode, dev, Path(tmp))
                    row.setdefault(setting, {})[mode] = got
                    busy = "n/a" if got["busy_ms"] is None else f"{got['busy_ms']:.2f}"
                    print(f"round {r} {setting} {mode}: step {got['step_ms']:.2f} ms, device busy {busy} ms",
                          file=sys.stderr, flush=True)
            rounds.append(row)
    summary: dict[str, dict[str, float | None]] = {}
    for setting in args.settings:
        def median(mode: str, key: str, s: str = setting) -> float | None:
            values = [rd[s][mode][key] for rd in rounds if rd[s][mode][key] is not None]
            return statistics.median(values) if values else None

        # each round's idle against its own busy time (bare: the cuda mode's of the same round), then the
        # median over rounds
        def idle(mode: str, s: str = setting) -> float | None:
            traced = "cuda" if mode == "bare" else mode
            values = [rd[s][mode]["step_ms"] - rd[s][traced]["busy_ms"] for rd in rounds
                      if rd[s][traced]["busy_ms"] is not None]
            return statistics.median(values) if values else None

        summary[setting] = {"bare_step_ms": median("bare", "step_ms"), "cuda_step_ms": median("cuda", "step_ms"),
                            "full_step_ms": median("full", "step_ms"), "cuda_busy_ms": median("cuda", "busy_ms"),
                            "full_busy_ms": median("full", "busy_ms"), "bare_idle_ms": idle("bare"),
                            "cuda_idle_ms": idle("cuda"), "full_idle_ms": idle("full")}
    json.dump({"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "torch": torch.__version__, "args": vars(args), "rounds": rounds, "median": summary}, sys.stdout)
    print()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
