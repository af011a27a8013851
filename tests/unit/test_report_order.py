"""Units in model order and forward before backward, in every categorical plot of the report.

holoviews sorts the nested categories of a box plot (``blocks.10`` before ``blocks.2``, ``backward``
before ``forward``); the report must draw them the way the model runs. Checked on the bokeh
figures the page renders, with twelve units so that alphabetical and model order differ.
"""

from __future__ import annotations

import holoviews as hv
import pandas as pd

from fsdpviz.report.steps import data as steps_data
from fsdpviz.report.steps import plots as step_plots
from fsdpviz.report.units import plots as unit_plots

UNITS = ["(root)"] + [f"blocks.{i}" for i in range(12)]


def _timers() -> pd.DataFrame:
    """Per-step unit passes (profiler_cost.unit_pass_steps) for three steps and two ranks, listed backward first
    and in reverse model order, as a file could hold them."""
    rows = []
    for step in range(3):
        for rank in (0, 1):
            for unit in reversed(UNITS):
                for phase in ("backward", "forward"):
                    rows.append({"rank": rank, "step": step, "unit": unit, "phase": phase, "kind": "total",
                                 "ms": 1.0 + step, "bytes": -1})
    return pd.DataFrame(rows)


def test_timer_boxes_in_model_order_forward_first() -> None:
    times = steps_data.unit_timer_times(_timers(), UNITS)
    assert list(dict.fromkeys(times["unit"])) == UNITS
    assert list(dict.fromkeys(zip(times["unit"], times["phase"]))) == [(u, p) for u in UNITS
                                                                       for p in ("forward", "backward")]
    figure = hv.render(step_plots.unit_timer_boxes(times, UNITS, title="timers"), backend="bokeh")
    assert [tuple(map(str, f)) for f in figure.x_range.factors] == [(u, p) for u in UNITS
                                                                    for p in ("forward", "backward")]


def test_timer_boxes_without_backward_keep_only_the_forward_boxes() -> None:
    timers = _timers()
    times = steps_data.unit_timer_times(timers[timers["phase"] == "forward"], UNITS)
    figure = hv.render(step_plots.unit_timer_boxes(times, UNITS, title="timers"), backend="bokeh")
    assert [tuple(map(str, f)) for f in figure.x_range.factors] == [(u, "forward") for u in UNITS]


def test_unit_bars_in_model_order_forward_first() -> None:
    data = pd.DataFrame([(u, m, 1.0) for u in reversed(UNITS) for m in ("backward", "forward")],
                        columns=["unit_name", "metric", "ms"])
    bars = unit_plots.unit_bars(data, UNITS, value="ms", value_dim=hv.Dimension("unit_ms", unit="ms"), title="t",
                           colors={"forward": "#9ecae1", "backward": "#a1d99b"})
    figure = hv.render(bars, backend="bokeh")
    assert [tuple(map(str, f)) for f in figure.x_range.factors] == [(u, p) for u in UNITS
                                                                    for p in ("forward", "backward")]
