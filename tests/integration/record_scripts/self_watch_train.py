"""FSDP2 on CPU/gloo that reads, every step, what a training script can read about its own process.

    torchrun --nproc_per_node 2 self_watch_train.py --steps 9 --spike-step 6 --out watch-{rank}.jsonl

Each step it writes one JSON line: its own peak resident memory (Linux ``VmHWM``, the counter
``fsdpviz record`` used to reset each step), a hash of torch's RNG state, grad mode, the deterministic
and cuDNN / TF32 flags, the thread count, its environment (every variable's name, and the values of those
torchrun does not draw anew each run: fsdpviz's ``FSDPVIZ_*`` or Arrow's among them) and whether ``sys.path`` holds fsdpviz's bootstrap. At step ``--spike-step`` it allocates
and touches a 256 MiB buffer and frees it: from then on a peak counter that nobody resets stays above
the spike. Run bare and under ``fsdpviz record``, the two must print the same view (tests/integration/
test_record.py), except the RSS values, which the profiler's own buffers raise. ``--idle-ms`` makes
the compute thread idle in every step, by construction (test_record.py's CPU idle wording).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

SPIKE_BYTES = 256 << 20


def peak_rss() -> int:
    """This process's peak resident memory in bytes (``VmHWM``)."""
    text = Path("/proc/self/status").read_text()
    match = re.search(r"VmHWM:\s+(\d+) kB", text)
    assert match is not None
    return int(match.group(1)) * 1024


def view() -> dict[str, object]:
    """What the script can read about its own process, besides its peak memory."""
    return {
        "rng": hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16],
        "grad": torch.is_grad_enabled(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cudnn": [torch.backends.cudnn.enabled, torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32],
        "tf32": torch.backends.cuda.matmul.allow_tf32,
        "threads": torch.get_num_threads(),
        # every variable's name, and the values of those the launcher does not draw anew for each run
        "env": sorted(k for k in os.environ),
        "env_values": {k: v for k, v in sorted(os.environ.items())
                       if not k.startswith(("TORCHELASTIC_", "MASTER_PORT", "FSDPVIZ_TEST_JOB"))},
        "pythonpath": os.environ.get("PYTHONPATH"),
        "bootstrap_on_path": any(p.rstrip("/").endswith("record/bootstrap") for p in sys.path),
    }


def end_view() -> dict[str, object]:
    """After the last step: the names of gloo's worker threads, and whether torch.distributed's group
    functions are torch's own (a wrapper made with functools.wraps carries ``__wrapped__``)."""
    try:
        names = sorted(Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task"))
    except OSError:
        names = []
    from torch.distributed import distributed_c10d as c10d

    return {"gloo_threads": [n for n in names if n.startswith(("pt_gloo", "gloo"))],
            "wrapped": sorted(name for name, fn in (*vars(c10d.ProcessGroup).items(),
                                                    ("_new_process_group_helper", c10d._new_process_group_helper))
                              if hasattr(fn, "__wrapped__"))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--spike-step", type=int, default=6)
    parser.add_argument("--out", required=True)
    parser.add_argument("--idle-ms", type=float, default=0.0,
                        help="sleep this long in each step, between backward and the optimizer step: time the "
                             "compute thread runs no op (other idle, by construction)")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64)) for _ in range(3)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    lines = []
    for step in range(args.steps):
        x = torch.randn(16, 64)
        loss = model(x).square().mean()
        loss.backward()
        if args.idle_ms:
            time.sleep(args.idle_ms / 1e3)
        optimizer.step()
        optimizer.zero_grad()
        if step == args.spike_step:
            spike = torch.ones(SPIKE_BYTES // 4)  # touched: resident
            del spike
        lines.append(json.dumps({"step": step, "peak_rss": peak_rss(), **view()}))
    lines.append(json.dumps({"end": end_view()}))
    Path(args.out.format(rank=rank)).write_text("\n".join(lines) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
