"""Plot data (pandas) -> holoviews objects. No I/O, no analysis: only marks, axes, colours, hovers.

Each function takes the tables built by :mod:`fsdpviz.report.timeline`, ``memory`` or
``unitview`` and returns a holoviews element or layout; :mod:`fsdpviz.report.html` renders them.
Time axes share one dimension name (``TIME_DIM``) so that holoviews links zoom and pan between the
Gantt and the memory curve of the same step; plots with another time base (per-step charts) use
other names so they stay independent.

Text from traces (unit and lane names) reaches the browser only as canvas text (ticks, legends)
or as ``@field`` tooltips, which bokeh escapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import holoviews as hv
import holoviews.plotting.bokeh
import pandas as pd

from fsdpviz.report.style import (
    ALLOCATED_COLOR,
    EXPOSED_COLOR,
    RESERVED_COLOR,
)

# hv.extension() would also set up notebook comms; selecting the backend is all a file needs.
hv.Store.set_current_backend("bokeh")

TIME_DIM = hv.Dimension("time_ms", label="time since step start", unit="ms")
LANE_DIM = hv.Dimension("lane_y", label="rank · lane")
ROW_HEIGHT_PX = 22
MIN_ROW_HEIGHT_PX = 11
MAX_GANTT_BODY_PX = 1100
MIN_GANTT_HEIGHT_PX = 160
# The left border fits lane labels such as "rank 12 · stream 7 (all-gather)", and is the same on
# every plot of a time-line column so that their time axes line up.
MIN_BORDER_LEFT_PX = 190

# Height of a span inside its lane row (rows are 1 apart), and of the exposed strip under it.
_SPAN_PAD = 0.12
_EXPOSED_TOP = 0.62


def _hatch_hook(plot: Any, element: Any) -> None:
    """Hatch backward spans (column ``hatch``): phase must read without relying on colour."""
    glyph = plot.handles.get("glyph")
    if glyph is not None and "hatch" in plot.handles["source"].data:
        glyph.hatch_pattern = {"field": "hatch"}
        glyph.hatch_color = "white"
        glyph.hatch_alpha = 0.7
        glyph.hatch_scale = 8


def _tidy_toolbar_hook(plot: Any, element: Any) -> None:
    plot.state.toolbar.autohide = True


def _timeline_hook(plot: Any, element: Any) -> None:
    """Same left border on every plot of a time-line column, so that their time axes line up."""
    _tidy_toolbar_hook(plot, element)
    plot.state.min_border_left = MIN_BORDER_LEFT_PX


def _gantt_height(n_rows: int) -> int:
    # Rows shrink (down to MIN_ROW_HEIGHT_PX) so that a many-rank Gantt still fits a screen or two.
    row_px = max(MIN_ROW_HEIGHT_PX, min(ROW_HEIGHT_PX, MAX_GANTT_BODY_PX // max(n_rows, 1)))
    return max(MIN_GANTT_HEIGHT_PX, 70 + row_px * n_rows)


def lane_ticks(rows: pd.DataFrame) -> list[tuple[float, str]]:
    """Y ticks at the middle of each lane row."""
    return [(float(r) + 0.5, str(label)) for r, label in zip(rows["row"], rows["label"])]


def gantt(rows: pd.DataFrame, segments: pd.DataFrame, exposed: pd.DataFrame, *, title: str,
          colors: Mapping[str, str], color_by: str, hover: Sequence[tuple[str, str]]) -> hv.Overlay:
    """Rectangles per lane row, coloured by ``color_by`` (a unit, or comm/compute), with the
    exposed pieces of collectives as a red strip in the lower part of their row.

    ``segments`` needs ``row``, ``x0_ms``, ``x1_ms``, ``color_by`` and the hover columns; an
    optional ``hatch`` column marks the phase. ``exposed`` needs ``row``, ``x0_ms``, ``x1_ms``,
    ``dur_ms`` and ``what``.
    """
    seg = segments.assign(time_ms=segments["x0_ms"], lane_y=segments["row"] + _SPAN_PAD,
                          y1=segments["row"] + 1 - _SPAN_PAD)
    vdims = [c for c in dict.fromkeys([color_by, *(c for c, _ in hover), "hatch"]) if c in seg.columns]
    spans = hv.Rectangles(seg, kdims=[TIME_DIM, LANE_DIM, "x1_ms", "y1"], vdims=vdims, label="spans")
    cmap = {key: colors.get(key, "#888888") for key in seg[color_by].astype(str).unique()}
    spans = spans.opts(
        color=color_by, cmap=cmap, line_alpha=0, fill_alpha=0.95,
        hover_tooltips=[(name, f"@{{{col}}}") for col, name in hover], tools=["hover"],
        hooks=[_hatch_hook], show_legend=False,
    )
    ex = exposed.assign(time_ms=exposed["x0_ms"], lane_y=exposed["row"] + _EXPOSED_TOP,
                        y1=exposed["row"] + 1 - _SPAN_PAD / 2)
    strips = hv.Rectangles(ex, kdims=[TIME_DIM, LANE_DIM, "x1_ms", "y1"], vdims=["dur_ms", "what"],
                           label="exposed communication")
    strips = strips.opts(
        color=EXPOSED_COLOR, line_color=EXPOSED_COLOR, fill_alpha=1.0, tools=["hover"],
        hover_tooltips=[("exposed", "@what"), ("exposed ms", "@{dur_ms}{0.000}")],
    )
    n_rows = len(rows)
    overlay = (spans * strips).opts(
        hv.opts.Overlay(
            title=title, responsive=True, height=_gantt_height(n_rows), xlabel=TIME_DIM.pprint_label,
            ylabel="", yticks=lane_ticks(rows), invert_yaxis=True, ylim=(0, max(n_rows, 1)),
            show_legend=False, hooks=[_timeline_hook], active_tools=["xwheel_zoom"],
            tools=["xpan", "xwheel_zoom", "box_zoom", "reset"],
        )
    )
    return overlay


def memory_curve(curves: pd.DataFrame, peaks: pd.DataFrame | None, *, divisor: float, unit: str,
                 title: str, labels_per_rank: int = 5) -> hv.Overlay:
    """Allocated (solid) and reserved (dashed) bytes over the step for each drawn rank, and each
    unit's peak marked with a point (and a text label for the highest ``labels_per_rank``)."""
    y_dim = hv.Dimension("memory", label="memory", unit=unit)
    elements: list[Any] = []
    ranks = sorted(int(r) for r in curves["rank"].unique()) if not curves.empty else []
    multi = len(ranks) > 1
    # Reserved memory only for the rank with the highest reserve: one dashed line reads, eight do not.
    reserve_rank = (int(curves.loc[curves["reserved_bytes"].idxmax(), "rank"])
                    if not curves.empty and (curves["reserved_bytes"] > 0).any() else None)
    for i, rank in enumerate(ranks):
        mine = curves[curves["rank"] == rank]
        alloc = pd.DataFrame({"time_ms": mine["t_ms"], "memory": mine["allocated_bytes"] / divisor})
        resv = pd.DataFrame({"time_ms": mine["t_ms"], "memory": mine["reserved_bytes"] / divisor})
        suffix = f" (rank {rank})" if multi else ""
        color = ALLOCATED_COLOR if not multi else _RANK_COLORS[i % len(_RANK_COLORS)]
        elements.append(hv.Curve(alloc, TIME_DIM, y_dim, label=f"allocated{suffix}").opts(
            interpolation="steps-post", color=color, line_width=1.8, tools=["hover"]))
        if rank == reserve_rank:  # None on CPU: its allocator reports no reserve, no flat zero line
            elements.append(hv.Curve(resv, TIME_DIM, y_dim, label=f"reserved{suffix}").opts(
                interpolation="steps-post", color=RESERVED_COLOR if not multi else color,
                line_dash="dashed", line_width=1.2, alpha=0.8))
    if peaks is not None and not peaks.empty:
        pts = peaks.assign(time_ms=peaks["t_ms"], memory=peaks["peak_bytes"] / divisor)
        points = hv.Points(pts, kdims=[TIME_DIM, y_dim], vdims=["unit", "rank", "peak_text", "color"],
                           label="unit peak")
        elements.append(points.opts(color="color", size=9, marker="triangle", line_color="black",
                                    tools=["hover"], hover_tooltips=[("unit", "@unit"), ("rank", "@rank"),
                                                                     ("peak", "@{peak_text}")]))
        # Text labels only for the highest peaks of the rank with the highest peak: more overlap.
        top_rank = pts.sort_values("memory", ascending=False)["rank"].iloc[0]
        top = pts[pts["rank"] == top_rank].sort_values("memory", ascending=False).head(labels_per_rank)
        elements.append(hv.Labels(top, kdims=[TIME_DIM, y_dim], vdims=["unit"]).opts(
            text_font_size="8pt", text_align="left", xoffset=0, yoffset=0, text_color="#333333",
            text_baseline="bottom"))
    if not elements:
        elements.append(hv.Curve([], TIME_DIM, y_dim))
    return hv.Overlay(elements).opts(
        hv.opts.Overlay(title=title, responsive=True, height=260, legend_position="top_right",
                        legend_cols=2 if multi else 1, legend_opts={"background_fill_alpha": 0.7},
                        hooks=[_timeline_hook], active_tools=["xwheel_zoom"],
                        tools=["xpan", "xwheel_zoom", "box_zoom", "reset"], show_grid=True)
    )


_RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def timeline_layout(gantt_view: hv.Overlay, memory_view: hv.Overlay | None) -> hv.Layout:
    """Gantt above, memory below: one column whose time axes zoom and pan together."""
    items = [gantt_view] if memory_view is None else [gantt_view, memory_view]
    return hv.Layout(items).cols(1).opts(hv.opts.Layout(shared_axes=True, merge_tools=True))


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


def unit_timer_boxes(times: pd.DataFrame, units: Sequence[str], *, title: str) -> hv.BoxWhisker:
    """Spread of each unit's forward and backward time over every timed step and rank."""
    frame = times.assign(timer_ms=times["ms"])
    box = hv.BoxWhisker(frame, kdims=[UNIT_DIM, hv.Dimension("phase", label="phase")],
                        vdims=[hv.Dimension("timer_ms", label="time per pass", unit="ms")])
    phases = [p for p in ("forward", "backward") if p in set(times["phase"])]
    return box.redim.values(unit_name=list(units), phase=phases).opts(
        box_fill_color=hv.dim("phase").categorize({"forward": "#9ecae1", "backward": "#a1d99b"}),
        outlier_alpha=0.4,
        **_categorical_opts(len(units) * max(len(phases), 1) // 2, title, height=320))
