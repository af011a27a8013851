"""Trace loading speed: fsdpviz's loader against a bare ``gunzip + orjson.loads`` of the same file.

Each measurement runs in a fresh Python process (as a user's command does), ``--repeat`` times; the
minimum is reported (the least disturbed run on a shared machine). Three numbers per trace:

- ``orjson``: read + gunzip + ``orjson.loads`` into dicts (a lower bound for "just reading the JSON");
- ``parse``: ``load_traces(..., cache=False)`` -> typed tables;
- ``cached``: ``load_traces`` again with the Parquet cache warm (the second ``summary``/``report``).

Times are given with and without the process start-up and imports (``total`` vs ``work``).

    python benchmarks/bench_load.py [TRACE ...] [--repeat 3]

Without arguments it measures the real GPU traces beside the checkout (../shared/traces/gpu-real).
Results are recorded in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "gpu-real"

ORJSON = """
import time; t0 = time.perf_counter()
import gzip, orjson, json
data = open({path!r}, 'rb').read()
orjson.loads(gzip.decompress(data) if data[:2] == b'\\x1f\\x8b' else data)
print(json.dumps({{"work": time.perf_counter() - t0}}))
"""

FSDPVIZ = """
import time, json
from fsdpviz.trace import load_traces
t0 = time.perf_counter()
traces = load_traces([{path!r}], cache={cache}, progress=False)
print(json.dumps({{"work": time.perf_counter() - t0, "events": len(traces.events)}}))
"""


def _run(code: str) -> tuple[float, dict]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(out.stdout.strip().splitlines()[-1])


def _best(code: str, repeat: int) -> tuple[float, float, dict]:
    runs = [_run(code) for _ in range(repeat)]
    return min(r[0] for r in runs), min(r[1]["work"] for r in runs), runs[-1][1]


def measure(trace: Path, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / trace.name  # a writable folder, so the cache can be written
        shutil.copy2(trace, copy)
        orjson_total, orjson_work, _ = _best(ORJSON.format(path=str(copy)), repeat)
        parse_total, parse_work, info = _best(FSDPVIZ.format(path=str(copy), cache=False), repeat)
        _run(FSDPVIZ.format(path=str(copy), cache=True))  # warm the cache
        cached_total, cached_work, _ = _best(FSDPVIZ.format(path=str(copy), cache=True), repeat)
    return {
        "trace": trace.name, "mb_gz": trace.stat().st_size / 1e6, "events": info["events"],
        "orjson": (orjson_total, orjson_work), "parse": (parse_total, parse_work),
        "cached": (cached_total, cached_work),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    traces = args.traces or sorted(DEFAULT_DIR.rglob("*.json.gz"))
    if not traces:
        sys.exit(f"no traces given and none found in {DEFAULT_DIR}")
    print("| trace | gzip MB | events tabled | gunzip+orjson total / work | fsdpviz parse total / work "
          "| fsdpviz cached total / work |")
    print("|---|---|---|---|---|---|")
    for trace in traces:
        r = measure(trace, args.repeat)
        cells = [f"{r[k][0]:.2f} / {r[k][1]:.2f} s" for k in ("orjson", "parse", "cached")]
        print(f"| {r['trace']} | {r['mb_gz']:.1f} | {r['events']:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
