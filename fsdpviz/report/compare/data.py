"""Everything the compare page shows, as tables: built first, rendered by :mod:`fsdpviz.report.compare.page`.

Per run, the representative step comes from the report's own page data (``prepare_report``: the
median step, its per-unit Gantt and its memory curve), recoloured so that a module keeps one colour
in every run (``compare_units.color_slots``: ``blocks.2`` and ``blocks.2+3`` share a colour).
Across runs: the unit structure strip (each run's units laid end to end by unsharded bytes), the
per-unit comparison rows and the memory curves of all runs on one time axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import pandas as pd

from fsdpviz.analysis.compare.model import GROUP_METRICS, Comparison, unit_index
from fsdpviz.analysis.compare.units import color_slots, group_values
from fsdpviz.analysis.pipeline import LabelledRun
from fsdpviz.formatting import format_bytes
from fsdpviz.report.style import OTHER_COLOR, unit_color
from fsdpviz.report.timeline.steps import MAX_PAGE_SEGMENTS
from fsdpviz.report.timeline.units import NO_UNIT
from fsdpviz.report.timeline.view import StepView
from fsdpviz.whatif.saved import SavedPrediction, load_predictions

# One colour per run (no red: red means exposed communication on every page).
RUN_PALETTE: Final = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#72b7b2", "#9d755d", "#eeca3b", "#ff9da6")
# Per-unit comparison rows: (summary metric, row label, unit).


@dataclass(kw_only=True, slots=True)
class RunView:
    """One run's part of the compare page."""

    label: str
    color: str  # the run's colour (memory overlay, per-unit bars)
    view: StepView | None  # the representative step's Gantt data (units view when the run has units)
    unit_colors: dict[str, str]  # unit -> colour, shared across runs by module
    memory_rank: int | None  # the rank whose memory curve is overlaid (highest peak in the step)
    memory: pd.DataFrame  # t_ms, allocated_bytes, reserved_bytes of that rank in that step
    units: pd.DataFrame  # unit, order, param_bytes, param_numel, x0_bytes, x1_bytes, color


@dataclass(kw_only=True, slots=True)
class CompareData:
    """The content of the compare page."""

    comparison: Comparison
    runs: list[RunView]
    groups: pd.DataFrame  # group, order, metric, label, value (None: no unit of that run in the group)
    duration_ms: float  # the longest representative step: the common time axis
    notes: list[str] = field(default_factory=list)
    predictions: list[tuple[str, SavedPrediction]] = field(default_factory=list)  # (run label, saved prediction)

    @property
    def segment_count(self) -> int:
        return sum(len(r.view.segments) + len(r.view.exposed) for r in self.runs if r.view is not None)


def run_colors(labels: Sequence[str]) -> dict[str, str]:
    """Each run's colour, in order."""
    return {label: RUN_PALETTE[i % len(RUN_PALETTE)] for i, label in enumerate(labels)}


def _unit_strip(run: LabelledRun, colors: dict[str, str]) -> pd.DataFrame:
    units = run.summary.units
    frame = pd.DataFrame({
        "unit": [u.name for u in units],
        "order": [u.order for u in units],
        "param_bytes": [u.param_bytes or 0 for u in units],
        "param_numel": [u.param_numel or 0 for u in units],
    }).sort_values("order", kind="stable").reset_index(drop=True)
    frame["x1_bytes"] = frame["param_bytes"].cumsum()
    frame["x0_bytes"] = frame["x1_bytes"] - frame["param_bytes"]
    frame["color"] = [colors.get(u, OTHER_COLOR) for u in frame["unit"]]
    return frame


def _memory_of(view: StepView | None) -> tuple[int | None, pd.DataFrame]:
    empty = pd.DataFrame({"t_ms": pd.Series(dtype="float64"), "allocated_bytes": pd.Series(dtype="float64"),
                          "reserved_bytes": pd.Series(dtype="float64")})
    if view is None or view.memory.empty:
        return None, empty
    peaks = view.memory.groupby("rank")["allocated_bytes"].max()
    rank = int(peaks.index.to_numpy()[peaks.to_numpy().argmax()])
    mine = view.memory[view.memory["rank"] == rank]
    return rank, mine[["t_ms", "allocated_bytes", "reserved_bytes"]].reset_index(drop=True)


def group_rows(comparison: Comparison) -> pd.DataFrame:
    """Long table of the per-unit comparison: one row per group, metric and run."""
    rows = []
    for group in comparison.match.groups:
        for run in comparison.runs:
            values = group_values(group, run.label, unit_index(run))
            for metric, _, _ in GROUP_METRICS:
                rows.append({"group": group.name, "order": group.order, "metric": metric, "label": run.label,
                             "value": values.get(metric)})
    return pd.DataFrame(rows, columns=["group", "order", "metric", "label", "value"])


def prepare_compare(runs: Sequence[LabelledRun], comparison: Comparison,
                    max_segments: int = MAX_PAGE_SEGMENTS) -> CompareData:
    """The compare page's data from each run's pipeline result."""
    from fsdpviz.report.data import VIEW_MEDIAN, prepare_report

    labels = comparison.labels
    slots = color_slots(comparison.match, labels)
    palette = run_colors(labels)
    # each run's one Gantt: a third of its share of the page's span budget (a light page: the
    # compare page is for reading the differences, each run's report has the detail)
    budget = max(1_000, max_segments // max(len(runs), 1) // 3)
    views: list[RunView] = []
    notes: list[str] = []
    for run in runs:
        colors = {u: unit_color(u, slot) for u, slot in slots.get(run.label, {}).items()}
        colors[NO_UNIT] = OTHER_COLOR
        # only the median step's tab: the compare page draws nothing else of the report
        data = prepare_report(run.result, max_segments=budget, views=(VIEW_MEDIAN,))
        view = data.views[0] if data.views else None
        if view is None:
            notes.append(f"{run.label}: the traces hold no ProfilerStep ranges, so there is no step to draw.")
        else:
            notes.extend(f"{run.label}: {n}" for n in view.notes)
            for unit in view.segments.get("unit", pd.Series(dtype=str)).astype(str).unique():
                colors.setdefault(unit, unit_color(unit, None))
        rank, memory = _memory_of(view)
        views.append(RunView(label=run.label, color=palette[run.label], view=view, unit_colors=colors,
                             memory_rank=rank, memory=memory, units=_unit_strip(run, colors)))
    duration = max((v.view.choice.duration_ms for v in views if v.view is not None), default=0.0)
    predictions = [(run.label, p) for run in runs for p in load_predictions(run.result.traces.run_dir)]
    return CompareData(comparison=comparison, runs=views, groups=group_rows(comparison), duration_ms=duration,
                       notes=notes, predictions=predictions)


def describe_bytes(value: Any) -> str:
    """Bytes for a table cell ("" when unknown)."""
    return format_bytes(float(value)) if isinstance(value, (int, float)) else ""
