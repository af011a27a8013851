"""The "Timeline of one step" section: one tab per drawn step (the per-unit Gantt, or all events),
each a Gantt with the memory curve of the drawn ranks under it on the same time axis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsdpviz.analysis.memory_categories import TITLES
from fsdpviz.formatting import bytes_scale
from fsdpviz.report.html import LegendItem, Section
from fsdpviz.report.style import EXPOSED_COLOR, MEMORY_CATEGORY_COLORS
from fsdpviz.report.timeline import events, figure
from fsdpviz.report.timeline.units import LOOP_PART_COLORS, unit_label

if TYPE_CHECKING:
    from fsdpviz.report.data import ReportData
    from fsdpviz.report.timeline.view import StepView

# What a lane is: a GPU run's lanes are its streams and CPU threads; a CPU run has threads only (the
# compute thread, and gloo's threads that run the collectives).
LANES_GPU = "CPU thread or GPU stream"
LANES_CPU = "the compute thread or one of gloo's threads"
HOWTO_TIMELINE_UNITS = (
    "One step, one row per rank and lane ({lanes}), time from the step's start on the "
    "earliest rank. Each bar is one piece of an FSDP unit's work, coloured by unit (same colour on "
    "every plot); backward bars are hatched. A red strip under a collective marks the part of it that "
    "no computation covered (exposed). Hover a bar for unit, kind, phase, times, bytes and prefetch "
    "lead. Scroll to zoom, drag to pan: all ranks and the memory curve below follow."
)
HOWTO_TIMELINE_LANES = (
    "One step, one row per rank and lane ({lanes}), time from the step's start on the "
    "earliest rank. Bars show when a lane was busy, by category; a red strip marks communication that "
    "no computation on the same rank covered (exposed). Hover a bar for the longest event in it. "
    "Scroll to zoom, drag to pan: all ranks and the memory curve below follow."
)
HOWTO_MEMORY = (
    "The memory curve under each Gantt shows allocated (solid) and reserved (dashed) memory of the "
    "drawn ranks on the same time axis. Under it, the allocated memory of the drawn rank with the "
    "highest peak, stacked by category: sharded parameters, optimizer state and gradients (what FSDP "
    "shards), unsharded parameters and gradients, communication buffers, activations and the rest, "
    "read off the allocator's own allocations and frees."
)


def timeline_section(data: ReportData) -> Section:
    """Gantt + memory of the representative step(s), one tab per view."""
    views = {}
    notes: list[str] = []
    has_units_view = any(v.kind == "units" for v in data.views)
    for view in data.views:
        tab = f"{view.choice.label} · {'units' if view.kind == 'units' else 'all events'}"
        views[tab] = timeline_plot(view, data)
        notes.extend(view.notes)
    legend: list[tuple[str, list[LegendItem]]] = []
    if has_units_view:
        items = [LegendItem(label=unit_label(unit), color=color) for unit, color in data.unit_colors.items()]
        drawn = {str(n) for v in data.views if v.kind == "units" for n in v.segments.get("unit_name", [])}
        items += [LegendItem(label=label, color=color) for label, color in LOOP_PART_COLORS.items() if label in drawn]
        items.append(LegendItem(label="backward (hatched)", color="#777777", pattern="hatched"))
        legend.append(("units tabs", items))
    if any(v.kind == "events" for v in data.views):
        legend.append(("all-events tabs" if has_units_view else "bars",
                       [LegendItem(label=cat, color=events.CATEGORY_COLORS[cat]) for cat in events.CATEGORIES]))
    legend.append(("red strips", [LegendItem(label="exposed communication", color=EXPOSED_COLOR, pattern="strip")]))
    lanes = LANES_CPU if data.summary.device == "cpu" else LANES_GPU
    howto = (HOWTO_TIMELINE_UNITS if has_units_view else HOWTO_TIMELINE_LANES).format(lanes=lanes) + " " + HOWTO_MEMORY
    if not data.views:
        notes.append("The traces hold no ProfilerStep ranges, so there is no step to draw.")
    elif all(v.memory.empty for v in data.views):
        notes.append("No memory curve: the traces hold no allocator samples ([memory] events). Record with "
                     "profile_memory=True (fsdpviz record does by default) to see memory over the step.")
    return Section(key="timeline", title="Timeline of one step", howto=howto, notes=notes, legend=legend,
                   views=views)


def timeline_plot(view: StepView, data: ReportData, *, window_ms: tuple[float, float] | None = None,
                  with_memory: bool = True) -> Any:
    """The Gantt of one time-line tab with the memory curve under it (bokeh).

    ``window_ms`` (start, end in ms since the step's origin) zooms the opened view onto part of
    the step; the memory curve follows. ``with_memory=False`` leaves the curve out. Both serve
    figures of one detail (docs/concepts.md); the report page shows whole steps with memory.
    """
    if view.kind == "units":
        # The lane is the row's label: no hover field for it (each field is a column on the page).
        hover = [("unit_name", "unit"), ("kind", "kind"), ("phase", "phase"), ("start_ms", "start (ms)"),
                 ("dur_ms", "duration (ms)"), ("bytes_text", "bytes"), ("lead_text", "prefetch lead")]
        colors = {**{unit_label(u): c for u, c in data.unit_colors.items()}, **LOOP_PART_COLORS}
    else:
        hover = [("category", "category"), ("name", "longest event"), ("start_ms", "start (ms)"),
                 ("dur_ms", "duration (ms)"), ("events", "events")]
        colors = events.CATEGORY_COLORS
    gantt = figure.gantt(view.rows, view.segments, view.exposed, title=view.title, colors=colors,
                        color_by=view.color_by, hover=hover, window_ms=window_ms)
    memory_view = None
    if with_memory and not view.memory.empty:
        peak = float(view.memory[["allocated_bytes", "reserved_bytes"]].max().max())
        divisor, unit = bytes_scale(peak)
        ranks = sorted(int(r) for r in view.memory["rank"].unique())
        shown = "rank " + ", ".join(str(r) for r in ranks) if len(ranks) < 9 else f"{len(ranks)} ranks"
        memory_view = figure.memory_curve(view.memory, view.peaks, divisor=divisor, unit=unit,
                                         title=f"memory during {view.choice.label} ({shown})")
    category_view = None
    if with_memory and view.categories is not None and not view.categories.empty:
        top = float(view.categories[list(MEMORY_CATEGORY_COLORS)].sum(axis=1).max())
        divisor, unit = bytes_scale(top)
        category_view = figure.category_stack(
            view.categories, divisor=divisor, unit=unit, colors=MEMORY_CATEGORY_COLORS,
            titles={c: f"{t} (unknown)" if c in view.category_unknown else t for c, t in TITLES.items()},
            title=f"allocated memory by category, rank {view.category_rank} (the highest peak drawn)")
    return figure.timeline_layout(gantt, memory_view, category_view)
