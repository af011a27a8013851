"""Plot data (pandas) -> holoviews objects. No I/O, no analysis: only marks, axes, colours, hovers.

Each function takes the tables built by :mod:`fsdpviz.report.unittable`, ``steptimes`` and friends
and returns a holoviews element or layout; :mod:`fsdpviz.report.html` renders them. The time-line
figures (Gantt + memory), which carry almost all of the page's data, are bokeh figures built by
:mod:`fsdpviz.report.gantt` (re-exported here); plots with another time base use other dimension
names so holoviews keeps their axes independent.

Text from traces (unit and lane names) reaches the browser only as canvas text (ticks, legends)
or as ``@field`` tooltips, which bokeh escapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import holoviews as hv
import holoviews.plotting.bokeh
import pandas as pd

from fsdpviz.report.gantt import gantt, memory_curve, timeline_layout

__all__ = ["gantt", "memory_curve", "rank_bars", "skew_scatter", "step_time_spread", "timeline_layout",
           "unit_bars", "unit_table", "unit_timer_boxes"]

# hv.extension() would also set up notebook comms; selecting the backend is all a file needs.
hv.Store.set_current_backend("bokeh")

TIME_DIM = hv.Dimension("time_ms", label="time since step start", unit="ms")


def _tidy_toolbar_hook(plot: Any, element: Any) -> None:
    plot.state.toolbar.autohide = True


STEP_MS_DIM = hv.Dimension("step_ms", label="step time", unit="ms")


def step_time_spread(times: pd.DataFrame) -> hv.Layout:
    """Box plots of step time: per step over ranks (left) and per rank over steps (right).

    With one rank or one step a box degenerates to a line, which still reads correctly."""
    data = times.assign(step_ms=times["ms"])
    by_step = hv.BoxWhisker(data, kdims=[hv.Dimension("step", label="step")], vdims=[STEP_MS_DIM]).opts(
        title="per step, spread over ranks", responsive=True, height=300, box_fill_color="#9ecae1",
        tools=["hover"], hooks=[_tidy_toolbar_hook], show_grid=True)
    by_rank = hv.BoxWhisker(data, kdims=[hv.Dimension("rank", label="rank")], vdims=[STEP_MS_DIM]).opts(
        title="per rank, spread over steps", responsive=True, height=300, box_fill_color="#c6dbef",
        tools=["hover"], hooks=[_tidy_toolbar_hook], show_grid=True)
    return hv.Layout([by_step, by_rank]).cols(2).opts(hv.opts.Layout(shared_axes=True, merge_tools=True))


UNIT_DIM = hv.Dimension("unit_name", label="unit (forward order)")


def _metric_major(frame: pd.DataFrame, group: str, groups: Sequence[str], x: str,
                  xs: Sequence[str]) -> pd.DataFrame:
    """Rows ordered by bar group, then x: holoviews maps a grouped bar chart's colours by row
    position, and gets them wrong for data in any other order (holoviews 1.23)."""
    g_order = {g: i for i, g in enumerate(groups)}
    x_order = {v: i for i, v in enumerate(xs)}
    keyed = frame.assign(_g=frame[group].map(g_order), _x=frame[x].map(x_order))
    return keyed.sort_values(["_g", "_x"], kind="stable").drop(columns=["_g", "_x"])


def _bar_width_px(n_units: int) -> int | None:
    """Plots get wider than the page when bars would become thinner than a few pixels."""
    return None if n_units <= 40 else 40 + 28 * n_units


def unit_bars(data: pd.DataFrame, units: Sequence[str], *, value: str, value_dim: hv.Dimension,
              title: str, colors: Mapping[str, str]) -> hv.Bars:
    """Grouped bars: one group per unit (forward order), one bar per metric."""
    metrics = [m for m in colors if m in set(data["metric"])] if not data.empty else []
    frame = _metric_major(data.rename(columns={value: value_dim.name}), "metric", metrics, "unit_name", units)
    bars = hv.Bars(frame, kdims=[UNIT_DIM, hv.Dimension("metric", label="metric")], vdims=[value_dim])
    width = _bar_width_px(len(units))
    opts: dict[str, Any] = {
        "title": title, "height": 320, "color": "metric", "cmap": {m: colors[m] for m in metrics},
        "multi_level": False, "xrotation": 90 if len(units) > 8 else 0, "tools": ["hover"],
        "show_legend": True, "legend_position": "top_right", "hooks": [_tidy_toolbar_hook],
        "show_grid": True, "line_alpha": 0,
    }
    if width is None:
        opts["responsive"] = True
    else:
        opts["width"] = width
    return bars.redim.values(unit_name=list(units), metric=metrics).opts(**opts)


def unit_table(source: Mapping[str, list], columns: Sequence[tuple[str, str, str | None]]) -> Any:
    """A sortable bokeh DataTable (text cells use the default formatter, which escapes)."""
    from bokeh.models import ColumnDataSource, DataTable, NumberFormatter, StringFormatter, TableColumn

    table_columns = []
    for field_name, title, fmt in columns:
        formatter = NumberFormatter(format=fmt, text_align="right") if fmt else StringFormatter()
        table_columns.append(TableColumn(field=field_name, title=title, formatter=formatter,
                                         width=70 if fmt else 180))
    n_rows = len(next(iter(source.values()))) if source else 0
    return DataTable(source=ColumnDataSource(dict(source)), columns=table_columns, sortable=True,
                     reorderable=False, index_position=None, sizing_mode="stretch_width",
                     height=min(40 + 25 * n_rows, 520))


RANK_DIM = hv.Dimension("rank_name", label="rank")


def _categorical_opts(n: int, title: str, height: int = 300) -> dict[str, Any]:
    opts: dict[str, Any] = {"title": title, "height": height, "xrotation": 90 if n > 16 else 0,
                            "tools": ["hover"], "hooks": [_tidy_toolbar_hook], "show_grid": True}
    width = _bar_width_px(n)
    if width is None:
        opts["responsive"] = True
    else:
        opts["width"] = width
    return opts


def rank_bars(data: pd.DataFrame, *, part: str, colors: Mapping[str, str], title: str,
              stacked: bool) -> hv.Bars:
    """Bars per rank (``rank``, ``part`` column, ``ms``), stacked or grouped by ``part``."""
    ranks = [str(r) for r in sorted(data["rank"].unique())]
    parts = [p for p in colors if p in set(data[part])]
    frame = _metric_major(data.assign(rank_name=data["rank"].astype(str), ms_value=data["ms"]),
                          part, parts, "rank_name", ranks)
    bars = hv.Bars(frame, kdims=[RANK_DIM, hv.Dimension(part, label=part)],
                   vdims=[hv.Dimension("ms_value", label="time per step", unit="ms")])
    return bars.redim.values(rank_name=ranks, **{part: parts}).opts(
        stacked=stacked, multi_level=False, color=part, cmap={p: colors[p] for p in parts}, line_alpha=0,
        legend_position="top_right", **_categorical_opts(len(ranks), title))


SKEW_COLORS = {"all_gather": "#f58518", "reduce_scatter": "#e45756", "all_reduce": "#72b7b2",
               "broadcast": "#4c78a8", "send_recv": "#9467bd", "all_to_all": "#8c564b",
               "reduce": "#bcbd22", "barrier": "#7f7f7f", "other": "#c7c7c7"}


def skew_scatter(points: pd.DataFrame, *, title: str) -> hv.Points:
    """Collectives: start time in the step (x) against how far apart ranks started them (y)."""
    comms = [c for c in SKEW_COLORS if c in set(points["comm"])] + \
        sorted(set(points["comm"]) - set(SKEW_COLORS))
    frame = points.assign(skew_step_ms=points["t_ms"], skew_value=points["skew_ms"])
    pts = hv.Points(frame, kdims=[hv.Dimension("skew_step_ms", label="collective start since step start",
                                               unit="ms"),
                                  hv.Dimension("skew_value", label="start skew across ranks", unit="ms")],
                    vdims=["comm", "unit_name", "phase", "step", "late_rank", "early_rank"])
    return pts.opts(
        color="comm", cmap={c: SKEW_COLORS.get(c, "#888888") for c in comms}, size=7, alpha=0.8,
        responsive=True, height=300, title=title, legend_position="top_right", show_grid=True,
        tools=["hover", "box_zoom", "wheel_zoom", "reset"], hooks=[_tidy_toolbar_hook],
        hover_tooltips=[("collective", "@comm"), ("unit", "@{unit_name}"), ("phase", "@phase"),
                        ("step", "@step"), ("skew (ms)", "@{skew_value}{0.000}"), ("last rank", "@{late_rank}"),
                        ("first rank", "@{early_rank}")])


def _x_factors_hook(factors: list[tuple[str, str]]) -> Any:
    """A hook putting a categorical x axis in the given order: holoviews' box plots sort nested
    categories (``blocks.10`` before ``blocks.2``, ``backward`` before ``forward``)."""
    def hook(plot: Any, element: Any) -> None:
        plot.state.x_range.factors = factors
    return hook


def timer_box_factors(times: pd.DataFrame, units: Sequence[str]) -> list[tuple[str, str]]:
    """The (unit, phase) boxes in the order drawn: units as given (forward order), forward before
    backward; only those with data."""
    present = set(zip(times["unit_name"].astype(str), times["phase"].astype(str)))
    return [(str(u), p) for u in units for p in ("forward", "backward") if (str(u), p) in present]


def unit_timer_boxes(times: pd.DataFrame, units: Sequence[str], *, title: str) -> hv.BoxWhisker:
    """Spread of each unit's forward and backward time over every timed step and rank (units in
    forward order, forward before backward)."""
    frame = times.assign(timer_ms=times["ms"])
    box = hv.BoxWhisker(frame, kdims=[UNIT_DIM, hv.Dimension("phase", label="phase")],
                        vdims=[hv.Dimension("timer_ms", label="time per step", unit="ms")])
    phases = [p for p in ("forward", "backward") if p in set(times["phase"])]
    opts = _categorical_opts(len(units) * max(len(phases), 1) // 2, title, height=320)
    opts["hooks"] = [*opts["hooks"], _x_factors_hook(timer_box_factors(times, units))]
    return box.redim.values(unit_name=list(units), phase=phases).opts(
        box_fill_color=hv.dim("phase").categorize({"forward": "#9ecae1", "backward": "#a1d99b"}),
        outlier_alpha=0.4, **opts)
