"""The step time fsdpviz leads with, against the step time of the same job run without fsdpviz.

Reads real recordings made with ``fsdpviz record`` on a GPU (by default the H100 recordings beside
the checkout, ``../shared/traces/gpu-fsdp``) and prints one markdown table: per recording the step
as traced (the mean of the analysed, profiled steps: what the headline said before it read the
timers), the step the headline says now (``summary --json`` ``step_time_ms``), the profiler's
slowdown, both against the step time of the same command run uninstrumented, and how well the
what-if model replays the recording (``whatif --json`` ``traced_replay_error_pct``).

The uninstrumented truth was measured on the machine that made the recordings (median wall time of
steps 3-9 printed by the training script itself, synchronised each step; it varies +-10 % between
runs there) and is given here per recording; ``--truth NAME=MS`` adds or replaces one.

    python benchmarks/bench_headline_truth.py [--folder DIR] [--truth NAME=MS ...]

Results: docs/performance.md, "The profiler's cost on a GPU".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FOLDER = ROOT.parent / "shared" / "traces" / "gpu-fsdp"
# Uninstrumented runs of the recorded commands, H100, torch 2.11 (ms per step; the recordings' README).
TRUTH_MS = {
    "h100-fsdp2-fake8-block": 53.2,
    "h100-fsdp2-fake8-reshard-false": 50.9,
    "h100-fsdp1-fake8-block": 45.9,
    "h100-fsdp2-ws1-block": 56.5,
    "h100-fsdp1-ws1-block": 59.9,
}


def _pct(value: float, truth: float) -> str:
    return f"{100 * (value - truth) / truth:+.1f} %"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="folder of run folders")
    parser.add_argument("--truth", action="append", default=[], metavar="NAME=MS",
                        help="uninstrumented step time of a recording (ms)")
    args = parser.parse_args()
    truth = dict(TRUTH_MS)
    for item in args.truth:
        name, _, ms = item.partition("=")
        truth[name] = float(ms)
    if not args.folder.is_dir():
        print(f"no recordings at {args.folder}", file=sys.stderr)
        return 2
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.model import read_model, recorded_settings
    from fsdpviz.whatif.predict import predict

    print("| recording | traced step (before) | headline now | profiler slowdown | uninstrumented | "
          "before vs truth | now vs truth | what-if replay error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for run in sorted(p for p in args.folder.iterdir() if (p / "run.json").is_file()):
        result = analyse([run], cache=False)
        summary = result.summary
        replay = predict(read_model(result), recorded_settings()).traced_replay_error_pct
        traced, now = summary.traced_step_time_ms, summary.step_time_ms
        cost = summary.profiler
        real = truth.get(run.name)
        print(f"| {run.name} | {traced:.1f} ms | {now:.1f} ms ({summary.step_time_source}) | "
              f"{f'{cost.slowdown:.2f}x' if cost else '-'} | {f'{real:.1f} ms' if real else '-'} | "
              f"{_pct(traced, real) if real and traced else '-'} | {_pct(now, real) if real and now else '-'} | "
              f"{replay:.2f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
