"""Shared by the report's holoviews charts: the bokeh backend, common dimensions and options.

The charts themselves live with their page section (``steps.plots``, ``units.plots``); the time-line
figures are bokeh figures (``timeline.figure``). Plots with another time base use other dimension
names so holoviews keeps their axes independent. Text from traces (unit and lane names) reaches the
browser only as canvas text (ticks, legends) or as ``@field`` tooltips, which bokeh escapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import holoviews as hv
import holoviews.plotting.bokeh
import pandas as pd

# hv.extension() would also set up notebook comms; selecting the backend is all a file needs.
hv.Store.set_current_backend("bokeh")

UNIT_DIM = hv.Dimension("unit_name", label="unit (forward order)")


def tidy_toolbar(plot: Any, element: Any) -> None:
    plot.state.toolbar.autohide = True


def metric_major(frame: pd.DataFrame, group: str, groups: Sequence[str], x: str,
                  xs: Sequence[str]) -> pd.DataFrame:
    """Rows ordered by bar group, then x: holoviews maps a grouped bar chart's colours by row
    position, and gets them wrong for data in any other order (holoviews 1.23)."""
    g_order = {g: i for i, g in enumerate(groups)}
    x_order = {v: i for i, v in enumerate(xs)}
    keyed = frame.assign(_g=frame[group].map(g_order), _x=frame[x].map(x_order))
    return keyed.sort_values(["_g", "_x"], kind="stable").drop(columns=["_g", "_x"])


def bar_width_px(n_units: int) -> int | None:
    """Plots get wider than the page when bars would become thinner than a few pixels."""
    return None if n_units <= 40 else 40 + 28 * n_units


def categorical_opts(n: int, title: str, height: int = 300) -> dict[str, Any]:
    opts: dict[str, Any] = {"title": title, "height": height, "xrotation": 90 if n > 16 else 0,
                            "tools": ["hover"], "hooks": [tidy_toolbar], "show_grid": True}
    width = bar_width_px(n)
    if width is None:
        opts["responsive"] = True
    else:
        opts["width"] = width
    return opts
