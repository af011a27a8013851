"""Figures that the terminal, the report page and the notebook show in words, each from one summary field.

The summary (:class:`fsdpviz.analysis.summary.Summary`, ``fsdpviz summary --json``) holds every
number; these helpers only say where a figure stands and which one it is, so that views of one run
never disagree. Where two figures differ on purpose (the unprofiled step against the traced one,
a unit's own work against its whole window) their labels say which.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fsdpviz.analysis.summary import MemorySummary, Summary


def peak_place(memory: MemorySummary) -> str:
    """Where the run's highest allocated peak (``memory.peak_allocated_bytes``) happened: rank, step
    and the innermost unit pass whose window holds it ("" where the summary does not say)."""
    at = memory.categories_at
    if at is None:
        return ""
    unit = f", during {at.unit} {at.phase}".rstrip() if at.unit else ", outside every unit's window"
    return f"rank {at.rank}, step {at.step}{unit}"


def step_time_figures(summary: Summary) -> list[tuple[str, float]]:
    """The run's step times the summary holds, each with a label that says which it is: the
    unprofiled and profiled steps as the timers clock them (medians) and the analysed steps as
    traced (mean). The headline's step time is one of them (``step_time_source``)."""
    out: list[tuple[str, float]] = []
    cost = summary.profiler
    if cost is not None:
        out.append(("step time, unprofiled steps (timers, median)", cost.unprofiled_step_ms))
        out.append(("step time, profiled steps (timers, median)", cost.profiled_step_ms))
    if summary.traced_step_time_ms is not None:
        out.append(("step time, analysed steps as traced (mean)", summary.traced_step_time_ms))
    return out


def rank_exposed_ms(summary: Summary) -> dict[int, float | None]:
    """Each rank's exposed communication per analysed step (``overlap.per_rank``)."""
    return {int(rank): row.exposed_comm_ms for rank, row in summary.overlap.per_rank.items()}
