"""How long the simulator takes for one GPU step: every analysed step of a recording replayed as recorded
(the steady state: each runs twice), timed in rounds; what each whatif prediction and each --explore row
pays per step. Prints the spans a simulated step holds and ms per simulated step (least and median of
the rounds).

    python benchmarks/bench_simulate_gpu.py [RUN] [--rounds 9]     # RUN: ../shared/traces/gpu-h200/B

Results are recorded in docs/performance.md ("The simulator on a GPU step").
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay import program as prog
from fsdpviz.replay.model import read_model, recorded_settings
from fsdpviz.replay.simulate import run

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, default=ROOT.parent / "shared" / "traces" / "gpu-h200" / "B")
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = read_model(analyse([args.run], cache=False, progress=False))
    rec = model.recording
    programs = [prog.build(rec, s, recorded_settings(), model.comm, model.gathers) for s in rec.steps]
    spans = statistics.median(len(run(p, True).spans) for p in programs)
    per_step = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for p in programs:
            run(p, True)
        per_step.append((time.perf_counter() - t0) / len(programs) * 1e3)
    print(f"{args.run.name}: {len(programs)} steps, {spans:.0f} spans a simulated step, "
          f"{min(per_step):.2f} ms a simulated step (median {statistics.median(per_step):.2f}, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
