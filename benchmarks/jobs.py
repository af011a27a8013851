"""The work the benchmarks time, each run as its own fresh process (``python jobs.py JOB ...``).

- ``floor FILE...``: read + gunzip + ``orjson.loads`` every file into Python objects, one after the
  other: the cost of merely reading the JSON (no tables, no analysis).
- ``fsdpviz [--cache] [--jobs N] PATH...``: ``load_traces`` + ``compute_overlap`` (the whole-step
  communication/computation overlap per rank), as a script using fsdpviz would.
- ``cli ARG...``: ``fsdpviz ARG...`` (the command itself, in this process), then one line on stderr, ``BENCH {json}``: this process's own peak RSS and CPU time (the parent: what it
  holds of the run) and the largest peak RSS and the CPU time of its worker processes.
- ``hta DIR``: HTA's ``TraceAnalysis(trace_dir=DIR)`` + ``get_comm_comp_overlap`` (run with the
  Python of a venv that has ``holistictraceanalysis`` installed), with the rank -> file map
  given explicitly (see ``_rank_files``).

Each prints one JSON line: events read and the overlap % per rank (to check that fsdpviz and HTA
agree), plus the time spent after imports.
"""

from __future__ import annotations

import json
import sys
import time


def floor(paths: list[str]) -> dict:
    import gzip

    import orjson

    n_events = 0
    for path in paths:
        with open(path, "rb") as fh:
            data = fh.read()
        trace = orjson.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        n_events += len(trace["traceEvents"])
        del trace, data
    return {"events": n_events}


def fsdpviz(paths: list[str], cache: bool, jobs: int | None) -> dict:
    from fsdpviz.trace import load_traces

    started = time.perf_counter()
    # As fsdpviz's commands do: the loader imports pandas while its parser processes work, so the
    # analysis (which needs pandas anyway) is imported after the load.
    traces = load_traces(paths, cache=cache, progress=False, jobs=jobs)
    from fsdpviz.analysis.overlap import compute_overlap

    overlap = compute_overlap(traces)
    return {
        "work_s": time.perf_counter() - started,
        "events": len(traces.events),
        "table_mb": float(traces.events.memory_usage(index=False).sum()) / 1e6,
        "overlap": {int(r): round(float(p), 2) for r, p in zip(overlap["rank"], overlap["overlap_pct"])},
    }


def _rank_files(trace_dir: str) -> dict[int, str]:
    """rank -> file from each trace's ``distributedInfo``. HTA finds ranks with ``"rank":\\s+(\\d+)``,
    which misses compact JSON (``"rank":3``, as orjson writes it): give it the map explicitly."""
    import gzip
    import os
    import re

    found: dict[int, str] = {}
    for name in sorted(os.listdir(trace_dir)):
        if not name.endswith((".json", ".gz")):
            continue
        path = os.path.join(trace_dir, name)
        with (gzip.open(path, "rb") if name.endswith(".gz") else open(path, "rb")) as fh:
            match = re.search(rb'"distributedInfo"\s*:\s*\{[^}]*"rank"\s*:\s*(\d+)', fh.read(1 << 20))
        found[int(match.group(1)) if match else len(found)] = path
    return found


def hta(trace_dir: str) -> dict:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    started = time.perf_counter()
    analyzer = TraceAnalysis(trace_files=_rank_files(trace_dir), trace_dir=trace_dir)
    overlap = analyzer.get_comm_comp_overlap(visualize=False)
    return {
        "work_s": time.perf_counter() - started,
        "overlap": {int(r): round(float(p), 2) for r, p in zip(overlap["rank"], overlap["comp_comm_overlap_pctg"])},
    }


def cli(args: list[str]) -> None:
    import resource

    from fsdpviz.cli import main as fsdpviz_main

    code = 0
    try:
        fsdpviz_main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open("/proc/self/status") as fh:  # VmHWM: this process's peak resident set, kB
        hwm_kb = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    print("BENCH " + json.dumps({
        "parent_rss_mb": hwm_kb / 1024, "parent_cpu_s": me.ru_utime + me.ru_stime,
        "worker_rss_mb": kids.ru_maxrss / 1024, "workers_cpu_s": kids.ru_utime + kids.ru_stime,
    }), file=sys.stderr, flush=True)
    sys.exit(code)


def main(argv: list[str]) -> None:
    job, args = argv[0], argv[1:]
    if job == "cli":
        cli(args)
    if job == "floor":
        result = floor(args)
    elif job == "fsdpviz":
        cache = "--cache" in args
        jobs = None
        if "--jobs" in args:
            i = args.index("--jobs")
            jobs = int(args[i + 1])
            del args[i:i + 2]
        result = fsdpviz([a for a in args if a != "--cache"], cache, jobs)
    elif job == "hta":
        result = hta(args[0])
    else:
        raise SystemExit(f"unknown job {job!r}")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
