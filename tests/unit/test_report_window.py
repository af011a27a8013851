"""The time-line figure zoomed onto part of a step (``window_ms``) and without its memory curve.

Checked on the bokeh models the report builds from a synthetic FSDP2 run (1 rank, 3 blocks),
not on pixels: the range the Gantt opens on, the memory curve following it, and every span of
the step still drawn outside the window.
"""

from __future__ import annotations

import pandas as pd
import pytest
from bokeh.models import GlyphRenderer, GridPlot
from bokeh.plotting import figure
from synth import Scenario, generate_run, make_units

from fsdpviz.analysis.pipeline import analyse_traces
from fsdpviz.report.data import prepare_report
from fsdpviz.report.timeline import figure as timeline_figure
from fsdpviz.report.timeline.section import timeline_plot
from fsdpviz.trace import load_traces


@pytest.fixture(scope="module")
def report_data(tmp_path_factory):
    sc = Scenario(units=make_units(3, numel=2_000_000), world_size=1, steps=(3, 4))
    synth = generate_run(sc, tmp_path_factory.mktemp("synth"), run_folder=True)
    traces = load_traces([synth.folder], cache=False)
    return prepare_report(analyse_traces(traces), views=("median",))


def _gantt_of(layout) -> figure:
    if isinstance(layout, GridPlot):
        return layout.children[0][0]
    return layout


def _span_quads(fig: figure) -> GlyphRenderer:
    return fig.renderers[0]  # the spans; the exposed strips come second


def test_whole_step_by_default(report_data) -> None:
    view = report_data.views[0]
    fig = _gantt_of(timeline_plot(view, report_data))
    last_end_ms = float(view.segments["x1_ms"].max())
    assert fig.x_range.start < 0 < last_end_ms < fig.x_range.end


def test_window_zooms_the_gantt_and_the_memory_curve(report_data) -> None:
    view = report_data.views[0]
    # GIVEN the window of blocks.1's forward all-gather
    gather = view.segments[(view.segments["unit"] == "blocks.1") & (view.segments["kind"] == "all_gather")
                           & (view.segments["phase"] == "forward")].iloc[0]
    window = (float(gather["x0_ms"]) - 0.01, float(gather["x1_ms"]) + 0.01)
    # WHEN drawing the tab zoomed onto it
    layout = timeline_plot(view, report_data, window_ms=window)
    # THEN the Gantt opens on the window and the memory curve under it shares the range
    assert isinstance(layout, GridPlot)
    gantt_fig, memory_fig = layout.children[0][0], layout.children[1][0]
    assert (gantt_fig.x_range.start, gantt_fig.x_range.end) == window
    assert memory_fig.x_range is gantt_fig.x_range
    # and every span of the step is still in the figure (zooming out shows the rest)
    lefts = _span_quads(gantt_fig).data_source.data["left"]
    assert len(lefts) == len(view.segments)
    assert (pd.Series(lefts) < window[0]).any() and (pd.Series(lefts) > window[1]).any()


def test_without_memory_is_the_gantt_alone(report_data) -> None:
    view = report_data.views[0]
    assert not view.memory.empty
    fig = timeline_plot(view, report_data, with_memory=False)
    assert not isinstance(fig, GridPlot)
    assert fig.title.text == view.title


def test_empty_window_is_refused(report_data) -> None:
    view = report_data.views[0]
    with pytest.raises(ValueError, match="must end after it starts"):
        timeline_figure.gantt(view.rows, view.segments, view.exposed, title="t", colors={}, color_by="unit_name",
                    hover=[], window_ms=(1.0, 1.0))
