"""What ``fsdpviz record`` costs a training step: the example trainer with and without recording.

    python benchmarks/bench_record_overhead.py [--repeats 3] [--steps 60] [--framework fsdp2]

Runs ``examples/train.py`` under ``torchrun --nproc_per_node 2`` (CPU, gloo) plain, under
``fsdpviz record --mode timers`` (timers on every step, no profiler) and under the default
``--mode both``, interleaved ``--repeats`` times. Each rank measures its own step times with a
wall clock around the optimizer step boundaries (the same for all configurations, independent of
fsdpviz), and the process's CPU time per step. Reported per configuration: the median step time
over the steps past the profiled window (wall and CPU), and over every step (profiled steps and
the trace writing included), with the difference against the plain runs. Results:
docs/performance.md.
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

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train.py"
SKIP_STEPS = 8  # first steps (allocation) and the profiled window (steps 2-4) + trace writing


def worker(out: Path, train_args: list[str]) -> None:
    """Inside torchrun: train and write this rank's step times to ``out/rank{R}.json``: wall ms and
    the process's CPU ms per step (CPU time is what recording takes from training; unlike the wall
    clock, other jobs on a shared machine barely change it)."""
    example = runpy.run_path(str(EXAMPLE))
    args = example["parse_args"](train_args)
    stamps: list[tuple[float, float]] = [(time.perf_counter(), time.process_time())]
    example["train"](args, after_step=lambda step, loss: stamps.append((time.perf_counter(), time.process_time())))
    pairs = list(itertools.pairwise(stamps[1:]))  # step k: end of k-1 -> end of k
    times = {"wall": [(b[0] - a[0]) * 1e3 for a, b in pairs], "cpu": [(b[1] - a[1]) * 1e3 for a, b in pairs]}
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps(times))


def micro(units: int, steps: int = 2000) -> float:
    """The agent's own CPU time per step (µs) for ``units`` units, measured in one process without training.

    Per unit and step the FSDP2 instrumentation makes: a forward interval with two gather calls
    (unshard, wait_for_unshard), a backward interval with three gather calls and one reduction;
    then the step's records are summarised and written, and the peak RSS read and reset.
    """
    from fsdpviz.record.agent import Agent
    from fsdpviz.record.options import RecordOptions
    from fsdpviz.record.timers import TimersWriter

    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(RecordOptions(run_dir=Path(tmp)), "rank")
        agent.recording = True
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


def run_config(mode: str | None, train_args: list[str], workdir: Path) -> dict[str, list[float]]:
    """Step times of one run: ``wall`` / ``cpu`` past the profiled window, ``wall_all`` from step 1 on
    (the profiled steps and the trace writing included). A step ends when its slowest rank ends it."""
    out = Path(tempfile.mkdtemp(dir=workdir))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(_free_port()), __file__, "--worker", str(out), "--", *train_args]
    if mode is not None:
        command = [sys.executable, "-m", "fsdpviz", "record", "--out", str(out / "run"), "--mode", mode,
                   "--no-report", "--", *command]
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=1800)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    slowest = {key: [max(a, b) for a, b in zip(ranks[0][key], ranks[1][key])] for key in ("wall", "cpu")}
    return {"wall": slowest["wall"][SKIP_STEPS:], "cpu": slowest["cpu"][SKIP_STEPS:], "wall_all": slowest["wall"][1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--framework", default="fsdp2", choices=["fsdp2", "fsdp1", "zero3"])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--micro", action="store_true", help="only measure the agent's own cost per step")
    args, rest = parser.parse_known_args()
    if args.micro:
        for units in (5, 33, 129):
            print(f"agent cost per step with {units:3d} units: {micro(units):8.1f} µs")
        return
    if args.worker is not None:
        worker(args.worker, [a for a in rest if a != "--"])
        return
    train_args = ["--framework", args.framework, "--steps", str(args.steps), "--layers", str(args.layers),
                  "--dim", str(args.dim)]
    configs = {"plain": None, "timers": "timers", "both": "both"}
    samples: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": [], "wall_all": []} for name in configs}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name, mode in configs.items():
                for key, values in run_config(mode, train_args, Path(tmp)).items():
                    samples[name][key].extend(values)
                print(f"repeat {repeat + 1}/{args.repeats} {name}: median "
                      f"{statistics.median(samples[name]['wall']):.2f} ms", file=sys.stderr, flush=True)
    print(f"{args.framework}, {args.layers} layers, dim {args.dim}, {args.steps} steps, {args.repeats} runs per "
          f"configuration (interleaved), median step time of the slowest rank; load average {os.getloadavg()[0]:.1f}")
    print("| configuration | wall ms, steps past the profiled window | CPU ms, same steps "
          "| wall ms, every step (profiled ones included) |")
    print("|---|---|---|---|")
    plain = {key: statistics.median(values) for key, values in samples["plain"].items()}
    for name, keyed in samples.items():
        cells = []
        for key in ("wall", "cpu", "wall_all"):
            med = statistics.median(keyed[key])
            cells.append(f"{med:.1f}" + ("" if name == "plain" else f" ({(med / plain[key] - 1) * 100:+.1f} %)"))
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
