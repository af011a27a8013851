"""Per-step timers: cheap intervals on every step, summarised into ``timers/rank{R}.jsonl``.

torch.profiler records a few steps in full detail; the timers cover *every* step at a cost of a
few clock reads per unit and phase, so a run's step-to-step variation and its first steps are
visible too. The agent marks intervals (a unit's forward, its gathers, ...); this module turns a
step's intervals into records and writes them.

Clocks: on CPU ``time.perf_counter_ns`` on the training thread. On GPU every mark also records a
CUDA event on the current stream; a step's records are written once its last event has completed
(checked at later step ends, never by synchronising the device), so timing never stalls training.
CPU timestamps always decide which interval lies inside which.

Record format (one JSON object per line), see docs/recording.md "Timers":
``{"rank", "step", "unit", "phase", "kind", "ms", "n"}`` with ``kind`` one of ``total``,
``compute``, ``all_gather``, ``reduce_scatter``; memory records have ``kind`` ``peak_rss`` /
``peak_allocated`` / ``peak_reserved``, ``ms`` null, ``bytes`` and ``bound`` (:func:`step_peak`).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final

from fsdpviz import vocabulary
from fsdpviz.runfolder import PARTIAL_SUFFIX

KIND_TOTAL: Final = "total"
KIND_COMPUTE: Final = vocabulary.COMPUTE
KIND_ALL_GATHER: Final = vocabulary.ALL_GATHER
KIND_REDUCE_SCATTER: Final = vocabulary.REDUCE_SCATTER
COMM_KINDS: Final = (KIND_ALL_GATHER, KIND_REDUCE_SCATTER)
PHASE_STEP: Final = "step"
WHOLE_STEP: Final = ""  # the ``unit`` of records about the whole step


@dataclass(slots=True)
class Interval:
    """One timed interval of a step. ``start_ns``/``end_ns`` are CPU monotonic clock readings."""

    unit: str
    phase: str
    kind: str
    start_ns: int
    end_ns: int = -1
    start_event: Any = None  # CUDA events on GPU, None on CPU
    end_event: Any = None

    def dur_ns(self) -> int:
        """The duration: GPU time between the events when present, else CPU time."""
        if self.start_event is not None and self.end_event is not None:
            return int(self.start_event.elapsed_time(self.end_event) * 1e6)
        return self.end_ns - self.start_ns

    def contains(self, other: Interval) -> bool:
        return self.start_ns <= other.start_ns and other.end_ns <= self.end_ns and self is not other


@dataclass(slots=True)
class StepTimes:
    """Everything timed during one step, and what is still pending."""

    step: int
    intervals: list[Interval] = field(default_factory=list)
    memory: dict[str, tuple[int, str]] = field(default_factory=dict)  # kind -> (bytes, bound)
    partial: bool = False  # the run ended inside this step
    cuda_events: int = 0  # CUDA events the step's intervals created

    def unit_intervals(self) -> int:
        """How many of the step's intervals time a unit (not the whole step)."""
        return sum(1 for i in self.intervals if i.unit != WHOLE_STEP)


EXACT: Final = "exact"
AT_MOST: Final = "at_most"
AT_LEAST: Final = "at_least"


def step_peak(baseline: int | None, segments: list[tuple[int, bool]]) -> tuple[int, str]:
    """A step's peak from cumulative peak counters that nobody resets for fsdpviz's sake.

    ``baseline``: the counter at the step's start (None: never read before, the counter covers the
    process so far). ``segments``: the counter read at the end of each part of the step, with whether
    that part began at a reset the recorder saw (the script's own ``reset_peak_memory_stats``): the
    first part begins at the step's start. Returns (bytes, bound):

    - ``exact``: the step raised the counter (or the counter was reset for it), so the reading is the
      step's peak;
    - ``at_most``: the counter stayed where an earlier step left it: the step's peak is at most that;
    - ``at_least``: the counter went down with no reset seen (the script reset it in a way fsdpviz does
      not see, e.g. ``/proc/self/clear_refs``): the step's peak is at least the reading.
    """
    low = high = 0
    unbounded = False
    for reading, after_reset in segments:
        if after_reset or (baseline is not None and reading > baseline):
            low, high = max(low, reading), max(high, reading)
        elif baseline is None or reading == baseline:
            high = max(high, reading)
        else:
            low, unbounded = max(low, reading), True
    if unbounded:
        return low, AT_LEAST
    return (high, EXACT) if low == high else (high, AT_MOST)


def _cpu_overlap_ns(a: Interval, b: Interval) -> int:
    return max(0, min(a.end_ns, b.end_ns) - max(a.start_ns, b.start_ns))


def _ancestors(intervals: list[Interval], parent: dict[int, Interval]) -> dict[str, set[str]]:
    """unit -> the units whose forward intervals enclose its own (this step's nesting of units)."""
    out: dict[str, set[str]] = defaultdict(set)
    for interval in intervals:
        if interval.kind != KIND_TOTAL or interval.phase != "forward":
            continue
        up = parent.get(id(interval))
        while up is not None:
            if up.kind == KIND_TOTAL and up.unit != interval.unit:
                out[interval.unit].add(up.unit)
            up = parent.get(id(up))
    return out


def _nesting(intervals: list[Interval]) -> tuple[dict[int, Interval], list[tuple[Interval, Interval]]]:
    """The innermost (shortest) interval around each interval, and the pairs that cross (the
    older first): ``(S, Y)`` with Y starting inside S and ending after it.

    Unit ranges need not nest: FSDP2's root opens its backward inside the first unit's backward and
    closes it after every unit's. One sweep in start order with a list of the open intervals: in a
    training step a handful are open at once.
    """
    ordered = sorted(intervals, key=lambda i: (i.start_ns, -i.end_ns))
    parent: dict[int, Interval] = {}
    crossing: list[tuple[Interval, Interval]] = []
    open_: list[Interval] = []
    for interval in ordered:
        open_ = [o for o in open_ if o.end_ns > interval.start_ns]
        around = [o for o in open_ if o.end_ns >= interval.end_ns]
        if around:
            parent[id(interval)] = min(around, key=lambda o: o.end_ns - o.start_ns)
        crossing.extend((o, interval) for o in open_ if o.end_ns < interval.end_ns)
        open_.append(interval)
    return parent, crossing


def summarize_step(rank: int, times: StepTimes) -> list[dict[str, Any]]:
    """Turn one step's intervals into timer records.

    Per (unit, phase): ``total`` (sum of the unit's intervals of that phase), ``all_gather`` and
    ``reduce_scatter`` (time the training thread spent in them), and ``compute`` = total minus what
    ran inside it that is not its own work: the intervals directly inside it (nested units, gathers,
    reductions) and the part of a crossing unit interval that belongs to the other unit. Of two unit
    intervals that cross, the time they share belongs to the descendant when one unit encloses the
    other in forward (the root's backward opens inside its first unit's), else to the newer one.
    Whole-step records have ``unit`` "".
    """
    complete = [i for i in times.intervals if i.end_ns >= 0]
    durations = {id(i): i.dur_ns() for i in complete}
    # Whole-step spans (the step, the root's forward) are not part of the unit nesting.
    nested = [i for i in complete if not (i.unit == WHOLE_STEP and i.kind == KIND_TOTAL)]
    parent, crossing = _nesting(nested)
    ancestors = _ancestors(nested, parent)
    inner: dict[int, float] = defaultdict(float)  # per unit interval: time of other work inside it
    for interval in nested:
        up = parent.get(id(interval))
        if up is not None:
            inner[id(up)] += durations[id(interval)]
    for older, newer in crossing:
        if older.kind == KIND_TOTAL and newer.kind == KIND_TOTAL:
            if older.unit == newer.unit:
                continue
            # an enclosing unit gives the shared time to its descendant; else the newer unit has it
            loser, winner = (newer, older) if newer.unit in ancestors.get(older.unit, ()) else (older, newer)
        elif older.kind == KIND_TOTAL:
            loser, winner = older, newer  # a gather or reduction reaching into a unit's interval
        elif newer.kind == KIND_TOTAL:
            loser, winner = newer, older
        else:
            continue
        span = max(winner.end_ns - winner.start_ns, 1)  # the winner's duration, pro rata to the CPU overlap
        inner[id(loser)] += durations[id(winner)] * _cpu_overlap_ns(loser, winner) / span
    sums: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])

    def add(key: tuple[str, str, str], ns: int) -> None:
        sums[key][0] += ns
        sums[key][1] += 1

    for interval in complete:
        key = (interval.unit, interval.phase, interval.kind)
        add(key, durations[id(interval)])
        if interval.kind == KIND_TOTAL and interval.unit != WHOLE_STEP:
            own = durations[id(interval)] - round(inner.get(id(interval), 0.0))
            add((interval.unit, interval.phase, KIND_COMPUTE), max(own, 0))

    records: list[dict[str, Any]] = []
    for (unit, phase, kind), (ns, count) in sums.items():
        record = {"rank": rank, "step": times.step, "unit": unit, "phase": phase, "kind": kind,
                  "ms": round(ns / 1e6, 6), "n": count}
        if times.partial:
            record["partial"] = True
        records.append(record)
    for kind, (nbytes, bound) in times.memory.items():
        records.append({"rank": rank, "step": times.step, "unit": WHOLE_STEP, "phase": PHASE_STEP,
                        "kind": kind, "ms": None, "bytes": nbytes, "bound": bound})
    return records


def step_is_ready(times: StepTimes) -> bool:
    """True when every CUDA event of the step has completed (always true on CPU)."""
    for interval in times.intervals:
        for event in (interval.start_event, interval.end_event):
            if event is not None and not event.query():
                return False
    return True


try:  # msgspec encodes a step's records ~5x faster than json: it runs inside the training loop
    from msgspec.json import Encoder as _Encoder

    _encode = _Encoder().encode
except ImportError:  # pragma: no cover - msgspec is a dependency, but never break a run over it
    def _encode(record: dict[str, Any]) -> bytes:
        return json.dumps(record, separators=(",", ":")).encode()


class TimersWriter:
    """Appends records to ``rank{R}.jsonl.partial``; :meth:`close` renames it to the final name.

    The file is flushed after every step, so if the process dies hard the launcher can still keep
    every complete line (see :func:`salvage_partial`).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._partial = path.with_name(path.name + PARTIAL_SUFFIX)
        self._file: BinaryIO | None = None

    def write(self, records: Iterable[dict[str, Any]]) -> None:
        if self._file is None:
            self._partial.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self._partial, "wb")  # noqa: SIM115 - lives across steps
        self._file.write(b"".join(_encode(r) + b"\n" for r in records))
        self._file.flush()

    def close(self) -> Path | None:
        """Finish the file; returns its final path (None if nothing was ever written)."""
        if self._file is None:
            return None
        self._file.close()
        self._file = None
        os.replace(self._partial, self.path)
        return self.path


def salvage_partial(partial: Path) -> Path:
    """Keep the complete lines of a timers file its writer could not finish; return the final path."""
    final = partial.with_name(partial.name[: -len(PARTIAL_SUFFIX)])
    data = partial.read_bytes()
    complete = data.rfind(b"\n") + 1
    if complete < len(data):  # drop a half-written last line, in place: needs no free space
        os.truncate(partial, complete)
    os.replace(partial, final)
    return final
