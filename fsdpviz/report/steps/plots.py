"""The charts of the "Across steps and ranks" section (holoviews): step-time spread, where each
rank's step went, collective start skew, the timers' per-unit spread over every step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import holoviews as hv
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.report.charts import UNIT_DIM, categorical_opts, metric_major, tidy_toolbar

STEP_MS_DIM = hv.Dimension("step_ms", label="step time", unit="ms")


def step_time_spread(times: pd.DataFrame) -> hv.Layout:
    """Box plots of step time: per step over ranks (left) and per rank over steps (right).

    With one rank or one step a box degenerates to a line, which still reads correctly."""
    data = times.assign(step_ms=times["ms"])
    by_step = hv.BoxWhisker(data, kdims=[hv.Dimension("step", label="step")], vdims=[STEP_MS_DIM]).opts(
        title="per step, spread over ranks", responsive=True, height=300, box_fill_color="#9ecae1",
        tools=["hover"], hooks=[tidy_toolbar], show_grid=True)
    by_rank = hv.BoxWhisker(data, kdims=[hv.Dimension("rank", label="rank")], vdims=[STEP_MS_DIM]).opts(
        title="per rank, spread over steps", responsive=True, height=300, box_fill_color="#c6dbef",
        tools=["hover"], hooks=[tidy_toolbar], show_grid=True)
    return hv.Layout([by_step, by_rank]).cols(2).opts(hv.opts.Layout(shared_axes=True, merge_tools=True))


RANK_DIM = hv.Dimension("rank_name", label="rank")


def rank_step_heatmap(frame: pd.DataFrame, *, value: str, label: str, title: str, cmap: str) -> hv.HeatMap:
    """One cell per rank (x) and step (y) coloured by ``value`` (ms): readable at a thousand ranks,
    where one box or bar per rank is not. Columns ``rank``, ``step`` and ``value``."""
    data = frame.assign(rank_cell=frame["rank"].astype(int), step_cell=frame["step"].astype(str),
                        cell_ms=frame[value].astype(float))
    return hv.HeatMap(data, kdims=[hv.Dimension("rank_cell", label="rank"), hv.Dimension("step_cell", label="step")],
                      vdims=[hv.Dimension("cell_ms", label=label, unit="ms")]).opts(
        cmap=cmap, colorbar=True, responsive=True, height=90 + 28 * data["step_cell"].nunique(), title=title,
        tools=["hover"], hooks=[tidy_toolbar], line_alpha=0, xlabel="rank", ylabel="step")


def rank_bars(data: pd.DataFrame, *, part: str, colors: Mapping[str, str], title: str,
              stacked: bool) -> hv.Bars:
    """Bars per rank (``rank``, ``part`` column, ``ms``), stacked or grouped by ``part``."""
    ranks = [str(r) for r in sorted(data["rank"].unique())]
    parts = [p for p in colors if p in set(data[part])]
    frame = metric_major(data.assign(rank_name=data["rank"].astype(str), ms_value=data["ms"]),
                          part, parts, "rank_name", ranks)
    bars = hv.Bars(frame, kdims=[RANK_DIM, hv.Dimension(part, label=part)],
                   vdims=[hv.Dimension("ms_value", label="time per step", unit="ms")])
    return bars.redim.values(rank_name=ranks, **{part: parts}).opts(
        stacked=stacked, multi_level=False, color=part, cmap={p: colors[p] for p in parts}, line_alpha=0,
        legend_position="right", **categorical_opts(len(ranks), title))


SKEW_COLORS = {vocabulary.ALL_GATHER: "#f58518", vocabulary.REDUCE_SCATTER: "#e45756",
               vocabulary.ALL_REDUCE: "#72b7b2", vocabulary.BROADCAST: "#4c78a8",
               vocabulary.SEND_RECV: "#9467bd", vocabulary.ALL_TO_ALL: "#8c564b", vocabulary.REDUCE: "#bcbd22",
               vocabulary.BARRIER: "#7f7f7f", vocabulary.OTHER_COMM: "#c7c7c7"}


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
        responsive=True, height=300, title=title, legend_position="right", show_grid=True,
        tools=["hover", "box_zoom", "wheel_zoom", "reset"], hooks=[tidy_toolbar],
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
    opts = categorical_opts(len(units) * max(len(phases), 1) // 2, title, height=320)
    opts["hooks"] = [*opts["hooks"], _x_factors_hook(timer_box_factors(times, units))]
    return box.redim.values(unit_name=list(units), phase=phases).opts(
        box_fill_color=hv.dim("phase").categorize({"forward": "#9ecae1", "backward": "#a1d99b"}),
        outlier_alpha=0.4, **opts)
