"""The "across steps and ranks" section: step times of every step, where each rank's step went,
per-unit timer spreads, and how far apart ranks start their collectives (stragglers)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pandas as pd

from fsdpviz.analysis.bound import clock_scale, comm_clock_scale
from fsdpviz.analysis.figures import rank_exposed_ms, step_time_figures
from fsdpviz.formatting import NS_PER_MS, format_ms
from fsdpviz.report.html import Fact, Section
from fsdpviz.report.steps import data as steps_data
from fsdpviz.report.steps import plots

if TYPE_CHECKING:
    from fsdpviz.report.data import ReportData

HEATMAP_RANKS = 32  # beyond this many ranks, rank x step heat maps replace per-rank boxes and bars

HOWTO_STEPS = (
    "Step time of every recorded step on every rank: per step, the spread over ranks (a tall box means "
    "some rank was late, and everyone else waits for it at the next collective); per rank, the spread "
    "over steps (a rank that is always high is a straggler). Below, from the analysed steps: where each "
    "rank's traced step went on its training threads (as traced: the profiler slowed that host work), each "
    "rank's exposed communication and lateness, and for each collective how far apart the ranks started it. With timers, the spread of each unit's own forward "
    "and backward work over the unprofiled steps (the unit table's timers columns are their medians)."
)


def steps_section(data: ReportData) -> Section:
    """Step times, breakdown per rank, collective skew and per-unit timer spreads."""
    times = data.step_times
    notes: list[str] = []
    facts: list[Fact] = []
    views: list[Any] = []
    if times.empty:
        notes.append("No step times: the traces hold no ProfilerStep ranges and there are no timers.")
    else:
        source = str(times["source"].iloc[0])
        n_steps = times["step"].nunique()
        notes.append(f"Step times of {n_steps} step(s) from "
                     + ("the recorder's timers (every step of the run)." if source == steps_data.SOURCE_TIMERS
                        else "the profiled steps only (no timers in these inputs)."))
        if not data.step_spread.empty and times["rank"].nunique() > 1:  # one rank has no spread over ranks
            worst = data.step_spread.sort_values("spread_ms", ascending=False).iloc[0]
            facts.append(Fact(label="largest rank spread", value=format_ms(float(worst["spread_ms"])),
                              hint=f"step {int(worst['step'])}, slowest rank {int(worst['slowest_rank'])}"))
        for label, value in step_time_figures(data.summary):
            headline = value == data.summary.step_time_ms
            facts.append(Fact(label=label, value=format_ms(value),
                              hint="the headline's step time" if headline else ""))
        many = times["rank"].nunique() > HEATMAP_RANKS
        if many:
            notes.append(f"{times['rank'].nunique()} ranks: step time and exposed communication are drawn as "
                         "rank x step heat maps (a cell per rank and step) instead of one box or bar per rank.")
            views.append(plots.rank_step_heatmap(times, value="ms", label="step time",
                                                 title="step time per rank and step", cmap="viridis"))
        else:
            views.append(plots.step_time_spread(times))
    rank_times = data.rank_step_times
    if rank_times is not None and not rank_times.empty and rank_times["rank"].nunique() > HEATMAP_RANKS:
        # each analysed step's exposed communication moved to the run's clock, as the summary's per rank is
        heat = rank_times.assign(exposed_ms=rank_times["exposed_comm_ns"] * comm_clock_scale(data.summary.bound)
                                 / NS_PER_MS)
        views.append(plots.rank_step_heatmap(heat, value="exposed_ms", label="exposed communication",
                                             title="exposed communication per rank and analysed step",
                                             cmap="Reds"))
        rank_times = None  # the per-rank bars below would be a thousand bars
    breakdown = steps_data.step_breakdown(rank_times)
    if not breakdown.empty:
        views.append(plots.rank_bars(breakdown, part="part", colors=steps_data.STEP_PART_COLORS, stacked=True,
                                     title="where each rank's traced step went (training threads, mean per "
                                           "analysed step, as traced)"))
    # beyond HEATMAP_RANKS the heat map above shows them (rank_times is None then): no bar per rank
    waits = steps_data.rank_waits(rank_times, rank_exposed_ms(data.summary), clock_scale(data.summary.bound)) \
        if rank_times is not None else pd.DataFrame()
    if not waits.empty:
        views.append(plots.rank_bars(waits, part="what", stacked=False,
                                     colors={steps_data.EXPOSED_PER_RANK: "#d62728",
                                             steps_data.LATE_PER_RANK: "#9467bd"},
                                     title="exposed communication (the summary's per-rank figure) and lateness per rank"))
    points = steps_data.skew_points(data.skew, data.rank_step_times)
    if not points.empty:
        worst = points.sort_values("skew_ms", ascending=False).iloc[0]
        facts.append(Fact(label="largest collective skew", value=format_ms(float(worst["skew_ms"])),
                          hint=f"{worst['comm']} of {worst['unit_name']}, step {int(worst['step'])}, "
                               f"last rank {int(worst['late_rank'])}"))
        views.append(plots.skew_scatter(points, title="collective start skew across ranks"))
    unit_times = steps_data.unit_timer_times(data.unit_passes, list(data.unit_colors))
    if not unit_times.empty:
        units = list(dict.fromkeys(unit_times["unit_name"]))
        views.append(plots.unit_timer_boxes(
            unit_times, units, title="each unit's own forward / backward work (nested units, gathers and reductions "
                                     "excluded; timers, unprofiled steps): the unit table's timers columns"))
    return Section(key="steps", title="Across steps and ranks", howto=HOWTO_STEPS, notes=notes, facts=facts,
                   views={"steps": views} if views else {})
