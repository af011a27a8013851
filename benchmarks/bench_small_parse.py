"""Small runs parsed in the calling process against worker processes: docs/performance.md, "Small runs
parsed in the calling process".

A process that already imported pandas (a notebook, a test, ``compare`` loading its second run) has
nothing to overlap with parse workers, so a run of ``SMALL_PARSE_EVENTS`` estimated events or fewer is
parsed where it is asked for (``fsdpviz.trace.workers._job_count``). For each input, in one process,
``load_traces`` (the parse cache off) with the workers (``jobs`` = the CPUs, as before the rule) and
in the process (``jobs=1``), interleaved round by round: wall and CPU time (this process and its
reaped workers), median (min-max); the two loads' tables must be equal (else the run stops).

    python benchmarks/bench_small_parse.py [PATH ...] [--rounds 7]

Without PATH: the bundled samples, two committed recordings and an 8-rank synthetic run (tests/synth)
on either side of the threshold. A one-file input is parsed in the process either way (``_job_count``).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import pandas  # noqa: F401  (imported first, as in the processes the rule is for)
from harness import load_average, spread

from fsdpviz.trace.loader import load_traces
from fsdpviz.trace.sources import estimated_events, resolve_sources
from fsdpviz.trace.workers import SMALL_PARSE_EVENTS

RECORDED = ROOT / "tests" / "recorded"
F = "{:.3f}"  # seconds, to the millisecond
DEFAULTS = [ROOT / "sample_traces" / "fsdp2-cpu-2rank", ROOT / "sample_traces" / "zero3-cpu-2rank",
            RECORDED / "groups" / "run", RECORDED / "fsdp2-d256-block" / "run"]


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _synthetic(folder: Path) -> Path:
    from synth import Scenario, generate_run, make_root, make_units

    sc = Scenario(units=make_units(6, numel=2_000_000), root=make_root(), world_size=8, steps=(3, 4, 5),
                  kernels_per_unit=24, shared_timeline=True)
    return generate_run(sc, folder, run_folder=True).folder


def _timed(path: Path, jobs: int) -> tuple[float, float, object]:
    cpu, wall = _cpu_s(), time.perf_counter()
    traces = load_traces([path], cache=False, progress=False, jobs=jobs)
    return time.perf_counter() - wall, _cpu_s() - cpu, traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cpus = max(2, len(os.sched_getaffinity(0)))  # one file a worker, two at least: workers, not one process
    with tempfile.TemporaryDirectory() as tmp:
        paths = args.paths or [*DEFAULTS, _synthetic(Path(tmp))]
        print(f"threshold {SMALL_PARSE_EVENTS:,} estimated events; workers: {cpus}; load average "
              f"{load_average()}; median (min-max) of {args.rounds} rounds, s\n")
        print("| input | files | estimated events | workers: wall / CPU | in the process: wall / CPU |")
        print("|---|---:|---:|---|---|")
        for path in paths:
            files = resolve_sources([path]).files
            times: dict[int, tuple[list[float], list[float]]] = {cpus: ([], []), 1: ([], [])}
            for _ in range(args.rounds):
                loaded = {}
                for jobs in (cpus, 1):
                    wall, cpu, loaded[jobs] = _timed(path, jobs)
                    times[jobs][0].append(wall)
                    times[jobs][1].append(cpu)
                a, b = loaded[cpus], loaded[1]
                if not (a.events.equals(b.events) and a.ranks.equals(b.ranks)):  # type: ignore[attr-defined]
                    sys.exit(f"{path}: the two loads differ")
            name = ("synthetic, 8 ranks" if path == Path(tmp) else
                    path.parent.name if path.name == "run" else path.name)
            print(f"| {name} | {len(files)} | {estimated_events(files):,} | {spread(times[cpus][0], F)} / "
                  f"{spread(times[cpus][1], F)} | {spread(times[1][0], F)} / {spread(times[1][1], F)} |")


if __name__ == "__main__":
    main()
