"""Where the test suite's CPU goes: a pytest plugin that logs each test's wall time, its worker's CPU and
its reaped child processes' CPU (real recordings, commands run as processes), and a summary of the logs.

Run the suite as ``make test`` runs it, with the plugin (each xdist worker writes its own log)::

    rm -rf /tmp/suite-cpu && PYTHONPATH=benchmarks SUITE_CPU_DIR=/tmp/suite-cpu FSDPVIZ_TEST_RECORDINGS=committed \\
        /usr/bin/time -f "%e s wall, %U s user, %S s sys" .venv/bin/python -m pytest -q -n 3 --dist loadfile \\
        -p suite_cpu -m "not clients and not lifecycle and not example_script and not roundtrip"
    .venv/bin/python benchmarks/suite_cpu.py /tmp/suite-cpu

The summary prints the totals and the files that cost the most CPU (docs/testing.md). A child's CPU counts
only once the child is reaped: a worker kept by a module's fixture (Dask) counts when that fixture ends.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_ROWS: list[dict[str, Any]] = []


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    own, children, wall = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    yield
    _ROWS.append({"id": item.nodeid, "wall": time.perf_counter() - wall,
                  "self": _cpu(resource.RUSAGE_SELF) - own, "children": _cpu(resource.RUSAGE_CHILDREN) - children})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    folder = os.environ.get("SUITE_CPU_DIR")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (Path(folder) / f"rows-{worker}.json").write_text(json.dumps(_ROWS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="SUITE_CPU_DIR of a run with the plugin")
    parser.add_argument("--top", type=int, default=15, help="files to list (default 15)")
    args = parser.parse_args()
    rows = [r for path in sorted(args.folder.glob("rows-*.json")) for r in json.loads(path.read_text())]
    if not rows:
        raise SystemExit(f"{args.folder}: no rows-*.json (run the suite with -p suite_cpu and SUITE_CPU_DIR)")
    files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        f = files[r["id"].split("::")[0]]
        f[0] += r["self"]
        f[1] += r["children"]
        f[2] += r["wall"]
        f[3] += 1
    own, children = sum(r["self"] for r in rows), sum(r["children"] for r in rows)
    print(f"{len(rows)} tests: {own:.0f} CPU-s in the workers, {children:.0f} in reaped child processes, "
          f"{sum(r['wall'] for r in rows):.0f} worker-seconds")
    print("| file | tests | CPU-s | of which child processes | worker-seconds |\n|---|---:|---:|---:|---:|")
    for name, (s, c, w, n) in sorted(files.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:args.top]:
        print(f"| `{name}` | {n:.0f} | {s + c:.1f} | {c:.1f} | {w:.1f} |")


if __name__ == "__main__":
    main()
