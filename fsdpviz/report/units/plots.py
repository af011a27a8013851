"""The charts of the "Per unit" section: grouped bars per unit and metric (the unit table is HTML:
``units.table.html_table``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import holoviews as hv
import pandas as pd

from fsdpviz.report.charts import UNIT_DIM, bar_width_px, metric_major, tidy_toolbar


def unit_bars(data: pd.DataFrame, units: Sequence[str], *, value: str, value_dim: hv.Dimension,
              title: str, colors: Mapping[str, str]) -> hv.Bars:
    """Grouped bars: one group per unit (forward order), one bar per metric."""
    metrics = [m for m in colors if m in set(data["metric"])] if not data.empty else []
    frame = metric_major(data.rename(columns={value: value_dim.name}), "metric", metrics, "unit_name", units)
    bars = hv.Bars(frame, kdims=[UNIT_DIM, hv.Dimension("metric", label="metric")], vdims=[value_dim])
    width = bar_width_px(len(units))
    opts: dict[str, Any] = {
        "title": title, "height": 320, "color": "metric", "cmap": {m: colors[m] for m in metrics},
        "multi_level": False, "xrotation": 90 if len(units) > 8 else 0, "tools": ["hover"],
        "show_legend": True, "legend_position": "right", "hooks": [tidy_toolbar],
        "show_grid": True, "line_alpha": 0,
    }
    if width is None:
        opts["responsive"] = True
    else:
        opts["width"] = width
    return bars.redim.values(unit_name=list(units), metric=metrics).opts(**opts)


def category_bars(data: pd.DataFrame, units: Sequence[str], *, value_dim: hv.Dimension, title: str,
                  colors: Mapping[str, str], titles: Mapping[str, str]) -> hv.Bars:
    """Stacked bars: one per unit (forward order), its peak split by memory category (``data``:
    ``unit_name``, ``category``, ``bytes`` already scaled)."""
    cats = [c for c in colors if c in set(data["category"])] if not data.empty else []
    frame = data.assign(category=data["category"].map(lambda c: titles.get(c, c)))
    labels = [titles.get(c, c) for c in cats]
    frame = metric_major(frame.rename(columns={"bytes": value_dim.name}), "category", labels, "unit_name", units)
    bars = hv.Bars(frame, kdims=[UNIT_DIM, hv.Dimension("category", label="category")], vdims=[value_dim])
    width = bar_width_px(len(units))
    opts: dict[str, Any] = {
        "title": title, "height": 360, "stacked": True, "color": "category",
        "cmap": {titles.get(c, c): colors[c] for c in cats}, "xrotation": 90 if len(units) > 8 else 0,
        "tools": ["hover"], "show_legend": True, "legend_position": "right", "hooks": [tidy_toolbar],
        "show_grid": True, "line_alpha": 0,
    }
    if width is None:
        opts["responsive"] = True
    else:
        opts["width"] = width + 160  # the legend beside the bars
    return bars.redim.values(unit_name=list(units), category=labels).opts(**opts)
