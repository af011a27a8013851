"""Whether runs' figures can be ranked against each other at all: one clock for their times, one
meaning of their allocated level.

Each run's summary leads with its own clock (docs/concepts.md, "One clock per run"): the timers' clean
unprofiled steps where the recorder timed them, else the trace, which the profiler slowed. A run on the
trace's clock beside one on the timers' differs by the profiler's cost as much as by anything the runs
did, so ``compare`` names no better run of a time figure between them (no star, no winner in the
findings) and says why. The same holds for a CPU run's allocated level: one that adds what ``fsdpviz
record`` measured alive when the trace began (``since_trace_start_plus_measured``) peaks higher than one
that counts only what was allocated since (``since_trace_start``) by that measurement, not by anything
the run held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from fsdpviz.analysis.memory_categories import (
    LEVEL_ALLOCATOR,
    LEVEL_MEASURED_BASELINE,
    LEVEL_SINCE_TRACE_START,
)
from fsdpviz.analysis.summary import STEP_TIME_TIMERS
from fsdpviz.formatting import bytes_text, ms_text

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import LabelledRun

# The headline fields whose best mark a difference of memory level withholds (a step's rise is a
# difference of two levels: what both count the same cancels out)
LEVEL_FIELDS: Final = ("memory.peak_allocated_bytes", "memory.peak_reserved_bytes")


def clock_words(run: LabelledRun) -> str:
    """``fsdp2: the timers' clean unprofiled steps`` / ``plain: as traced (31.41 ms a step)``."""
    s = run.summary
    if s.step_time_source == STEP_TIME_TIMERS:
        return f"{run.label}: the timers' clean unprofiled steps"
    traced = f" ({ms_text(s.traced_step_time_ms)} a step)" if s.traced_step_time_ms is not None else ""
    return f"{run.label}: as traced{traced}"


def clocks_differ(runs: Sequence[LabelledRun]) -> str | None:
    """Why the runs' time figures cannot be ranked against each other (some on the timers' clock, some on
    the trace's), or None where they share one clock."""
    if len({r.summary.step_time_source for r in runs}) < 2:
        return None
    traced = [f"{r.label} {ms_text(r.summary.traced_step_time_ms)}" for r in runs
              if r.summary.traced_step_time_ms is not None]
    return ("the runs' figures are on different clocks (" + "; ".join(clock_words(r) for r in runs)
            + "): a traced figure holds the profiler's cost, the timers' does not"
            + (f"; the traced steps, which every run has: {', '.join(traced)}" if len(traced) == len(runs) else ""))


def _level_words(run: LabelledRun) -> str:
    mem = run.summary.memory
    if mem.level == LEVEL_MEASURED_BASELINE:
        extra = f" {bytes_text(mem.baseline_bytes)}" if mem.baseline_bytes is not None else ""
        return f"{run.label}: since the trace began, plus{extra} fsdpviz record measured alive then"
    if mem.level == LEVEL_SINCE_TRACE_START:
        return f"{run.label}: only what was allocated since the trace began"
    if mem.level == LEVEL_ALLOCATOR:
        return f"{run.label}: the allocator's own level"
    return f"{run.label}: unknown"


def levels_differ(runs: Sequence[LabelledRun]) -> str | None:
    """Why the runs' peaks of allocated memory cannot be ranked against each other (their levels count
    different things), or None where every level counts the same."""
    levels = {r.summary.memory.level for r in runs if r.summary.memory.peak_allocated_bytes is not None}
    if len(levels) < 2:
        return None
    return "the runs' allocated levels count different things (" + "; ".join(_level_words(r) for r in runs) + ")"
