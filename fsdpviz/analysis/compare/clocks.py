"""Which runs' figures can be ranked against each other at all: one clock for their times, one meaning
of their allocated level.

Each run's summary leads with its own clock (docs/concepts.md, "One clock per run"): the timers' clean
unprofiled steps where the recorder timed enough of them, else the trace, which the profiler slowed. A
run on the trace's clock beside one on the timers' differs by the profiler's cost as much as by anything
the runs did. So where the runs' clocks differ, ``compare`` ranks the time figures only among the runs
of one clock (the timers', where two or more runs have it, else the trace's) and names the others as not
ranked, with why their figures are as traced; the table shows every run's figure still. The same holds
for a CPU run's allocated level: one that adds what ``fsdpviz record`` measured alive when the trace
began (``since_trace_start_plus_measured``) peaks higher than one that counts only what was allocated
since (``since_trace_start``) by that measurement, not by anything the run held: the peaks get no best
mark (the memory a step adds, a difference of two levels, counts the same in each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from fsdpviz.analysis.figures import level_words
from fsdpviz.analysis.summary import STEP_TIME_TIMERS, STEP_TIME_TRACE
from fsdpviz.formatting import bytes_text, ms_text
from fsdpviz.structure.records import PROFILER_COST_UNUSED

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import LabelledRun

# The headline fields whose best mark a difference of memory level withholds (a step's rise is a
# difference of two levels: what both count the same cancels out)
LEVEL_FIELDS: Final = ("memory.peak_allocated_bytes", "memory.peak_reserved_bytes")


def ranked_on_clock(runs: Sequence[LabelledRun]) -> list[int]:
    """The runs whose time figures are ranked against each other: all of them where they share a clock;
    else those on the timers' clock where two or more are, else those on the trace's where two or more
    are, else none."""
    sources = [r.summary.step_time_source for r in runs]
    if len(set(sources)) < 2:
        return list(range(len(runs)))
    for source in (STEP_TIME_TIMERS, STEP_TIME_TRACE):
        group = [i for i, s in enumerate(sources) if s == source]
        if len(group) >= 2:
            return group
    return []


def _why_traced(run: LabelledRun) -> str:
    """Why a run's figures are as traced, in its own summary's words (its note of why the profiler's cost
    is not taken out: no clean step timed, or timers that do not hold it), else: no timers at all."""
    said = next((str(n) for n in run.summary.notes if n.code == PROFILER_COST_UNUSED), None)
    if said:
        return said.removeprefix("the step time is the traced one: ")
    return "no timers (traces recorded without fsdpviz record)"


def different_clocks(runs: Sequence[LabelledRun]) -> str | None:
    """Why some runs' time figures are not ranked against the others' (their clocks differ), naming each
    run's clock, the runs that are not ranked and the traced steps every run has; None where every run
    is ranked."""
    ranked = set(ranked_on_clock(runs))
    if len(ranked) == len(runs):
        return None
    clocks = "; ".join(f"{r.label}: the timers' clean unprofiled steps" if r.summary.step_time_source == STEP_TIME_TIMERS
                       else f"{r.label}: as traced ({_why_traced(r)})" for r in runs)
    left = [r.label for i, r in enumerate(runs) if i not in ranked]
    traced = [f"{r.label} {ms_text(r.summary.traced_step_time_ms)}" for r in runs
              if r.summary.traced_step_time_ms is not None]
    return (f"the runs' figures are on different clocks ({clocks}): a traced figure holds the profiler's cost, the "
            f"timers' does not, so {', '.join(left)} {'is' if len(left) == 1 else 'are'} not ranked on time figures"
            + (f"; the traced steps, which every run has: {', '.join(traced)}" if len(traced) == len(runs) else ""))


def pace_notes(runs: Sequence[LabelledRun]) -> list[str]:
    """The runs whose timers timed their profiled steps faster than their clean ones (``profiler.pace_note``):
    each still on the timers' clock, its figures the profiled window's carried there, its profiler's share
    not known, in its own summary's words."""
    return [f"{r.label}: {r.summary.profiler.pace_note}" for r in runs
            if r.summary.profiler is not None and r.summary.profiler.pace_note]


def _level_words(run: LabelledRun) -> str:
    mem = run.summary.memory
    return f"{run.label}: " + (level_words(mem.level, mem.baseline_bytes, bytes_text) or "the allocator's own level")


def levels_differ(runs: Sequence[LabelledRun]) -> str | None:
    """Why the runs' peaks of allocated memory cannot be ranked against each other (their levels count
    different things), or None where every known level counts the same (a run whose level is not
    known, without memory samples, is left out of the test)."""
    known = [r for r in runs if r.summary.memory.peak_allocated_bytes is not None and r.summary.memory.level]
    if len({r.summary.memory.level for r in known}) < 2:
        return None
    return "the runs' allocated levels count different things (" + "; ".join(_level_words(r) for r in known) + ")"
