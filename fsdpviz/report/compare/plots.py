"""Plots of the compare page: unit structure strips, per-run Gantts on one time axis, memory overlay.

The Gantt itself is the report's (:func:`fsdpviz.report.timeline.figure.gantt`); this module adds what only a
comparison needs. Each plot is rendered to its bokeh model here so that every time axis of the
page can share one bokeh range (:func:`share_time_axis`): zooming one run's Gantt zooms all of them
and the memory overlay, and equal lengths on screen are equal durations in every run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import holoviews as hv
import pandas as pd

from fsdpviz.formatting import bytes_scale, format_bytes
from fsdpviz.report.charts import tidy_toolbar
from fsdpviz.report.compare.data import RunView
from fsdpviz.report.timeline import events, figure
from fsdpviz.report.units.plots import unit_bars

STRIP_ROW_PX = 46
# The report's Gantt keeps this left border for its lane labels; the memory overlay uses the same so
# that its time axis lines up with the Gantts above it.
MIN_BORDER_LEFT_PX = 190
UNIT_HOVER = [("unit_name", "unit"), ("kind", "kind"), ("phase", "phase"), ("start_ms", "start (ms)"),
              ("dur_ms", "duration (ms)"), ("bytes_text", "bytes"), ("lead_text", "prefetch lead"), ("lane", "lane")]
LANE_HOVER = [("category", "category"), ("lane", "lane"), ("name", "longest event"), ("start_ms", "start (ms)"),
              ("dur_ms", "duration (ms)"), ("events", "events")]


def structure_strips(runs: Sequence[RunView]) -> hv.Overlay:
    """One horizontal bar per run, its units laid end to end by unsharded parameter bytes."""
    total = max((float(r.units["x1_bytes"].max()) for r in runs if not r.units.empty), default=0.0)
    divisor, unit = bytes_scale(total)
    frames = []
    for i, run in enumerate(runs):
        if run.units.empty:
            continue
        frames.append(run.units.assign(
            strip_bytes=run.units["x0_bytes"] / divisor, run_y=i + 0.15, x1=run.units["x1_bytes"] / divisor,
            y1=i + 0.85, run=run.label, bytes_text=[format_bytes(b) for b in run.units["param_bytes"]],
            numel_text=[f"{int(n):,}" for n in run.units["param_numel"]]))
    x_dim = hv.Dimension("strip_bytes", label="unsharded parameters, units in forward order", unit=unit)
    y_dim = hv.Dimension("run_y", label="run")
    ticks = [(i + 0.5, r.label) for i, r in enumerate(runs)]
    if not frames:
        return hv.Overlay([hv.Rectangles([], kdims=[x_dim, y_dim, "x1", "y1"])])
    data = pd.concat(frames, ignore_index=True)
    rects = hv.Rectangles(data, kdims=[x_dim, y_dim, "x1", "y1"],
                          vdims=["unit", "run", "bytes_text", "numel_text", "color"]).opts(
        color="color", line_color="white", line_width=1.5, tools=["hover"],
        hover_tooltips=[("run", "@run"), ("unit", "@unit"), ("unsharded", "@{bytes_text}"),
                        ("parameters", "@{numel_text}")])
    # Names inside the bars that are wide enough to hold them.
    wide = data[(data["x1"] - data["strip_bytes"]) >= 0.06 * (data["x1"].max() or 1)]
    labels = hv.Labels(wide.assign(mid=(wide["strip_bytes"] + wide["x1"]) / 2, ymid=(wide["run_y"] + wide["y1"]) / 2),
                       kdims=[hv.Dimension("mid"), hv.Dimension("ymid")], vdims=["unit"]).opts(
        text_font_size="9pt", text_color="white", text_font_style="bold")
    return (rects * labels).opts(hv.opts.Overlay(
        title="unit structure: each run's units by unsharded parameter bytes", responsive=True,
        height=70 + STRIP_ROW_PX * len(runs), yticks=ticks, invert_yaxis=True, ylim=(0, len(runs)),
        show_legend=False, hooks=[tidy_toolbar], tools=["reset"], xlabel=x_dim.pprint_label, ylabel=""))


def run_gantt(run: RunView) -> Any:
    """The run's representative step as the report draws it, in the comparison's unit colours."""
    view = run.view
    if view is None:
        return None
    units = view.kind == "units"
    colors = run.unit_colors if units else events.CATEGORY_COLORS
    return figure.gantt(view.rows, view.segments, view.exposed, title=f"{run.label}: {view.title}",
                       colors=colors, color_by=view.color_by, hover=UNIT_HOVER if units else LANE_HOVER)


def memory_overlay(runs: Sequence[RunView]) -> Any | None:
    """Allocated memory during each run's representative step, one curve per run (a bokeh figure,
    like the report's own time-line figures)."""
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    shown = [r for r in runs if not r.memory.empty]
    if not shown:
        return None
    peak = max(float(r.memory["allocated_bytes"].max()) for r in shown)
    divisor, unit = bytes_scale(peak)
    fig = figure(title="allocated memory during each run's representative step (the rank with the highest peak)",
                 height=280, sizing_mode="stretch_width", tools="xpan,xwheel_zoom,box_zoom,reset,save",
                 active_scroll="xwheel_zoom", active_drag="xpan", output_backend="canvas",
                 min_border_left=MIN_BORDER_LEFT_PX, x_axis_label="time since step start (ms)",
                 y_axis_label=f"allocated ({unit})")
    fig.toolbar.logo = None
    fig.toolbar.autohide = True
    renderers = []
    for run in shown:
        source = ColumnDataSource({"t_ms": run.memory["t_ms"].to_numpy(float),
                                   "memory": run.memory["allocated_bytes"].to_numpy(float) / divisor,
                                   "run": [run.label] * len(run.memory)})
        renderers.append(fig.step("t_ms", "memory", source=source, mode="after", line_width=1.8, color=run.color,
                                  legend_label=f"{run.label} (rank {run.memory_rank})"))
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("run", "@run"), ("time (ms)", "@{t_ms}{0.000}"),
                                                           (f"allocated ({unit})", "@{memory}{0.000}")]))
    fig.legend.location = "top_right"
    fig.legend.background_fill_alpha = 0.7
    return fig


def run_bars(groups: pd.DataFrame, metric: str, *, title: str, unit: str, colors: Mapping[str, str]) -> hv.Bars | None:
    """Grouped bars of one per-unit metric: one group per unit group, one bar per run."""
    rows = groups[(groups["metric"] == metric) & groups["value"].notna()]
    if rows.empty:
        return None
    names = list(dict.fromkeys(groups.sort_values("order", kind="stable")["group"]))
    divisor, shown_unit = bytes_scale(float(rows["value"].max())) if unit == "bytes" else (1.0, unit)
    data = pd.DataFrame({"unit_name": rows["group"], "metric": rows["label"],
                         "value": rows["value"].astype(float) / divisor})
    return unit_bars(data, names, value="value",
                     value_dim=hv.Dimension(f"cmp_{metric}", label=title, unit=shown_unit),
                     title=f"{title} per unit group, by run", colors=dict(colors))


def to_bokeh(view: Any) -> Any:
    """Render a holoviews object to its bokeh model (a bokeh model passes through)."""
    from bokeh.model import Model

    return view if isinstance(view, Model) else hv.render(view, backend="bokeh")


def share_time_axis(models: Sequence[Any], end_ms: float) -> None:
    """Give every plot of ``models`` one x range from 0 to ``end_ms`` (linked zoom and pan)."""
    from bokeh.models import Plot, Range1d

    shared = Range1d(start=0.0, end=max(end_ms, 1e-3) * 1.01)
    for model in models:
        for plot in model.select({"type": Plot}):
            plot.x_range = shared
