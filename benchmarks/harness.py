"""Shared by the benchmarks: run a command as a fresh process and measure it; medians with spread;
the machine the numbers come from.

A user's command pays for interpreter start-up, imports and every worker process, so the
benchmarks time whole processes: wall clock from spawn to exit; CPU time (user + system, the
process and every worker it waited for), which other jobs on a shared machine inflate far less
than the wall clock; and two memory figures:

- ``max_rss_mb``: the peak resident set of the largest single process (the process itself or any
  worker it waited for), from ``wait4``'s resource usage (what ``/usr/bin/time`` reports);
- ``tree_rss_mb``: the peak of the summed resident sets of the process and all its descendants,
  sampled every 20 ms (an upper bound: pages a forked worker shares with its parent count twice).

Timings on a shared machine are noisy: every benchmark runs its variants interleaved, several
times, and reports the median with the range (min-max), next to the load average.
"""

from __future__ import annotations

import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SAMPLE_S = 0.02


@dataclass(frozen=True, slots=True)
class Measurement:
    """One fresh process: wall time (s), peak memory (MB), exit code and output."""

    wall_s: float
    cpu_s: float  # user + system time of the process and the workers it waited for
    max_rss_mb: float
    tree_rss_mb: float
    returncode: int
    stdout: str
    stderr: str


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids.extend(int(k) for k in fh.read().split())
    except OSError:
        pass
    return kids


def _tree_rss_bytes(root: int) -> int:
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):
            continue
        todo.extend(_children(pid))
    return total


def run_measured(argv: Sequence[str], *, env: dict[str, str] | None = None,
                 timeout_s: float = 3600.0) -> Measurement:
    """Run ``argv`` as a fresh process; wall time from spawn to exit, peak memory (see module doc)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, env=env, start_new_session=True)
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(SAMPLE_S):
                peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        killer = threading.Timer(timeout_s, lambda: os.killpg(proc.pid, signal.SIGKILL))
        killer.start()
        # wait4 (not Popen.wait) to get this child's resource usage, its reaped workers included.
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - started
        killer.cancel()
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measurement(
            wall_s=wall_s,
            cpu_s=usage.ru_utime + usage.ru_stime,
            max_rss_mb=usage.ru_maxrss / 1024,  # kB on Linux
            tree_rss_mb=max(peak[0] / 2**20, usage.ru_maxrss / 1024),
            returncode=proc.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
        )


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``median (min-max)`` of several runs; just the value for one."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def shared_gpu_recordings(shared: Path) -> list[Path]:
    """The shared GPU recordings under ``shared`` (``../shared/traces``) that are there: the H100 run
    folders (``gpu-fsdp/h100-*``), then the H200's B, Bl and Broot."""
    folders = [p for p in sorted((shared / "gpu-fsdp").glob("h100-*")) if p.is_dir()]
    return folders + [p for p in (shared / "gpu-h200" / n for n in ("B", "Bl", "Broot")) if p.is_dir()]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def describe_machine() -> str:
    """CPU model, cores, RAM, OS, Python and the current load average, on one line."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = float("nan")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = int(line.split()[1]) / 2**20
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{model}, {os.cpu_count()} logical CPUs ({usable} usable), {ram_gb:.0f} GB RAM, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}; "
            f"load average (1/5/15 min) {load_average()}")


def versions(*modules: str) -> str:
    """``name version`` of each importable module, for the record."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in modules:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def python_of(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
