"""The charts of the "Per unit" section: grouped bars per unit and metric, the sortable unit table."""

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
        "show_legend": True, "legend_position": "top_right", "hooks": [tidy_toolbar],
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
