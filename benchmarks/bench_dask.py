"""The cluster path against the local one: the same run summarised with local parser processes and
on a Dask ``LocalCluster`` (2 worker processes, 1 thread each) on this machine.

Generates a synthetic FSDP2 GPU run (``--ranks`` ranks, 8 units, 3 steps; tests/synth) once, then
times ``fsdpviz summary --json --no-cache`` as fresh processes, interleaved, ``--repeat`` times:
locally, and with ``--scheduler`` pointing at the cluster (started once, as a user would keep one
running). Both analyse each rank where it is parsed (``FSDPVIZ_KEEP_EVENTS=0``); a third variant
loads the run whole into one process (``FSDPVIZ_KEEP_EVENTS=1``). Checks that all print the same JSON and
reports the medians and the cluster's overhead.

    python benchmarks/bench_dask.py [--ranks 64] [--repeat 3]

Results are recorded in docs/scale.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

from harness import describe_machine, run_measured
from synth import Scenario, generate_run, make_root, make_units


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from distributed import LocalCluster

    with tempfile.TemporaryDirectory() as tmp:
        sc = Scenario(units=make_units(8, numel=4_000_000), root=make_root(), world_size=args.ranks,
                      steps=(3, 4, 5), kernels_per_unit=24, shared_timeline=True)
        run = generate_run(sc, Path(tmp) / "run", run_folder=True)
        events = f"{run.n_events:,} per rank"
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
            base = [sys.executable, "-m", "fsdpviz", "summary", "--json", "--no-cache", str(run.folder)]
            import os

            whole = dict(os.environ, FSDPVIZ_KEEP_EVENTS="1")
            by_rank = dict(os.environ, FSDPVIZ_KEEP_EVENTS="0")
            variants = {"local processes": (base, by_rank),
                        "Dask LocalCluster": ([*base, "--scheduler", cluster.scheduler_address], by_rank),
                        "local processes, loaded whole": (base, whole)}
            walls: dict[str, list[float]] = {k: [] for k in variants}
            cpus: dict[str, list[float]] = {k: [] for k in variants}
            outputs: dict[str, str] = {}
            for _ in range(args.repeat):
                for name, (argv, env) in variants.items():
                    m = run_measured(argv, env=env)
                    if m.returncode != 0:
                        raise SystemExit(f"{name} failed:\n{m.stderr[-2000:]}")
                    walls[name].append(m.wall_s)
                    cpus[name].append(m.cpu_s)
                    outputs[name] = m.stdout
        same = len(set(outputs.values())) == 1
        print(describe_machine())
        print(f"\n{args.ranks} ranks, {events} events; summary --json identical: {same}\n")
        print("| engine | wall (s), median (range) | CPU of the fsdpviz process tree (s) |")
        print("|---|---:|---:|")
        for name in variants:
            w = walls[name]
            print(f"| {name} | {statistics.median(w):.2f} ({min(w):.2f}-{max(w):.2f}) | "
                  f"{statistics.median(cpus[name]):.2f} |")
        overhead = statistics.median(walls["Dask LocalCluster"]) - statistics.median(walls["local processes"])
        print(f"\ncluster path overhead: {overhead:+.2f} s wall (the workers' CPU time is not in the tree)")
        if not same:
            raise SystemExit("the two engines printed different JSON")


if __name__ == "__main__":
    main()
