"""Figures that the terminal, the report page and the notebook show in words, each from one summary field.

The summary (:class:`fsdpviz.analysis.summary.Summary`, ``fsdpviz summary --json``) holds every
number; these helpers only say where a figure stands and which one it is, so that views of one run
never disagree. Where two figures differ on purpose (the unprofiled step against the traced one,
a unit's own work against its whole window) their labels say which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fsdpviz.analysis.completeness import format_ranks
from fsdpviz.formatting import format_bytes, format_ms

if TYPE_CHECKING:
    from fsdpviz.analysis.bound import BoundSummary
    from fsdpviz.analysis.summary import ClockSummary, MemorySummary, Summary


def peak_place(memory: MemorySummary) -> str:
    """Where the run's highest allocated peak (``memory.peak_allocated_bytes``) happened: rank, step
    and the innermost unit pass whose window holds it ("" where the summary does not say)."""
    at = memory.categories_at
    if at is None:
        return ""
    unit = f", during {at.unit} {at.phase}".rstrip() if at.unit else ", outside every unit's window"
    return f"rank {at.rank}, step {at.step}{unit}"


def level_words(level: str | None, baseline_bytes: int | None, fmt: Callable[[float], str] = format_bytes) -> str:
    """What a CPU run's allocated level counts, where it is not the allocator's own ("" there): every
    view (the report's headline, ``compare``'s notes, the terminal's peak) says it so."""
    from fsdpviz.analysis.memory_categories import LEVEL_MEASURED_BASELINE, LEVEL_SINCE_TRACE_START

    if level == LEVEL_SINCE_TRACE_START:
        return "allocated since the trace began (the CPU profiler does not see what was made before)"
    if level == LEVEL_MEASURED_BASELINE:
        if baseline_bytes is None:  # measured, and nothing was alive
            return "allocated since the trace began (fsdpviz record measured nothing alive when it began)"
        return (f"including up to {fmt(baseline_bytes)} that fsdpviz record measured alive on a rank when the trace "
                "began")
    return ""


def not_seen_freed_text(memory: MemorySummary) -> str:
    """The blocks whose free the profiler did not see, as every view words them ("" when none)."""
    n = memory.not_seen_freed
    if n is None:
        return ""
    how = [f"{k} when their collective completed" for k in [n.at_collective_end] if k] + \
          [f"{k} by the reuse of their address" for k in [n.at_address_reuse] if k]
    return (f"{n.blocks} block(s), {format_bytes(n.bytes)} over the trace, freed by gloo's threads, where the "
            f"profiler records no free and its level never comes down: taken out of the level where they died "
            f"({', '.join(how)}), so no peak counts them")


def step_time_figures(summary: Summary) -> list[tuple[str, float]]:
    """The run's step times the summary holds, each once, with a label that says which it is: the
    unprofiled steps as the timers clock them (median), the recorder's own work in a clean step (where
    its agent measured it) and the analysed steps as traced (each rank's mean, median over ranks), which
    is also the profiled step every view compares with the unprofiled one (``profiler.profiled_step_ms``).
    The headline's step
    time is one of them (``step_time_source``)."""
    out: list[tuple[str, float]] = []
    cost = summary.profiler
    if cost is not None:
        out.append(("step time, unprofiled steps (timers, median)", cost.unprofiled_step_ms))
        if summary.traced_step_time_ms is None:  # the timers' own profiled median, where nothing traced it
            out.append(("step time, profiled steps (timers, median)", cost.profiled_step_ms))
        if cost.recorder_ms is not None:
            out.append(("recorder's own work per clean step (its agent, median)", cost.recorder_ms))
    if summary.traced_step_time_ms is not None:
        out.append(("step time, analysed steps as traced (each rank's mean, median over ranks)",
                    summary.traced_step_time_ms))
    return out


def rank_exposed_ms(summary: Summary) -> dict[int, float | None]:
    """Each rank's exposed communication per analysed step (``overlap.per_rank``)."""
    return {int(rank): row.exposed_comm_ms for rank, row in summary.overlap.per_rank.items()}


@dataclass(frozen=True, slots=True)
class BoundWords:
    """What bounds the step, as the terminal and the report's headline both say it."""

    verdict: str
    """``compute-bound, 36.4 ms (71 % of the step)``; ``mixed (largest loss 9.1 ms)``; memory-bound:
    ``memory-bound, peak 7.9 of 8.0 GiB (99 %)``."""
    time: str
    """Memory-bound: what bounds the step's time (``host``); else ""."""
    parts: str
    """``compute 36.4 ms (71 %), FSDP per-unit work 8.65 ms (17 %), ... of the 51.3 ms unprofiled GPU step``."""


def bound_words(bound: BoundSummary) -> BoundWords:
    """The bound's verdict and the step's five parts in words (``summary.bound``)."""
    parts = [("compute", bound.compute_ms), ("FSDP per-unit work", bound.fsdp_overhead_ms),
             ("exposed communication", bound.exposed_comm_ms), ("host wait", bound.host_wait_ms),
             ("other idle", bound.other_idle_ms)]
    # other idle that is not the steps' own: they waited on work queued before them
    carried = (f"{format_ms(bound.carried_ms)} of it the GPU ran work queued before the analysed steps"
               if bound.carried_ms is not None and bound.carried_ms >= 0.001 else "")

    # a host wait the de-profiler emptied is its rule's 0, not a measured one (the bound's note)
    emptied = ("the traced wait all taken as the profiler's" if bound.basis == "unprofiled" and bound.host_scale == 0.0
               else "")

    def said(name: str, ms: float | None) -> str:
        share = f"{100 * ms / bound.step_ms:.0f} %" if ms is not None and bound.step_ms else ""
        inner = "; ".join(x for x in (share, carried if name == "other idle" else "",
                                      emptied if name == "host wait" else "") if x)
        return f"{name} {format_ms(ms)}" + (f" ({inner})" if inner else "")

    basis = "unprofiled" if bound.basis == "unprofiled" else "traced"
    text = (", ".join(said(name, ms) for name, ms in parts)
            + f" of the {format_ms(bound.step_ms)} {basis} {bound.device.upper()} step")
    if bound.memory_bound and bound.peak_allocated_bytes and bound.device_memory_bytes:
        gib = 1 << 30
        return BoundWords(verdict=f"memory-bound, peak {bound.peak_allocated_bytes / gib:,.1f} of "
                                  f"{bound.device_memory_bytes / gib:,.1f} GiB "
                                  f"({100 * bound.peak_allocated_bytes / bound.device_memory_bytes:.0f} %)",
                          time=bound.time_kind or "", parts=text)
    # host-bound: the host wait and FSDP's per-unit work together (analysis/bound.py)
    sizes = {"compute": bound.compute_ms, "communication": bound.exposed_comm_ms,
             "host": None if bound.host_wait_ms is None else bound.host_wait_ms + bound.fsdp_overhead_ms}
    size = sizes.get(bound.kind)
    if size is None and bound.loss is not None:  # mixed: name the largest loss
        size = bound.loss.ms
    if size is not None and bound.step_ms and bound.kind in sizes:
        verdict = f"{bound.kind}-bound, {format_ms(size)} ({100 * size / bound.step_ms:.0f} % of the step)"
    elif size is not None:
        verdict = f"{bound.kind} (largest loss {format_ms(size)})"
    else:
        verdict = bound.kind
    return BoundWords(verdict=verdict, time="", parts=text)


def clock_words(clock: ClockSummary) -> str:
    """Which clock the run's figures are on, as the terminal and the report's headline both say it:
    its note (the replayed and the timed step among its words), and the ranks the model read where it
    did not read every rank (the actions' predicted gains are theirs too)."""
    words = clock.note  # it gives the replayed and the timed step, and so the replay's miss
    if clock.ranks is not None:
        words += (f"; the model read rank(s) {format_ranks(clock.ranks)} only, and the actions' predicted "
                  "gains are theirs")
    return words
