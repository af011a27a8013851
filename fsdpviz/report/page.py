"""Report data -> a :class:`~fsdpviz.report.html.Page`: section texts, facts and plots.

The words of the page live here: each section's title and "how to read this" note, the headline
facts, and the notes that say what a view leaves out (capped detail, missing FSDP labels). The
plots come from :mod:`fsdpviz.report.plots`; numbers come formatted from the data, never computed.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from fsdpviz.analysis.records import NO_FSDP_LABELS, NO_UNITS_FOUND
from fsdpviz.report import activity, plots
from fsdpviz.report.html import Fact, LegendItem, Page, Section
from fsdpviz.report.stepsection import steps_section
from fsdpviz.report.style import (
    EXPOSED_COLOR,
    bytes_scale,
    format_bytes,
    format_ms,
    format_pct,
)
from fsdpviz.report.unitsection import units_section
from fsdpviz.report.unitview import unit_label

if TYPE_CHECKING:
    from fsdpviz.report.data import ReportData
    from fsdpviz.report.stepview import StepView

HOWTO_HEADLINE = (
    "Averages over the analysed steps and ranks. Overlap is the share of communication time that ran "
    "while the same rank was computing; exposed communication is the rest, time in which the rank "
    "waited for data. Lower exposed time is better."
)
HOWTO_TIMELINE_UNITS = (
    "One step, one row per rank and lane (CPU thread or GPU stream), time from the step's start on the "
    "earliest rank. Each bar is one piece of an FSDP unit's work, coloured by unit (same colour on "
    "every plot); backward bars are hatched. A red strip under a collective marks the part of it that "
    "no computation covered (exposed). Hover a bar for unit, kind, phase, times, bytes and prefetch "
    "lead. Scroll to zoom, drag to pan: all ranks and the memory curve below follow."
)
HOWTO_TIMELINE_LANES = (
    "One step, one row per rank and lane (CPU thread or GPU stream), time from the step's start on the "
    "earliest rank. Bars show when a lane was busy, by category; a red strip marks communication that "
    "no computation on the same rank covered (exposed). Hover a bar for the longest event in it. "
    "Scroll to zoom, drag to pan: all ranks and the memory curve below follow."
)
HOWTO_MEMORY = (
    "The memory curve under each Gantt shows allocated (solid) and reserved (dashed) memory of the "
    "drawn ranks on the same time axis."
)
NOTE_NO_UNITS = (
    "Per-unit views need FSDP labels in the trace: FSDP2 writes them itself; for FSDP1 and "
    "ZeRO-3, record with `fsdpviz record`. This trace has none, so the page shows whole-step "
    "communication overlap, lanes and memory only."
)


def headline_section(data: ReportData) -> Section:
    """Framework, world size, steps, step time, overlap, exposed communication, peak memory."""
    s = data.summary
    ov, mem = s.overlap, s.memory
    # The summary's communication numbers are already per step (averaged over ranks).
    exposed_per_step = _num(ov.exposed_comm_ms)
    comm_per_step = _num(ov.comm_ms)
    step_ms = _num(s.step_time_ms)
    facts = [
        Fact(label="framework", value=s.framework,
             hint="DistributedDataParallel, not FSDP: no FSDP units" if s.framework == "ddp" else ""),
        Fact(label="world size", value=str(s.world_size),
             hint=f"{len(s.ranks)} rank(s) in the traces" if s.ranks else ""),
        Fact(label="steps analysed", value=_steps_text(s.steps)),
        Fact(label="step time", value=format_ms(step_ms), hint="mean over analysed steps and ranks"),
        Fact(label="overlap", value=format_pct(ov.overlap_pct), hint="communication hidden behind computation"),
        Fact(label="exposed comm / step", value=format_ms(exposed_per_step),
             hint=(f"{100 * exposed_per_step / step_ms:.1f} % of the step; " if math.isfinite(step_ms) and step_ms
                   else "") + f"of {format_ms(comm_per_step)} communication"),
        Fact(label="peak allocated", value=format_bytes(mem.peak_allocated_bytes) or "n/a"),
        Fact(label="peak reserved", value=format_bytes(mem.peak_reserved_bytes or None) or "n/a",
             hint="the CPU allocator reports no reserved memory"
             if mem.peak_allocated_bytes and not mem.peak_reserved_bytes else ""),
    ]
    # The summary's own "units is empty" notes are said better by NOTE_NO_UNITS below.
    notes = list(data.notes) + [_sentence(n.text) for n in s.notes if n.code not in (NO_FSDP_LABELS, NO_UNITS_FOUND)]
    if not data.has_units and s.framework != "ddp":  # DDP has no units to label: its note says so
        notes.append(NOTE_NO_UNITS)
    return Section(key="headline", title="Headline", howto=HOWTO_HEADLINE, facts=facts, notes=notes,
                   bullets=list(data.findings))


def _num(value: object) -> float:
    """A summary number (None where it does not exist) as a float, NaN for None."""
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _sentence(text: str) -> str:
    text = str(text).strip()
    return (text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")) if text else text


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "none"
    if len(steps) > 2 and steps == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]}–{steps[-1]}"
    return ", ".join(str(x) for x in steps)


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
        items.append(LegendItem(label="backward (hatched)", color="#777777", pattern="hatched"))
        legend.append(("units tabs", items))
    if any(v.kind == "lanes" for v in data.views):
        legend.append(("all-events tabs" if has_units_view else "bars",
                       [LegendItem(label=cat, color=activity.CATEGORY_COLORS[cat]) for cat in activity.CATEGORIES]))
    legend.append(("red strips", [LegendItem(label="exposed communication", color=EXPOSED_COLOR, pattern="strip")]))
    howto = (HOWTO_TIMELINE_UNITS if has_units_view else HOWTO_TIMELINE_LANES) + " " + HOWTO_MEMORY
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
        colors = {unit_label(u): c for u, c in data.unit_colors.items()}
    else:
        hover = [("category", "category"), ("name", "longest event"), ("start_ms", "start (ms)"),
                 ("dur_ms", "duration (ms)"), ("events", "events")]
        colors = activity.CATEGORY_COLORS
    gantt = plots.gantt(view.rows, view.segments, view.exposed, title=view.title, colors=colors,
                        color_by=view.color_by, hover=hover, window_ms=window_ms)
    memory_view = None
    if with_memory and not view.memory.empty:
        peak = float(view.memory[["allocated_bytes", "reserved_bytes"]].max().max())
        divisor, unit = bytes_scale(peak)
        ranks = sorted(int(r) for r in view.memory["rank"].unique())
        shown = "rank " + ", ".join(str(r) for r in ranks) if len(ranks) < 9 else f"{len(ranks)} ranks"
        memory_view = plots.memory_curve(view.memory, view.peaks, divisor=divisor, unit=unit,
                                         title=f"memory during {view.choice.label} ({shown})")
    return plots.timeline_layout(gantt, memory_view)


def build_page(data: ReportData) -> Page:
    """All sections, in reading order."""
    sections = [headline_section(data), timeline_section(data)]
    units = units_section(data)
    if units is not None:
        sections.append(units)
    sections.append(steps_section(data))
    return Page(title=data.title, subtitle=data.subtitle,
                meta=[Fact(label=k, value=v) for k, v in data.meta], sections=sections)
