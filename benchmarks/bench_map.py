"""Cost per rank: ``fsdpviz summary --json`` on synthetic FSDP2 GPU runs of 64, 256 and 1024 ranks.

A run of more than ~4M events is analysed rank by rank where each rank is parsed (``fsdpviz.
analysis.rankmap``): the parent holds the ranks' digests, never their events. This measures, per
run size, as a fresh process with ``FSDPVIZ_NO_CACHE=1`` (``--command report``: the report instead,
which reads the 16 ranks it draws again):

- wall time and CPU time (the parent and its workers), and CPU time per million events;
- the parent's own peak RSS (``VmHWM``) -- the target is at most 1 GB at 1024 ranks -- and the
  largest worker's peak RSS (bounded by one rank: the same at every run size).

``--whole`` also runs the smallest point with every event loaded into the parent
(``FSDPVIZ_KEEP_EVENTS=1``, how every run was analysed before) for comparison.

Each run is generated to disk once, before it is measured (``bench_scale.generate``: one rank is
simulated and serialised, then written once per rank with its own rank in the header, so the
generator holds one rank in memory); every rank shares one timeline.

    python benchmarks/bench_map.py [--ranks 64,256,1024] [--events 100000] [--repeat 1] [--whole] [--command report]

Results: docs/scale.md and docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import describe_machine, load_average, median, run_measured, spread, versions

HERE = Path(__file__).resolve().parent
JOBS = HERE / "jobs.py"


def _bench(m_stderr: str) -> dict[str, float]:
    line = [x for x in m_stderr.splitlines() if x.startswith("BENCH ")][-1]
    return json.loads(line[len("BENCH "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="64,256,1024")
    parser.add_argument("--events", type=int, default=100_000, help="events per rank (approximate)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--whole", action="store_true", help="also the smallest run loaded whole")
    parser.add_argument("--command", choices=("summary", "report"), default="summary",
                        help="the command timed: summary --json, or report (the page of the 16 ranks it draws)")
    parser.add_argument("--keep", help="generate the runs in this folder and keep them (default: a temporary one)")
    args = parser.parse_args()

    print(f"# machine: {describe_machine()}")
    print(f"# {versions('msgspec', 'numpy', 'pandas', 'pyarrow')}; `fsdpviz {args.command}`, no cache, fresh "
          f"process, median (min-max) of {args.repeat}; events per rank ~{args.events:,}")
    print("| ranks | events | mode | wall s | CPU s | CPU s per 1M events | parent peak RSS MB "
          "| largest worker peak RSS MB | load avg |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---|", flush=True)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fsdpviz-map-"))
    points = [int(r) for r in args.ranks.split(",")]
    try:
        for ranks in points:
            folder = base / f"run-{ranks}"
            marker = folder / "events.txt"
            if not marker.is_file():
                started = time.perf_counter()
                made = subprocess.run([sys.executable, str(HERE / "bench_scale.py"), "--generate", str(folder),
                                       str(ranks), str(args.events)], check=True, capture_output=True, text=True)
                marker.write_text(made.stdout.strip().splitlines()[-1])
                print(f"# {ranks} ranks written in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
            per_rank = int(marker.read_text())
            total = ranks * per_rank
            modes = [("per rank", "0")] + ([("whole", "1")] if args.whole and ranks == points[0] else [])
            for mode, keep in modes:
                env = dict(os.environ, FSDPVIZ_NO_CACHE="1", FSDPVIZ_KEEP_EVENTS=keep)
                runs, marks, loads = [], [], load_average()
                for _ in range(args.repeat):
                    what = ["summary", "--json"] if args.command == "summary" else \
                        ["report", "-o", str(folder / "report.html")]
                    m = run_measured([sys.executable, str(JOBS), "cli", *what, str(folder)], env=env)
                    if m.returncode != 0:
                        raise SystemExit(f"{ranks} ranks ({mode}) failed:\n{m.stderr[-3000:]}")
                    runs.append(m)
                    marks.append(_bench(m.stderr))
                cpu = [m.cpu_s for m in runs]
                print(f"| {ranks} | {total:,} | {mode} | {spread([m.wall_s for m in runs])} | {spread(cpu)} "
                      f"| {median(cpu) / (total / 1e6):.2f} | {median([b['parent_rss_mb'] for b in marks]):.0f} "
                      f"| {median([b['worker_rss_mb'] for b in marks]):.0f} | {loads} .. {load_average()} |",
                      flush=True)
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
