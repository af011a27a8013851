"""Compare data -> a :class:`~fsdpviz.report.html.Page`: the words, tables and plots of the compare page.

Sections, in reading order: the runs side by side (headline numbers with deltas and best marks,
settings, comparability notes), findings, unit structure, per-unit comparison, and the timelines
(one Gantt per run and the memory overlay on one shared time axis). Numbers come formatted from the
comparison; nothing is computed here.
"""

from __future__ import annotations

import math
from typing import Any

from fsdpviz.analysis.compare.model import HEADLINE_FIELDS, HeadlineField
from fsdpviz.formatting import format_bytes, format_ms, format_pct
from fsdpviz.report.compare import plots as compare_plots
from fsdpviz.report.compare.data import GROUP_METRICS, CompareData, describe_bytes, run_colors
from fsdpviz.report.html import HtmlTable, LegendItem, Page, Section, TableCell
from fsdpviz.report.style import EXPOSED_COLOR
from fsdpviz.whatif.saved import headline_value, not_predicted_why

HOWTO_HEADLINE = (
    "One column per run; the first run is the baseline, and the small line under a number is the "
    "difference to it. A star marks the best value of a row (shorter step, less exposed communication, "
    "less memory, more overlap); rows where neither direction is better have none, and a difference no larger "
    "than the runs' step-to-step spread (highest minus lowest step, shown under each time) gets none. Numbers are "
    "each run's figures exactly as its `fsdpviz summary` reports them: on the run's clock (the step of the timers' "
    "clean steps where the recorder timed them, else as traced), each rank's figure per step and the median over "
    "ranks."
)
HOWTO_FINDINGS = (
    "What differs between the runs and what the traces say about why, with the numbers behind each "
    "statement. A difference within the noise (5 % of the larger value, 2 standard errors, or 0.02 ms) or within the runs' "
    "step-to-step spread names no better run, and says which; runs on different clocks are not ranked on times."
)
HOWTO_STRUCTURE = (
    "How each run splits the model into FSDP units: each bar is one unit, as wide as its unsharded "
    "parameters. A unit's parameters are gathered together, so a wider unit means fewer, larger "
    "all-gathers and more memory while it is gathered. The same module has the same colour in every run."
)
HOWTO_UNITS = (
    "Units matched across runs by the parameters they hold (run.json's parameter names, else their sizes "
    "in forward order): each row holds the same parameters in every run (e.g. blocks.0 and blocks.1 of one "
    "run against blocks.0+1 or [blocks.0, blocks.1] of another); a row is named after a unit only when that "
    "unit holds exactly its parameters in every run. Times are per-unit medians per step, summed over the "
    "row's units, with each run's step-to-step spread; a star needs a difference beyond both spreads "
    "(beyond the one known, where a run's is unknown). "
    "\"in X\" means the run holds those parameters inside its unit X and has no separate number for them."
)
HOWTO_TIMELINES = (
    "Each run's median step, one Gantt per run, all on the same time axis from the step's start: "
    "zoom or pan one and the others follow, so equal lengths are equal durations. Bars are units' work "
    "by lane, coloured by module (the same colour in every run), backward hatched; a red strip marks "
    "communication no computation covered. Below, the allocated memory of each run over its step."
)


def _value_text(field: HeadlineField, value: Any) -> str:
    if value is None:
        return "n/a"
    if field.unit == "ms":
        return format_ms(float(value))
    if field.unit == "%":
        return format_pct(float(value))
    if field.unit == "bytes":
        return format_bytes(float(value)) or "n/a"
    return f"{value:,}"


def _delta_text(field: HeadlineField, delta: Any, base: Any) -> str:
    if delta is None or base is None:
        return ""
    if field.unit == "ms":
        text = f"{delta:+.3g} ms" if abs(delta) < 100 else f"{delta:+.0f} ms"
    elif field.unit == "%":
        return f"{delta:+.1f} points"
    elif field.unit == "bytes":
        text = ("+" if delta >= 0 else "−") + (format_bytes(abs(float(delta))) or "0 B")
    else:
        return f"{delta:+,}"
    if base:
        text += f" ({100 * delta / abs(base):+.0f} %)"
    return text


def _predicted_cells(data: CompareData, field: HeadlineField) -> list[TableCell]:
    """One cell per saved prediction: its value (against the run it was predicted from), or a dash that
    says why."""
    cells = []
    for label, p in data.predictions:
        value, base = headline_value(p, field.key)
        if value is None:
            cells.append(TableCell(text="—", hint=f"{not_predicted_why(p, field.key)} (predicted from {label})"))
            continue
        cells.append(TableCell(text=_value_text(field, value),
                               sub=_delta_text(field, value - base, base) if base is not None else "",
                               hint=f"predicted from {label}, not recorded" + (f"; {p.caveats}" if p.caveats else "")))
    return cells


def headline_table(data: CompareData) -> HtmlTable:
    """Numbers with deltas and best marks, then the settings that describe each run; saved
    predictions of the runs last, marked as predicted (never marked best: they were not recorded)."""
    c = data.comparison
    rows: list[list[TableCell]] = []
    for field in HEADLINE_FIELDS:
        values, deltas, best = c.values[field.key], c.deltas[field.key], set(c.best[field.key])
        if all(v is None for v in values) or (field.unit == "bytes" and all(not v for v in values)):
            continue  # e.g. reserved memory, which the CPU allocator does not report
        why = c.best_withheld.get(field.key, "")
        row = [TableCell(text=field.label, header=True, sub="no best mark: " + why if why else "",
                         hint=f"key: {field.key}")]
        spreads = c.spread.get(field.key)
        for i, value in enumerate(values):
            sub = _delta_text(field, deltas[i], values[0]) if i > 0 else "baseline" if value is not None else ""
            spread = spreads[i] if spreads is not None else None
            if spread is not None and value is not None:
                sub = f"{sub} · spread {format_ms(spread)}" if sub else f"spread {format_ms(spread)}"
            points = (c.spread_points.get(field.key) or [None] * len(values))[i]
            if points is not None and value is not None:
                sub = f"{sub} · spread {points:.1f} points" if sub else f"spread {points:.1f} points"
                spread = points
            row.append(TableCell(text=_value_text(field, value), sub=sub, best=i in best,
                                 hint=("best of this row" if i in best else "")
                                 + (" (spread: highest minus lowest step)" if spread is not None else "")))
        row.extend(_predicted_cells(data, field))
        rows.append(row)
    starts = {len(rows)}
    for label, texts in c.settings:
        rows.append([TableCell(text=label, header=True), *(TableCell(text=t) for t in texts),
                     *(TableCell(text="") for _ in data.predictions)])
    predicted = [f"{label}: {p.name} ({p.mark})" for label, p in data.predictions]
    return HtmlTable(columns=["", *c.labels, *predicted], rows=rows, group_starts=starts)


def headline_section(data: CompareData) -> Section:
    return Section(key="headline", title="Runs side by side", howto=HOWTO_HEADLINE,
                   notes=list(data.comparison.notes), tables=[headline_table(data)])


def findings_section(data: CompareData) -> Section:
    bullets = []
    for f in data.comparison.findings:
        text = f.message
        if f.evidence:
            text += f" Evidence: {f.evidence}."
        bullets.append(text)
    notes = [] if bullets else ["No finding: the runs have too few numbers in common to compare."]
    return Section(key="findings", title="Findings", howto=HOWTO_FINDINGS, bullets=bullets, notes=notes)


def structure_section(data: CompareData) -> Section:
    rows = []
    for run in data.runs:
        units = run.units
        listing = " · ".join(f"{u} {format_bytes(float(b)) or '?'}" for u, b in zip(units["unit"], units["param_bytes"]))
        rows.append([TableCell(text=run.label, header=True), TableCell(text=str(len(units))),
                     TableCell(text=describe_bytes(int(units["param_bytes"].sum())) if len(units) else "n/a"),
                     TableCell(text=listing or "no units", left=True)])
    table = HtmlTable(columns=["run", "units", "parameters (unsharded)", "units in forward order"], rows=rows)
    return Section(key="structure", title="Unit structure", howto=HOWTO_STRUCTURE, tables=[table],
                   views={"structure": compare_plots.structure_strips(data.runs)})


def _cell(unit: str, value: Any) -> str:
    if value is None:
        return "n/a"
    return describe_bytes(value) if unit == "bytes" else format_ms(float(value))


def units_table(data: CompareData) -> HtmlTable:
    c = data.comparison
    groups = {g.name: g for g in c.match.groups}
    rows: list[list[TableCell]] = []
    starts: set[int] = set()
    for name in dict.fromkeys(data.groups.sort_values("order", kind="stable")["group"]):
        group = groups[name]
        starts.add(len(rows))
        members = [TableCell(text=name, header=True)]
        for label in c.labels:
            units = group.members.get(label) or []
            held = group.held_by.get(label)
            members.append(TableCell(text=" + ".join(units) if units else f"in {held}" if held else "—",
                                     hint="" if units else "no unit of its own in this run"))
        rows.append(members)
        mine = data.groups[data.groups["group"] == name]
        for metric, title, unit in GROUP_METRICS:
            values = [mine[(mine["metric"] == metric) & (mine["label"] == lb)]["value"] for lb in c.labels]
            values = [None if v.empty or v.isna().all() else v.iloc[0] for v in values]
            if all(v is None for v in values):
                continue
            best = set(c.unit_best.get(name, {}).get(metric, []))
            spreads = c.unit_spread.get(name, {}).get(metric) or [None] * len(values)
            why = c.unit_best_withheld.get(name, {}).get(metric, "")
            rows.append([TableCell(text=f"  {title}", sub="no best mark: " + why if why else ""),
                         *(TableCell(text=_cell(unit, v), best=i in best,
                                     sub=f"spread {format_ms(s)}" if s is not None and v is not None else "",
                                     hint="group units' medians, summed" if unit == "ms" else "")
                           for i, (v, s) in enumerate(zip(values, spreads)))])
    return HtmlTable(columns=["unit group", *c.labels], rows=rows, group_starts=starts)


def units_section(data: CompareData) -> Section | None:
    c = data.comparison
    if not c.match.groups:
        return None
    notes = [f"{label} holds the whole model in one unit ({unit}): it has no per-unit rows; compare it on the "
             "headline numbers." for label, unit in c.match.whole_model.items()]
    odd = [g.name for g in c.match.groups if g.bytes_differ]
    if odd:
        notes.append(f"Rows whose units hold different parameter bytes across runs: {', '.join(odd)}.")
    colors = run_colors(c.labels)
    tabs = {}
    for metric, title, unit in GROUP_METRICS:
        if metric == "param_bytes":
            continue
        bars = compare_plots.run_bars(data.groups, metric, title=title, unit=unit, colors=colors)
        if bars is not None:
            tabs[title] = bars
    legend = [("runs", [LegendItem(label=lb, color=colors[lb]) for lb in c.labels])]
    return Section(key="units", title="Per-unit comparison", howto=HOWTO_UNITS, notes=notes, legend=legend,
                   tables=[units_table(data)], views=tabs)


def timelines_section(data: CompareData) -> Section:
    views = [g for g in (compare_plots.run_gantt(r) for r in data.runs) if g is not None]
    overlay = compare_plots.memory_overlay(data.runs)
    if overlay is not None:
        views.append(overlay)
    models = [compare_plots.to_bokeh(v) for v in views]
    if math.isfinite(data.duration_ms) and data.duration_ms > 0:
        compare_plots.share_time_axis(models, data.duration_ms)
    seen: dict[str, str] = {}
    for run in data.runs:
        if run.view is not None and run.view.kind == "units":
            for unit in run.units["unit"]:
                seen.setdefault(unit, run.unit_colors.get(unit, "#888888"))
    legend = [("units", [LegendItem(label=u, color=col) for u, col in seen.items()]
               + [LegendItem(label="backward (hatched)", color="#777777", pattern="hatched")]),
              ("red strips", [LegendItem(label="exposed communication", color=EXPOSED_COLOR, pattern="strip")])]
    notes = list(data.notes)
    if overlay is None:
        notes.append("No memory curve: none of the runs' traces hold allocator samples in the drawn step.")
    return Section(key="timelines", title="Timelines of the median step", howto=HOWTO_TIMELINES, notes=notes,
                   legend=legend, views={"timelines": models} if models else {})


def build_compare_page(data: CompareData, *, title: str, subtitle: str = "") -> Page:
    """All sections of the compare page, in reading order."""
    sections = [headline_section(data), findings_section(data), structure_section(data)]
    units = units_section(data)
    if units is not None:
        sections.append(units)
    sections.append(timelines_section(data))
    return Page(title=title, subtitle=subtitle, sections=sections)
