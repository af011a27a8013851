"""Report build speed and page size: the bundled example and a synthetic 64-rank x 80-unit run.

The report must stay usable for big jobs: a 64-rank, 80-unit FSDP2 run has to build in at most
15 s into a page of at most 20 MB (issue: the HTML report). This benchmark measures, per input:

- ``load``: ``load_traces`` (not part of the target: the loader has its own benchmark);
- ``analysis``: ``analyse_traces`` and its ``summary`` (whole-step overlap, per-unit analysis), as
  ``build_report`` asks for them;
- ``page``: plot data + holoviews/bokeh rendering + writing the file (``build_report`` given the
  analysed ``RunResult``): what the report layer itself costs;
- ``build``: ``build_report`` of a freshly analysed ``RunResult``, analysis included (the target);
- the page's size and the Gantt rectangles on it.

Times are wall clock (``_s``) and this process's CPU time (``_cpu_s``): on a shared machine the CPU
time is what the work costs, the wall time what a user waited. The analysis and the page run in
one process and are single-threaded.

The synthetic run comes from ``tests/synth`` (``generate_large_run``: every rank shares one
FSDP2 timeline, as in a job without stragglers) with ``--events`` events per rank; the number of
unit spans per step (what the Gantt draws) does not depend on it, only the loading and analysis
time do. Each build runs ``--repeat`` times in this process; the minimum is reported.

    python benchmarks/bench_report.py [--ranks 64] [--units 80] [--events 20000] [--repeat 2]

Results and the machine they were measured on are recorded in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the synthetic trace generator is a test helper

EXAMPLE = ROOT / "sample_traces" / "fsdp2-cpu-2rank"


def _timed(fn, repeat: int):
    """Best wall time and best CPU time of this process (less sensitive to other jobs) over runs."""
    best, best_cpu, result = float("inf"), float("inf"), None
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        result = fn()
        best = min(best, time.perf_counter() - started)
        best_cpu = min(best_cpu, time.process_time() - started_cpu)
    return (best, best_cpu), result


def measure(paths: list[Path], out_dir: Path, repeat: int) -> dict:
    """Load, analyse and build the report of ``paths``; times in seconds, size in MB."""
    from fsdpviz.analysis.pipeline import analyse_traces
    from fsdpviz.report.build import build_report
    from fsdpviz.trace import load_traces

    load_s, traces = _timed(lambda: load_traces(paths, cache=False, progress=False), 1)

    def analyse():
        run = analyse_traces(traces)
        run.summary  # noqa: B018 - computes the per-unit analysis and the summary
        return run

    analysis_s, run = _timed(analyse, repeat)
    analysis = run.analysis
    page_s, result = _timed(lambda: build_report(run, out_dir / "page.html"), repeat)
    build_s, result = _timed(lambda: build_report(analyse_traces(traces), out_dir / "report.html"), repeat)
    return {
        "ranks": len(traces.rank_ids), "units": len(analysis.unit_stats),
        "events": len(traces.events), "spans_per_step": int(
            (analysis.spans["step"] == analysis.spans["step"].min()).sum()) if len(analysis.spans) else 0,
        "load_s": round(load_s[0], 2), "analysis_s": round(analysis_s[0], 2),
        "analysis_cpu_s": round(analysis_s[1], 2), "page_s": round(page_s[0], 2),
        "page_cpu_s": round(page_s[1], 2), "build_s": round(build_s[0], 2), "build_cpu_s": round(build_s[1], 2),
        "html_mb": round(result.size_bytes / 1e6, 2),
        "gantt_rectangles": result.segments,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--units", type=int, default=80)
    parser.add_argument("--events", type=int, default=20_000, help="trace events per rank")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--skip-example", action="store_true")
    args = parser.parse_args()

    import os

    from synth import generate_large_run

    print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        if not args.skip_example and EXAMPLE.is_dir():
            (tmp_dir / "example").mkdir()
            result = measure([EXAMPLE], tmp_dir / "example", args.repeat)
            print(json.dumps({"input": "example (sample_traces/fsdp2-cpu-2rank)", **result}))
        started = time.perf_counter()
        run = generate_large_run(tmp_dir / "synth", world_size=args.ranks, n_units=args.units,
                                 events_per_rank=args.events, steps=(1, 2, 3))
        print(f"# generated {args.ranks} traces of {run.n_events:,} events in {time.perf_counter() - started:.1f} s")
        (tmp_dir / "out").mkdir()
        result = measure(run.paths, tmp_dir / "out", args.repeat)
        print(json.dumps({"input": f"synthetic {args.ranks} ranks x {args.units} units", **result}))


if __name__ == "__main__":
    main()
