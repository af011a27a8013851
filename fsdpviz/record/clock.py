"""The rank side of the timers: marks intervals of the running step and writes finished steps.

``timers.py`` holds the pure parts (intervals, summarising, the file); this class reads the clocks:
``time.perf_counter_ns`` always, plus a CUDA event on the current stream when the rank trains on a
GPU, and the per-step memory peak (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` on
GPU, the process's peak RSS on Linux CPUs). A step whose CUDA events have not completed yet waits in a
queue until a later step end finds them done: no device synchronisation inside the training loop.

The peak counters are the script's too (torchtitan, HF Trainer and Lightning log them), so they are
read and never reset: a step that raised a counter has its peak exactly, one that did not is "at most"
the counter (``timers.step_peak``). Where the script resets the CUDA counters itself
(``torch.cuda.reset_peak_memory_stats``), the clock reads them just before the reset goes through.
"""

from __future__ import annotations

import importlib
import re
import resource
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fsdpviz.record.timers import (
    KIND_TOTAL,
    PHASE_STEP,
    WHOLE_STEP,
    Interval,
    StepTimes,
    TimersWriter,
    step_is_ready,
    step_peak,
    summarize_step,
)


def read_peak_rss_bytes() -> int | None:
    """Peak resident memory of this process so far (Linux ``VmHWM``), or None."""
    try:
        match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
        return int(match.group(1)) * 1024 if match else None
    except OSError:
        return None


def _cuda_peaks() -> dict[str, int]:
    return {"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}


class PeakWatch:
    """The step's peak-memory readings: the counters at the step's start, and at the end of each part
    of it (a part ends at a reset the script made, or at the step's end)."""

    def __init__(self, read: Callable[[], dict[str, int]]) -> None:
        self.read = read
        self.baseline: dict[str, int] = {}
        self.segments: dict[str, list[tuple[int, bool]]] = {}
        self._after_reset = False

    def start(self) -> None:
        """The counters as the first step begins (they cover the process so far)."""
        self.baseline = self.read()

    def before_reset(self) -> None:
        """The script is about to reset the counters: keep what they say of this part of the step."""
        self._close_part()
        self._after_reset = True

    def end_step(self) -> dict[str, tuple[int, str]]:
        """The step's peaks, (bytes, bound) per kind; the next step starts from the counters now."""
        now = self._close_part()
        peaks = {kind: step_peak(self.baseline.get(kind), parts) for kind, parts in self.segments.items()}
        self.baseline, self.segments, self._after_reset = now, {}, False
        return peaks

    def _close_part(self) -> dict[str, int]:
        now = self.read()
        for kind, value in now.items():
            self.segments.setdefault(kind, []).append((value, self._after_reset))
        return now


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
        self.step_ms: dict[int, float] = {}  # each written step's time (the timers' step/total), for run.json
        self._pending: deque[StepTimes] = deque()
        self._peaks: PeakWatch | None = None
        self._restore: list[tuple[Any, str, Any, Any]] = []  # (owner, name, original, wrapper)

    def start(self, writer: TimersWriter | None, *, rank: int, step: int, memory: bool, use_cuda: bool) -> None:
        self.writer, self.rank, self.memory, self.use_cuda = writer, rank, memory, use_cuda
        self.times = StepTimes(step)
        if writer is not None and memory:
            self._peaks = PeakWatch(_cuda_peaks if use_cuda else _rss_peak)
            self._peaks.start()  # the first step's peak is measured against the counters from here
            if use_cuda:
                self._watch_resets(self._peaks)

    def _watch_resets(self, peaks: PeakWatch) -> None:
        """Read the CUDA peak counters just before the script resets them (its reset still happens).

        torch's ``reset_peak_memory_stats`` (and ``reset_max_memory_allocated``, which calls it) reset
        through ``torch._C._cuda_resetPeakMemoryStats``, looked up at each call: wrapping that one
        function sees every reset made from Python, also through a name the script imported early."""
        owners: list[Any] = [torch._C]
        name = "_cuda_resetPeakMemoryStats"
        original = getattr(torch._C, name, None)
        if original is None:  # a torch without it: the Python function, where torch.cuda exports it
            memory = importlib.import_module("torch.cuda.memory")
            name, original = "reset_peak_memory_stats", memory.reset_peak_memory_stats
            owners = [o for o in (memory, torch.cuda) if getattr(o, name, None) is original]
        clock = self

        def reset(*args: Any, **kwargs: Any) -> Any:
            if clock._peaks is peaks:  # still reading (not after a failed reading, nor after the run)
                try:
                    peaks.before_reset()
                except Exception as exc:  # noqa: BLE001 - a reading must never stop the script's own call
                    print(f"fsdpviz: could not read the peak memory before a reset: {exc!r}", file=sys.stderr,
                          flush=True)
            return original(*args, **kwargs)

        for owner in owners:
            self._restore.append((owner, name, original, reset))
            setattr(owner, name, reset)

    def remove(self) -> None:
        """Put back what :meth:`start` replaced, where it is still fsdpviz's (a later wrapper of the
        script's own stays)."""
        self._peaks = None
        while self._restore:
            owner, name, original, ours = self._restore.pop()
            if getattr(owner, name, None) is ours:
                setattr(owner, name, original)

    def mark(self, unit: str, phase: str, kind: str) -> Interval | None:
        """Open an interval of the running step (None when timers are off)."""
        if self.writer is None:
            return None
        interval = Interval(unit, phase, kind, time.perf_counter_ns())
        if self.use_cuda:
            interval.start_event = torch.cuda.Event(enable_timing=True)
            interval.start_event.record()
            self.times.cuda_events += 1
        self.times.intervals.append(interval)
        return interval

    def close(self, interval: Interval | None) -> None:
        if interval is None or interval.end_ns >= 0:
            return
        interval.end_ns = time.perf_counter_ns()
        if interval.start_event is not None:
            interval.end_event = torch.cuda.Event(enable_timing=True)
            interval.end_event.record()
            self.times.cuda_events += 1

    @property
    def running(self) -> StepTimes:
        """The running step's intervals so far."""
        return self.times

    def end_step(self, next_step: int, *, partial: bool = False, hold: bool = False) -> None:
        """Finish the running step (queue its records) and start ``next_step``. ``hold``: write nothing
        now (a profiled step: summarising and writing would land in the trace's step); a later step's
        end, or :meth:`flush` at exit, writes what waits."""
        times, self.times = self.times, StepTimes(next_step)
        if self.writer is None:
            return
        times.partial = partial
        if self._peaks is not None:
            try:
                times.memory = self._peaks.end_step()
            except Exception as exc:  # noqa: BLE001 - a reading must never stop the training
                self._peaks = None
                print(f"fsdpviz: rank {self.rank}: could not read the peak memory: {exc!r}", file=sys.stderr, flush=True)
        self._pending.append(times)
        if not hold:
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
                records = summarize_step(self.rank, times)
                try:
                    self.writer.write(records)
                except OSError as exc:  # a full disk must not stop the training: stop the timers
                    self._stop_writing(f"could not write the timers: {exc}")
                    return
                self.steps_written += 1
                for r in records:
                    if r["unit"] == WHOLE_STEP and r["phase"] == PHASE_STEP and r["kind"] == KIND_TOTAL:
                        self.step_ms[times.step] = r["ms"]

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


def _rss_peak() -> dict[str, int]:
    """The process's peak RSS: ``getrusage``'s ``ru_maxrss`` on Linux (the same high-water mark as
    ``VmHWM``, one system call instead of reading and parsing ``/proc/self/status``)."""
    if sys.platform.startswith("linux"):
        return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    peak = read_peak_rss_bytes()
    return {"peak_rss": peak} if peak is not None else {}
