"""The test workers' garbage collector: the suite's thresholds (``tests/conftest.py``) against CPython's
defaults, on test files that hold the shared GPU recordings' analyses and what-if models.

Runs ``pytest FILES`` in one process (no xdist) once per setting per round, the settings in turn, each
in a fresh interpreter: ``suite`` as ``tests/conftest.py`` leaves it, ``default`` with CPython's
(700, 10, 10) set back after the conftest (this file is also the pytest plugin that does it, and that
counts the collections and their time). Prints each run's CPU seconds (user + system of the pytest
process and its children), the collector's count and seconds, and the peak RSS, then the ranges.

    python benchmarks/bench_collector.py [--rounds 2] [FILES ...]

FILES default to tests/unit/test_one_clock.py and tests/unit/test_whatif_honesty.py, which read the
shared traces (``../shared``) when they are beside the checkout. Results are recorded in docs/testing.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # this checkout's fsdpviz, and the harness

from harness import describe_machine, run_measured, spread

DEFAULT_FILES = ["tests/unit/test_one_clock.py", "tests/unit/test_whatif_honesty.py"]
SETTINGS = ("default", "suite")
_ENV_SETTING = "FSDPVIZ_BENCH_GC_SETTING"
_ENV_OUT = "FSDPVIZ_BENCH_GC_OUT"
_spent = {"count": 0, "s": 0.0, "started": 0.0}


def _callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _spent["started"] = time.perf_counter()
    else:
        _spent["count"] += 1
        _spent["s"] += time.perf_counter() - _spent["started"]


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """As a plugin (``-p bench_collector``): after the conftest, put the setting's thresholds in place."""
    if os.environ.get(_ENV_SETTING) == "default":
        gc.set_threshold(700, 10, 10)
    gc.callbacks.append(_callback)


def pytest_unconfigure(config: pytest.Config) -> None:
    out = os.environ.get(_ENV_OUT)
    if out:
        Path(out).write_text(json.dumps({"collections": _spent["count"], "gc_s": _spent["s"],
                                         "thresholds": list(gc.get_threshold())}))


def _run(setting: str, files: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "gc.json"
        env = {**os.environ, _ENV_SETTING: setting, _ENV_OUT: str(out),
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]),
               "FSDPVIZ_TEST_RECORDINGS": "committed"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        done = run_measured([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                             "-p", "bench_collector", *(str(ROOT / f) for f in files)], env=env)
        if done.returncode != 0:
            sys.exit(f"pytest failed ({setting}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        facts = json.loads(out.read_text())
    return {"setting": setting, "wall_s": done.wall_s, "cpu_s": done.cpu_s, "peak_rss_mb": done.max_rss_mb,
            "tail": done.stdout.strip().splitlines()[-1], **facts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=DEFAULT_FILES)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(describe_machine())
    print(f"files: {' '.join(args.files)}; shared traces beside the checkout: {(ROOT.parent / 'shared').is_dir()}")
    runs = []
    for r in range(args.rounds):
        for setting in SETTINGS:
            run = _run(setting, args.files)
            runs.append(run)
            print(f"round {r + 1} {setting:7s} thresholds {tuple(run['thresholds'])}: {run['cpu_s']:.1f} CPU-s, "
                  f"{run['wall_s']:.1f} s wall, collector {run['collections']} x {run['gc_s']:.1f} s, "
                  f"peak RSS {run['peak_rss_mb']:.0f} MB ({run['tail']})", flush=True)
    for setting in SETTINGS:
        mine = [x for x in runs if x["setting"] == setting]
        print(f"{setting:7s}: CPU-s {spread([x['cpu_s'] for x in mine], '{:.1f}')}, "
              f"collector s {spread([x['gc_s'] for x in mine], '{:.1f}')}")


if __name__ == "__main__":
    main()
