"""The time-line figures (Gantt of one step + memory curve under it), drawn with bokeh directly.

Every other plot of the page is a holoviews element; these two are built as bokeh figures because
they carry almost all of the page's data (up to 1e5 rectangles), and holoviews sends every
rectangle's coordinates twice, each hover field as its own string column and a colour column; here
the source holds the four corners, the hover fields and nothing else (what that saves in build time
and page size: docs/performance.md, "Building the report").
Colours and hatches are mapped in the browser (``factor_cmap`` / ``factor_hatch``) from the unit or
category and the phase, so no per-rectangle colour strings travel either.

Names from traces (units, lanes, kernels) appear only as canvas text (tick labels, peak labels)
and in ``@field`` tooltips, which bokeh escapes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from bokeh.layouts import gridplot
from bokeh.models import ColumnDataSource, FixedTicker, HoverTool, LabelSet, Range1d
from bokeh.plotting import figure
from bokeh.transform import factor_cmap, factor_hatch

from fsdpviz.report.style import ALLOCATED_COLOR, EXPOSED_COLOR, PHASE_HATCH, RESERVED_COLOR

TIME_LABEL = "time since step start (ms)"
ROW_HEIGHT_PX = 22
MIN_ROW_HEIGHT_PX = 11
MAX_GANTT_BODY_PX = 1100
MIN_GANTT_HEIGHT_PX = 160
# The left border fits lane labels such as "rank 12 · stream 28 · reduce_scatter" and is the same
# on both figures of a time line, so that their time axes line up.
MIN_BORDER_LEFT_PX = 190
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"
RANK_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")

# Height of a span inside its lane row (rows are 1 apart), and of the exposed strip under it.
_SPAN_PAD = 0.12
_EXPOSED_TOP = 0.62


def gantt_height(n_rows: int) -> int:
    """Rows shrink (down to MIN_ROW_HEIGHT_PX) so that a many-rank Gantt fits a screen or two."""
    row_px = max(MIN_ROW_HEIGHT_PX, min(ROW_HEIGHT_PX, MAX_GANTT_BODY_PX // max(n_rows, 1)))
    return max(MIN_GANTT_HEIGHT_PX, 70 + row_px * n_rows)


def _time_range(segments: pd.DataFrame, exposed: pd.DataFrame,
                window_ms: tuple[float, float] | None = None) -> Range1d:
    if window_ms is not None:
        start_ms, end_ms = window_ms
        if not end_ms > start_ms:
            raise ValueError(f"time window must end after it starts, got {window_ms}")
        return Range1d(start=float(start_ms), end=float(end_ms))
    ends = [float(f["x1_ms"].max()) for f in (segments, exposed) if not f.empty]
    end = max(ends) if ends else 1.0
    pad = max(end * 0.01, 1e-3)
    return Range1d(start=-pad, end=end + pad)


def _figure(title: str, height: int, x_range: Range1d, **kwargs: Any) -> Any:
    fig = figure(title=title, height=height, sizing_mode="stretch_width", x_range=x_range, tools=TOOLS,
                 active_scroll="xwheel_zoom", active_drag="xpan", output_backend="canvas",
                 min_border_left=MIN_BORDER_LEFT_PX, x_axis_label=TIME_LABEL, **kwargs)
    fig.toolbar.logo = None
    return fig


def gantt(rows: pd.DataFrame, segments: pd.DataFrame, exposed: pd.DataFrame, *, title: str,
          colors: Mapping[str, str], color_by: str, hover: Sequence[tuple[str, str]],
          window_ms: tuple[float, float] | None = None) -> Any:
    """Rectangles per lane row, coloured by ``color_by`` (a unit, or comm/compute), backward
    phases hatched, the exposed pieces of collectives as a red strip in the lower part of their row.

    ``segments`` needs ``row``, ``x0_ms``, ``x1_ms``, ``color_by`` and the ``hover`` columns
    (``(column, name)`` pairs; missing ones are skipped), optionally ``phase``. ``exposed`` needs
    ``row``, ``x0_ms``, ``x1_ms``, ``dur_ms`` and ``what``. ``window_ms`` (start, end in the
    segments' ms) is the time range shown when the page opens, e.g. one unit's gather and the
    compute after it; default: the whole step. Every segment is still drawn: zoom out to see them.
    """
    n_rows = max(len(rows), 1)
    fig = _figure(title, gantt_height(n_rows), _time_range(segments, exposed, window_ms),
                  y_range=Range1d(n_rows, 0))
    ticks = [float(r) + 0.5 for r in rows["row"]]
    fig.yaxis.ticker = FixedTicker(ticks=ticks)
    fig.yaxis.major_label_overrides = {t: str(label) for t, label in zip(ticks, rows["label"])}
    fig.yaxis.major_label_text_font_size = "8pt" if n_rows > 40 else "9pt"
    fig.ygrid.grid_line_color = None
    fields = [c for c in dict.fromkeys([color_by, *(c for c, _ in hover), "phase"]) if c in segments.columns]
    data: dict[str, Any] = {
        "left": segments["x0_ms"].to_numpy(np.float64), "right": segments["x1_ms"].to_numpy(np.float64),
        "bottom": (segments["row"] + _SPAN_PAD).to_numpy(np.float64),
        "top": (segments["row"] + 1 - _SPAN_PAD).to_numpy(np.float64),
    }
    for col in fields:
        values = segments[col]
        data[col] = values.to_numpy() if pd.api.types.is_numeric_dtype(values) else values.astype(str).tolist()
    factors = list(dict.fromkeys(str(v) for v in segments[color_by])) if not segments.empty else ["-"]
    glyph: dict[str, Any] = {
        "fill_color": factor_cmap(color_by, [colors.get(f, "#888888") for f in factors], factors),
        "fill_alpha": 0.95, "line_alpha": 0,
    }
    if "phase" in data:
        glyph.update(hatch_pattern=factor_hatch("phase", list(PHASE_HATCH.values()), list(PHASE_HATCH)),
                     hatch_color="white", hatch_alpha=0.7, hatch_scale=8)
    spans = fig.quad(left="left", right="right", bottom="bottom", top="top", source=ColumnDataSource(data),
                     **glyph)
    fig.add_tools(HoverTool(renderers=[spans], tooltips=[(name, _field(col, data)) for col, name in hover
                                                         if col in data]))
    strips = fig.quad(left="left", right="right", bottom="bottom", top="top", fill_color=EXPOSED_COLOR,
                      line_alpha=0, source=ColumnDataSource({
                          "left": exposed["x0_ms"].to_numpy(np.float64),
                          "right": exposed["x1_ms"].to_numpy(np.float64),
                          "bottom": (exposed["row"] + _EXPOSED_TOP).to_numpy(np.float64),
                          "top": (exposed["row"] + 1 - _SPAN_PAD / 2).to_numpy(np.float64),
                          "dur_ms": exposed["dur_ms"].to_numpy(np.float64),
                          "what": exposed["what"].astype(str).tolist()}))
    fig.add_tools(HoverTool(renderers=[strips], tooltips=[("exposed", "@what"), ("exposed (ms)", "@{dur_ms}{0.000}")]))
    return fig


def _field(col: str, data: Mapping[str, Any]) -> str:
    """A tooltip field: numbers with three decimals, text as is (bokeh escapes it)."""
    values = data[col]
    return f"@{{{col}}}{{0.000}}" if isinstance(values, np.ndarray) and values.dtype.kind == "f" else f"@{{{col}}}"


# Peak labels: their font, and the plot area they are placed for: the memory figure's frame on a
# 1400 px wide page (its height is fixed; a wider page only spreads the labels further apart).
LABEL_FONT_PX = 11
_LABEL_CHAR_PX = 6.6
_LABEL_FRAME_PX = (1130.0, 160.0)
_LABEL_HEADROOM = 0.3  # the y range reaches this share of the curve's span above its top, for labels


def _curve_top(curves: Sequence[tuple[np.ndarray, np.ndarray]], t0: float, t1: float) -> float:
    """The highest level any step curve holds during [t0, t1] (each level holds until the next sample)."""
    top = -np.inf
    for t, y in curves:
        if not len(t):
            continue
        a = max(int(np.searchsorted(t, t0, side="right")) - 1, 0)
        b = int(np.searchsorted(t, t1, side="right"))
        top = max(top, float(y[a:max(b, a + 1)].max()))
    return top


def label_offsets(t_ms: np.ndarray, y: np.ndarray, texts: Sequence[str], *, x_range: tuple[float, float],
                  y_range: tuple[float, float], curves: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[float]:
    """Vertical offsets (px) for the labels of the points (``t_ms``, ``y``) such that each label sits
    above every drawn curve under it and clear of the labels placed before it (tallest peak first),
    on a plot area of ``_LABEL_FRAME_PX`` showing ``x_range`` x ``y_range``."""
    width_px, height_px = _LABEL_FRAME_PX
    x_per_px = (x_range[1] - x_range[0]) / width_px
    px_per_y = height_px / max(y_range[1] - y_range[0], 1e-12)
    line = LABEL_FONT_PX + 3
    placed: list[tuple[float, float, float, float]] = []
    out = [2.0] * len(texts)
    for i in sorted(range(len(texts)), key=lambda k: -float(y[k])):
        x0 = (float(t_ms[i]) - x_range[0]) / x_per_px + 4
        x1 = x0 + _LABEL_CHAR_PX * len(texts[i]) + 2
        base = (float(y[i]) - y_range[0]) * px_per_y
        under = _curve_top(curves, x_range[0] + (x0 - 1) * x_per_px, x_range[0] + x1 * x_per_px)
        dy = max(2.0, (under - y_range[0]) * px_per_y - base + 2.0)
        for _ in range(12):
            box = (x0, base + dy, x1, base + dy + line)
            clash = [b for b in placed if not (box[2] <= b[0] or b[2] <= box[0] or box[3] <= b[1] or b[3] <= box[1])]
            if not clash:
                break
            dy = max(b[3] for b in clash) - base + 1.0
        placed.append(box)
        out[i] = dy
    return out


def label_top_px(y: np.ndarray, offsets: Sequence[float], y_range: tuple[float, float]) -> float:
    """How high (px above the plot area's bottom) the highest label of :func:`label_offsets` reaches."""
    px_per_y = _LABEL_FRAME_PX[1] / max(y_range[1] - y_range[0], 1e-12)
    return max(((float(v) - y_range[0]) * px_per_y + dy + LABEL_FONT_PX + 3 for v, dy in zip(y, offsets)),
               default=0.0)


def memory_curve(curves: pd.DataFrame, peaks: pd.DataFrame | None, *, divisor: float, unit: str, title: str,
                 x_range: Range1d | None = None, labels_per_rank: int = 5) -> Any:
    """Allocated (solid) and reserved (dashed) memory of each drawn rank over the step, and each
    unit's peak marked with a triangle (text labels for the highest ``labels_per_rank`` of the rank
    with the highest peak; hover tells the others)."""
    if x_range is None:
        end = float(curves["t_ms"].max()) if not curves.empty else 1.0
        x_range = Range1d(start=-end * 0.01, end=end * 1.01)
    fig = _figure(title, 260, x_range, y_axis_label=f"memory ({unit})")
    ranks = sorted(int(r) for r in curves["rank"].unique()) if not curves.empty else []
    multi = len(ranks) > 1
    # Reserved memory only for the rank with the highest reserve: one dashed line reads, eight do not.
    reserve_rank = (int(curves["rank"].to_numpy()[curves["reserved_bytes"].to_numpy().argmax()])
                    if not curves.empty and (curves["reserved_bytes"] > 0).any() else None)
    for i, rank in enumerate(ranks):
        mine = curves[curves["rank"] == rank]
        suffix = f" (rank {rank})" if multi else ""
        color = RANK_COLORS[i % len(RANK_COLORS)] if multi else ALLOCATED_COLOR
        fig.step(mine["t_ms"].to_numpy(), (mine["allocated_bytes"] / divisor).to_numpy(), mode="after",
                 line_width=1.8, color=color, legend_label=f"allocated{suffix}")
        if rank == reserve_rank:  # None on CPU: its allocator reports no reserve, no flat zero line
            fig.step(mine["t_ms"].to_numpy(), (mine["reserved_bytes"] / divisor).to_numpy(), mode="after",
                     line_width=1.2, line_dash="dashed", alpha=0.8, color=RESERVED_COLOR if not multi else color,
                     legend_label=f"reserved{suffix}")
    if peaks is not None and not peaks.empty:
        pts = ColumnDataSource({
            "t_ms": peaks["t_ms"].to_numpy(np.float64), "y": (peaks["peak_bytes"] / divisor).to_numpy(np.float64),
            "unit": peaks["unit_name"].astype(str).tolist() if "unit_name" in peaks else peaks["unit"].astype(str).tolist(),
            "rank": peaks["rank"].to_numpy(), "peak_text": peaks["peak_text"].astype(str).tolist(),
            "color": peaks["color"].astype(str).tolist()})
        marks = fig.scatter("t_ms", "y", source=pts, marker="triangle", size=9, fill_color="color",
                            line_color="black", legend_label="unit peak")
        fig.add_tools(HoverTool(renderers=[marks], tooltips=[("unit", "@unit"), ("rank", "@rank"),
                                                             ("peak", "@{peak_text}")]))
        top_rank = peaks.sort_values("peak_bytes", ascending=False)["rank"].iloc[0]
        top = peaks[peaks["rank"] == top_rank].sort_values("peak_bytes", ascending=False).head(labels_per_rank)
        names = (top["unit_name"] if "unit_name" in top else top["unit"]).astype(str).tolist()
        t_ms = top["t_ms"].to_numpy(np.float64)
        y = (top["peak_bytes"] / divisor).to_numpy(np.float64)
        drawn = [(mine["t_ms"].to_numpy(np.float64), (mine[col] / divisor).to_numpy(np.float64))
                 for rank in ranks for mine in [curves[curves["rank"] == rank]]
                 for col in ("allocated_bytes", "reserved_bytes") if col == "allocated_bytes" or rank == reserve_rank]
        low = min(float(c.min()) for _, c in drawn)
        high = max(max(float(c.max()) for _, c in drawn), float(y.max()))
        pad = max(high - low, 1e-9)
        y_range = (low - 0.05 * pad, high + _LABEL_HEADROOM * pad)
        for _ in range(4):  # labels stacked above a peak near the top: raise the top until the highest fits
            offsets = label_offsets(t_ms, y, names, x_range=(float(x_range.start), float(x_range.end)),
                                    y_range=y_range, curves=drawn)
            top_px = label_top_px(y, offsets, y_range)
            room_px = _LABEL_FRAME_PX[1] - 4
            if top_px <= room_px:
                break
            y_range = (y_range[0], y_range[0] + (y_range[1] - y_range[0]) * top_px / room_px)
        fig.y_range = Range1d(start=y_range[0], end=y_range[1])
        fig.add_layout(LabelSet(x="t_ms", y="y", text="unit", text_font_size=f"{LABEL_FONT_PX}px",
                                text_color="#333333", x_offset=4, y_offset="dy", source=ColumnDataSource({
                                    "t_ms": t_ms, "y": y, "unit": names, "dy": offsets})))
    _legend_above(fig)
    return fig


def _legend_above(fig: Any) -> None:
    """The legend in one row above the plot area, where it covers no curve; above, not beside, so
    that the figure's time axis stays aligned with the Gantt's."""
    if not fig.legend:
        return
    legend = fig.legend[0]
    fig.center = [r for r in fig.center if r is not legend]
    legend.orientation = "horizontal"
    legend.location = "top_left"
    legend.click_policy = "hide"
    legend.label_text_font_size = "8pt"
    legend.padding = 2
    legend.margin = 2
    legend.border_line_alpha = 0
    fig.add_layout(legend, "above")


def category_stack(curve: pd.DataFrame, *, divisor: float, unit: str, title: str,
                   colors: Mapping[str, str], titles: Mapping[str, str]) -> Any:
    """One rank's allocated memory stacked by category over the step (``curve``: ``t_ms`` and one
    column per category, bottom to top in ``colors``' order), drawn as steps like the allocator's
    curve: each level holds until the next sample."""
    end = float(curve["t_ms"].max()) if not curve.empty else 1.0
    fig = _figure(title, 260, Range1d(start=-end * 0.01, end=end * 1.01), y_axis_label=f"memory ({unit})")
    t = curve["t_ms"].to_numpy(np.float64)
    # a step shape from points: each level repeated at the next sample's time
    x = np.repeat(t, 2)[1:]
    data: dict[str, Any] = {"t_ms": x}
    names = [c for c in colors if c in curve.columns]
    for c in names:
        v = (curve[c].to_numpy(np.float64) / divisor).clip(min=0)
        data[c] = np.repeat(v, 2)[:-1]
    source = ColumnDataSource(data)
    renderers = fig.varea_stack(stackers=names, x="t_ms", color=[colors[c] for c in names],
                                legend_label=[titles.get(c, c) for c in names], source=source, alpha=0.9)
    fig.add_tools(HoverTool(renderers=renderers[-1:], mode="vline", tooltips=[
        ("t (ms)", "@{t_ms}{0.000}"), *[(titles.get(c, c), f"@{{{c}}}{{0.0}} {unit}") for c in reversed(names)]]))
    _legend_above(fig)
    return fig


def timeline_layout(gantt_fig: Any, memory_fig: Any | None, category_fig: Any | None = None) -> Any:
    """Gantt above, memory below (and its categories under it), one toolbar: their time axes zoom
    and pan together."""
    below = [f for f in (memory_fig, category_fig) if f is not None]
    if not below:
        return gantt_fig
    for fig in below:
        fig.x_range = gantt_fig.x_range
    return gridplot([[gantt_fig], *[[f] for f in below]], merge_tools=True, toolbar_location="above",
                    sizing_mode="stretch_width")
