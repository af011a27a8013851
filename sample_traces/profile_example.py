"""Run ``examples/train.py`` under a plain ``torch.profiler`` (no fsdpviz) and write one trace per rank.

This is how most people profile today: a ``torch.profiler.profile`` around the loop, stepped once
per iteration. It gives ``sample_traces/`` a recording made without ``fsdpviz record``.

    torchrun --nproc_per_node 2 sample_traces/profile_example.py OUT_DIR [train.py flags...]

Writes ``OUT_DIR/rank{R}.trace.json.gz``. Schedule: skip 1 step, warm up 1, record 2.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train.py"


def main() -> int:
    out_dir = Path(sys.argv[1])
    example = runpy.run_path(str(EXAMPLE))  # the example's functions, without running its main
    args = example["parse_args"](sys.argv[2:])

    def write_trace(prof: profile) -> None:
        rank = torch.distributed.get_rank()
        prof.export_chrome_trace(str(out_dir / f"rank{rank}.trace.json.gz"))

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    out_dir.mkdir(parents=True, exist_ok=True)
    with profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=write_trace,
        record_shapes=True,
        profile_memory=True,
    ) as prof:
        example["train"](args, after_step=lambda step, loss: prof.step())
    return 0


if __name__ == "__main__":
    sys.exit(main())
