"""Scaling: time and peak memory of a cold load + whole-step overlap against ranks and events.

For each ``RANKSxEVENTS`` point of ``--grid`` a synthetic FSDP2 run is written to a temporary folder
(``tests/synth``: every rank shares one simulated timeline, so files differ only in their header),
then ``jobs.py fsdpviz`` runs on it as a fresh process with ``FSDPVIZ_NO_CACHE=1``, ``--repeat``
times. Reported per point: wall and CPU time (median and range; CPU = the process and its
parser workers), CPU time per million events in the files (flat when the cost is linear; start-up
and imports, ~0.6 s, weigh on the smallest points), the peak RSS of the largest process (the parent, which holds the run's tables, or
a parser worker), the summed RSS of the process tree, and the size of the events table.

Up to ~1.2M events per rank the trace comes straight from the generator. Larger ranks (``1e7``)
repeat a 1.2M-event rank trace back to back: each copy shifted in time by the trace's span and its
``ProfilerStep#N`` renumbered (correlation ids repeat, which costs the loader nothing more). The
generator holds one rank's events in memory, so the larger traces are built copy by copy.

    python benchmarks/bench_scale.py [--grid 1x1e5,1x1e6,1x1e7,8x1e5,8x1e6,64x1e5] [--repeat 2]

Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import describe_machine, load_average, median, run_measured, spread, versions

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "jobs.py"
DEFAULT_GRID = "1x1e5,1x1e6,1x1e7,8x1e5,8x1e6,64x1e5"
GENERATOR_MAX_EVENTS = 1_300_000  # larger ranks are built from copies of one generated trace
_TS_RE = re.compile(rb'"ts":(\d+(?:\.\d+)?)')
_STEP_RE = re.compile(rb"ProfilerStep#(\d+)")


def generate(out: Path, ranks: int, events: int) -> int:
    """Write the run (in this process: call it in a child); return events per rank written."""
    sys.path.insert(0, str(ROOT / "tests"))
    from synth import generate_large_run

    if events <= GENERATOR_MAX_EVENTS:
        return generate_large_run(out, world_size=ranks, n_units=80, events_per_rank=events).n_events
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        one = generate_large_run(tmp, world_size=1, n_units=80, events_per_rank=1_000_000)
        copies = max(1, round(events / one.n_events))
        out.mkdir(parents=True, exist_ok=True)
        first = out / "rank0.trace.json.gz"
        _repeat_trace(one.paths[0], first, copies)
        for r in range(1, ranks):  # other ranks: same body, their own rank in the header
            data = gzip.decompress(first.read_bytes()).replace(b'"rank":0,', f'"rank":{r},'.encode(), 1)
            (out / f"rank{r}.trace.json.gz").write_bytes(gzip.compress(data, compresslevel=1))
        return one.n_events * copies


def _repeat_trace(src: Path, dst: Path, copies: int) -> None:
    """``dst``: the events of ``src`` ``copies`` times, each copy later by the trace's span."""
    import orjson

    doc = orjson.loads(gzip.decompress(src.read_bytes()))
    events = doc.pop("traceEvents")
    timed = [e for e in events if "dur" in e]
    span_us = max(e["ts"] + e["dur"] for e in timed) - min(e["ts"] for e in timed)
    steps = [int(e["name"].split("#")[1]) for e in timed if e["name"].startswith("ProfilerStep#")]
    del timed
    body = orjson.dumps(events)[1:-1]
    del events
    head = orjson.dumps(doc)[:-1] + b',"traceEvents":['
    with gzip.open(dst, "wb", compresslevel=1) as fh:
        fh.write(head)
        for k in range(copies):
            shift = k * (span_us + 1000.0)
            step_shift = k * (max(steps) + 1)
            copy = body
            if k:
                copy = _TS_RE.sub(lambda m, s=shift: b'"ts":%.3f' % (float(m.group(1)) + s), copy)
                copy = _STEP_RE.sub(lambda m, s=step_shift: b"ProfilerStep#%d" % (int(m.group(1)) + s), copy)
            fh.write(copy)
            fh.write(b"," if k < copies - 1 else b"]}")


def _parse_point(text: str) -> tuple[int, int]:
    ranks, events = text.lower().split("x")
    return int(ranks), int(float(events))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", default=DEFAULT_GRID, help=f"RANKSxEVENTS points (default {DEFAULT_GRID})")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)  # OUT RANKS EVENTS, in a child
    args = parser.parse_args()
    if args.generate:
        out, ranks, events = args.generate
        print(generate(Path(out), int(ranks), int(events)))
        return

    print(f"# machine: {describe_machine()}")
    print(f"# {versions('msgspec', 'isal', 'numpy', 'pandas', 'pyarrow')}; cold load + compute_overlap, "
          f"fresh process, median (min-max) of {args.repeat}")
    print("| ranks x events/rank | events in files | events tabled | wall s | CPU s | CPU s per 1M events "
          "| largest process RSS MB | tree RSS MB | events table MB | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    env = dict(os.environ, FSDPVIZ_NO_CACHE="1")
    for point in args.grid.split(","):
        ranks, events = _parse_point(point)
        with tempfile.TemporaryDirectory(prefix="fsdpviz-scale-") as tmp:
            folder = Path(tmp) / "run"
            started = time.perf_counter()
            made = subprocess.run([sys.executable, __file__, "--generate", str(folder), str(ranks), str(events)],
                                  check=True, capture_output=True, text=True)
            per_rank = int(made.stdout.strip().splitlines()[-1])
            print(f"# {point}: {ranks} x {per_rank:,} events written in {time.perf_counter() - started:.0f} s",
                  file=sys.stderr, flush=True)
            runs, info, loads = [], {}, load_average()
            for _ in range(args.repeat):
                m = run_measured([sys.executable, str(JOBS), "fsdpviz", str(folder)], env=env)
                if m.returncode != 0:
                    raise SystemExit(f"{point} failed:\n{m.stderr[-3000:]}")
                info = json.loads(m.stdout.strip().splitlines()[-1])
                runs.append(m)
            wall, cpu = [m.wall_s for m in runs], [m.cpu_s for m in runs]
            total = ranks * per_rank
            print(f"| {ranks} x {per_rank:,} | {total:,} | {info['events']:,} | {spread(wall)} | {spread(cpu)} "
                  f"| {median(cpu) / (total / 1e6):.2f} | {median([m.max_rss_mb for m in runs]):.0f} "
                  f"| {median([m.tree_rss_mb for m in runs]):.0f} | {info.get('table_mb', float('nan')):.0f} "
                  f"| {loads} .. {load_average()} |", flush=True)


if __name__ == "__main__":
    main()
