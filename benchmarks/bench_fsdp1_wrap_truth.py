"""whatif's FSDP1 wraps on CPU, against bare runs of each wrap in one process per rank.

Records the example trainer under FSDP1 per block (2 gloo ranks; the recorder's clean steps give the
run's step), predicts pairs (``--wrap merge:2``) and one root unit (``--wrap root``) from it, each as a
share of the recorded step, and measures the three wraps bare: each rank builds the model once per
wrap and round, in an order that alternates from round to round, and times its steady steps
(``inproc_cpu_truth.py --framework fsdp1``); the median over rounds of each round's ratio to its
per-block step is the truth (separate processes on a shared 2-core machine drift by 20-30 %). A wrap's
step in a round is its steps' median, as fsdpviz's step; the results in docs/whatif.md were measured
when it was the mean step (``inproc_cpu_truth.py`` keeps both).

    python benchmarks/bench_fsdp1_wrap_truth.py [--dim 128] [--layers 6] [--rounds 5] [--steps 8] [--out DIR]

Prints per wrap the predicted ratio beside the bare one and the bare ratios' range over rounds.
Results are recorded in docs/whatif.md ("FSDP1 wraps on CPU").
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from inproc_cpu_truth import measure

ROOT = Path(__file__).resolve().parents[1]
FSDPVIZ = [sys.executable, "-m", "fsdpviz"]
WRAPS = {"pair": "merge:2", "root": "root"}


def record(out: Path, dim: int, layers: int) -> Path:
    """The per-block recording (kept in ``out`` and read again when there)."""
    run = out / "run"
    if (run / "run.json").exists():
        return run
    command = [*FSDPVIZ, "record", "--out", str(run), "--no-report", "--no-summary", "--",
               sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "examples" / "train.py"), "--framework", "fsdp1", "--wrap", "block",
               "--dim", str(dim), "--layers", str(layers), "--steps", "14", "--seed", "0"]
    proc = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"recording failed:\n{proc.stderr[-3000:]}")
    return run


def predicted(run: Path) -> dict[str, tuple[float, bool]]:
    """Per wrap: whatif's predicted ratio to the recorded step and whether it calls it reliable."""
    out = {}
    for name, wrap in WRAPS.items():
        answer = json.loads(subprocess.run([*FSDPVIZ, "whatif", str(run), "--wrap", wrap, "--json", "--no-cache"],
                                           capture_output=True, text=True, check=True).stdout)
        out[name] = (answer["predicted"]["step_time_ms"] / answer["baseline"]["step_time_ms"], answer["reliable"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None, help="keep the recording here (default: a temp folder)")
    args = parser.parse_args()
    if min(args.dim, args.layers, args.rounds, args.steps) < 1 or args.layers % 2:
        parser.error("--dim, --rounds and --steps must be at least 1, --layers an even number (pairs)")
    out = args.out or Path(tempfile.mkdtemp(prefix="fsdpviz-fsdp1-wraps-"))
    out.mkdir(parents=True, exist_ok=True)
    run = record(out, args.dim, args.layers)
    predictions = predicted(run)
    truth = measure(args.dim, args.layers, args.rounds, args.steps, framework="fsdp1")
    print(f"recording: {run}")
    print("| wrap | predicted ratio | reliable | bare ratio (median over rounds) | bare, range over rounds | "
          "predicted - bare |")
    print("|---|---:|---|---:|---|---:|")
    for name, (ratio, reliable) in predictions.items():
        rounds = truth["per_round"][name]
        bare = statistics.median(rounds)
        print(f"| {WRAPS[name]} | {ratio:.3f} | {reliable} | {bare:.3f} | {min(rounds):.3f}-{max(rounds):.3f} | "
              f"{ratio - bare:+.3f} |")


if __name__ == "__main__":
    main()
