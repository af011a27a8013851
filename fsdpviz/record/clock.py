"""The rank side of the timers: marks intervals of the running step and writes finished steps.

``timers.py`` holds the pure parts (intervals, summarising, the file); this class reads the clocks:
``time.perf_counter_ns`` always, plus a CUDA event on the current stream when the rank trains on a
GPU, and the per-step memory peak (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` on
GPU, the process's peak RSS on Linux CPUs), resetting it each step. A step whose CUDA events have not
completed yet waits in a queue until a later step end finds them done: no device synchronisation
inside the training loop.
"""

from __future__ import annotations

import re
import sys
import time
from collections import deque
from pathlib import Path

import torch

from fsdpviz.record.timers import Interval, StepTimes, TimersWriter, step_is_ready, summarize_step


def read_peak_rss_bytes() -> int | None:
    """Peak resident memory of this process since the last reset (Linux ``VmHWM``), or None."""
    try:
        match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        return int(match.group(1)) * 1024 if match else None
    except OSError:
        return None


def reset_peak_rss() -> None:
    try:  # Linux: writing "5" resets the peak RSS (VmHWM) to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


class StepClock:
    """Intervals of the running step; inactive (every call a no-op) until :meth:`start`."""

    def __init__(self) -> None:
        self.writer: TimersWriter | None = None
        self.rank = 0
        self.memory = False
        self.use_cuda = False
        self.times = StepTimes(0)
        self.steps_written = 0
        self.error: str | None = None  # why the timers stopped being written (a full disk...)
        self._pending: deque[StepTimes] = deque()

    def start(self, writer: TimersWriter | None, *, rank: int, step: int, memory: bool, use_cuda: bool) -> None:
        self.writer, self.rank, self.memory, self.use_cuda = writer, rank, memory, use_cuda
        self.times = StepTimes(step)
        if writer is not None and memory:
            self._read_memory_peak()  # starts the first step's peak from here

    def mark(self, unit: str, phase: str, kind: str) -> Interval | None:
        """Open an interval of the running step (None when timers are off)."""
        if self.writer is None:
            return None
        interval = Interval(unit, phase, kind, time.perf_counter_ns())
        if self.use_cuda:
            interval.start_event = torch.cuda.Event(enable_timing=True)
            interval.start_event.record()
        self.times.intervals.append(interval)
        return interval

    def close(self, interval: Interval | None) -> None:
        if interval is None or interval.end_ns >= 0:
            return
        interval.end_ns = time.perf_counter_ns()
        if interval.start_event is not None:
            interval.end_event = torch.cuda.Event(enable_timing=True)
            interval.end_event.record()

    def end_step(self, next_step: int, *, partial: bool = False) -> None:
        """Finish the running step (queue its records) and start ``next_step``."""
        times, self.times = self.times, StepTimes(next_step)
        if self.writer is None:
            return
        times.partial = partial
        if self.memory:
            times.memory = self._read_memory_peak()
        self._pending.append(times)
        self.flush(block=False)

    def flush(self, *, block: bool) -> None:
        """Write the queued steps that are ready (all of them, after a device sync, if ``block``)."""
        if self.writer is None:
            return
        if block and self.use_cuda:
            torch.cuda.synchronize()
        while self._pending and (block or step_is_ready(self._pending[0])):
            times = self._pending.popleft()
            if times.intervals or times.memory:
                try:
                    self.writer.write(summarize_step(self.rank, times))
                except OSError as exc:  # a full disk must not stop the training: stop the timers
                    self._stop_writing(f"could not write the timers: {exc}")
                    return
                self.steps_written += 1

    def close_writer(self) -> None:
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as exc:
                self._stop_writing(f"could not write the timers: {exc}")

    def _stop_writing(self, error: str) -> None:
        """Timers off from here on; the complete lines already written stay for the launcher."""
        self.error, self.writer = error, None
        self._pending.clear()
        print(f"fsdpviz: rank {self.rank}: {error}", file=sys.stderr, flush=True)

    def _read_memory_peak(self) -> dict[str, int]:
        if self.use_cuda:
            peaks = {"peak_allocated": torch.cuda.max_memory_allocated(),
                     "peak_reserved": torch.cuda.max_memory_reserved()}
            torch.cuda.reset_peak_memory_stats()
            return peaks
        peak = read_peak_rss_bytes()
        reset_peak_rss()
        return {"peak_rss": peak} if peak is not None else {}
