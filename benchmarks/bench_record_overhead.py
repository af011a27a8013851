"""What ``fsdpviz record`` costs a training step: the example trainer bare and recorded, interleaved.

    python benchmarks/bench_record_overhead.py [--repeats 3] [--steps 30]     # make bench-record
    python benchmarks/bench_record_overhead.py --micro                        # the unit-timed step's work

Runs ``examples/train.py`` (FSDP2, ``torchrun --nproc_per_node 2``, CPU, gloo) in two shapes, the
default example (4 blocks of width 64) and its many-unit variant (24 blocks of width 32), each bare and
under the default ``fsdpviz record``, round by round: every round runs each (shape, bare / recorded)
once, in turn, so that the machine's drift falls on all of them alike. Each rank measures its own step
times with a wall clock around the optimizer step boundaries (the same in every run, independent of
fsdpviz). Reported per shape: the median and spread (min - max over rounds of each run's median) of
the clean steps (those run.json's ``ranks[].observer.clean_steps`` names; the same step numbers in the
bare runs), the slowest rank per step, and what the recorder's agent measured of its own work in
those steps (run.json). Results: docs/performance.md, "Recording overhead".
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import runpy
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train.py"
# The shapes the benchmark runs: the default example and its many-unit variant (examples/train.py flags).
SHAPES = {"example (4 x 64)": ["--layers", "4", "--dim", "64"], "24 blocks x 32": ["--layers", "24", "--dim", "32"]}


def worker(out: Path, train_args: list[str]) -> None:
    """Inside torchrun: train and write this rank's step times to ``out/rank{R}.json``: wall ms and
    the process's CPU ms per step (CPU time is what recording takes from training; unlike the wall
    clock, other jobs on a shared machine barely change it)."""
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](train_args)
    stamps: list[tuple[float, float]] = [(time.perf_counter(), time.process_time())]
    example["train"](args, after_step=lambda step, loss: stamps.append((time.perf_counter(), time.process_time())))
    # step k (k >= 1): from the end of step k-1 to the end of step k; step 0 (set-up, first forward) is None
    pairs = list(itertools.pairwise(stamps[1:]))
    times = {"wall": [None] + [(b[0] - a[0]) * 1e3 for a, b in pairs],
             "cpu": [None] + [(b[1] - a[1]) * 1e3 for a, b in pairs]}
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(times))


def micro(units: int, steps: int = 2000) -> float:
    """The agent's own CPU time per unit-timed step (µs) for ``units`` units, measured in one process
    without training: the intervals the FSDP2 instrumentation marks per unit (a forward interval with
    two gather calls, a backward interval with three gather calls and one reduction), then the step's
    records summarised and written and the peak RSS read. A clean step does none of the unit work."""
    from fsdpviz.record.agent import Agent
    from fsdpviz.record.options import RecordOptions
    from fsdpviz.record.timers import TimersWriter

    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(RecordOptions(run_dir=Path(tmp)), "rank")
        agent.recording = True
        agent.observer.unit_timing = True
        agent.clock.start(TimersWriter(Path(tmp) / "rank0.jsonl"), rank=0, step=0, memory=True, use_cuda=False)
        names = [f"blocks.{i}" for i in range(units)]
        started = time.process_time()  # CPU time: what the agent takes from training, unlike load-bound wall time
        for step in range(steps):
            for phase, gathers, reduces in (("forward", 2, 0), ("backward", 3, 1)):
                agent.phase = phase
                for name in names:
                    agent.open_unit(name, phase, None)
                    for kind, count in (("all_gather", gathers), ("reduce_scatter", reduces)):
                        for _ in range(count):
                            agent.end_comm(agent.begin_comm(name, kind, None))
                    agent.close_unit(name, phase)
            agent.clock.end_step(step + 1)
        elapsed = time.process_time() - started
        agent.clock.close_writer()
    return elapsed / steps * 1e6


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_config(recorded: bool, train_args: list[str], workdir: Path) -> tuple[list[float | None], dict[str, Any] | None]:
    """One run: the slowest rank's wall ms of every step (by step number; None for step 0), and run.json
    (None when bare)."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), __file__, "--worker", str(out), "--", *train_args]
    if recorded:
        command = [sys.executable, "-m", "fsdpviz", "record", "--out", str(out / "run"), "--no-report", "--no-summary",
                   "--", *command]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=1800)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    slowest = [None if a is None else max(a, b) for a, b in zip(ranks[0]["wall"], ranks[1]["wall"], strict=True)]
    run = json.loads((out / "run" / "run.json").read_text()) if recorded else None
    return slowest, run


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f} - {max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--micro", action="store_true", help="only measure the agent's work in a unit-timed step")
    args, rest = parser.parse_known_args()
    if args.micro:
        for units in (5, 33, 129):
            print(f"agent cost per unit-timed step with {units:3d} units: {micro(units):8.1f} µs")
        return
    if args.worker is not None:
        worker(args.worker, [a for a in rest if a != "--"])
        return
    # per shape and kind: each run's median clean step; per shape: the agent's facts of every recorded rank
    medians: dict[tuple[str, str], list[float]] = {(shape, kind): [] for shape in SHAPES for kind in ("bare", "recorded")}
    agent: dict[str, list[dict[str, Any]]] = {shape: [] for shape in SHAPES}
    clean: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for shape, flags in SHAPES.items():
                train_args = ["--framework", "fsdp2", "--steps", str(args.steps), *flags]
                for kind in ("recorded", "bare"):  # the recorded run first: it names the clean steps
                    steps, run = run_config(kind == "recorded", train_args, Path(tmp))
                    if run is not None:
                        agent[shape].extend(r["observer"] for r in run["ranks"] if r.get("observer"))
                        clean[shape] = run["ranks"][0]["observer"]["clean_steps"]
                    medians[(shape, kind)].append(statistics.median(steps[s] or 0.0 for s in clean[shape]))
                    print(f"round {repeat + 1}/{args.repeats} {shape} {kind}: clean-step median "
                          f"{medians[(shape, kind)][-1]:.1f} ms", file=sys.stderr, flush=True)
    print(f"FSDP2, 2 CPU ranks, {args.steps} steps, {args.repeats} rounds (interleaved), slowest rank per step; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| shape | bare: clean-step ms, median (min - max of runs) | recorded: same | recorded / bare "
          "| agent's own ms per clean step (median, max) | agent's share of the step (median, max) |")
    print("|---|---|---|---|---|---|")
    for shape in SHAPES:
        bare, rec = medians[(shape, "bare")], medians[(shape, "recorded")]
        facts = agent[shape]
        own = (f"{statistics.median(f['agent_ms_median'] for f in facts):.3f}, {max(f['agent_ms_max'] for f in facts):.3f}")
        share = (f"{statistics.median(f['agent_share_median'] for f in facts) * 100:.2f} %, "
                 f"{max(f['agent_share_max'] for f in facts) * 100:.2f} %")
        print(f"| {shape} | {_spread(bare)} | {_spread(rec)} | {statistics.median(rec) / statistics.median(bare):.3f} "
              f"| {own} | {share} |")


if __name__ == "__main__":
    main()
