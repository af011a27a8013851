"""``build_whatif``: a prediction -> one offline page (numbers, settings, both steps on one axis, memory)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpviz.analysis.memory_categories import TITLES
from fsdpviz.errors import RunFolderError
from fsdpviz.formatting import format_bytes, format_change, mib_change_text, mib_text
from fsdpviz.replay.model import Model
from fsdpviz.report.html import Fact, HtmlTable, LegendItem, Page, Section, TableCell, write_page
from fsdpviz.report.style import unit_colors
from fsdpviz.whatif.predict import (
    SPREAD_UNKNOWN_WHY,
    Outcome,
    Prediction,
    category_moves,
    split_rows,
    time_rows,
    within_spread_words,
)

HOWTO_NUMBERS = (
    "Recorded: the run's figures as `fsdpviz summary` reports them (on its clock: the step of the timers' "
    "clean steps where the recorder timed them, else as traced; each rank's figure per step and the median over "
    "ranks). "
    "Predicted: the "
    "recording moved by what the setting changes in a simulation of how FSDP overlaps its compute and "
    "its collectives (the simulation of "
    "the recorded setting is subtracted, so what the model does not capture cancels out). The replay "
    "line says how closely the simulation of the recorded setting reproduces the traced steps, and, "
    "without the profiler, the run's clean steps."
)
HOWTO_TIMELINE = (
    "One step (the rank-step closest to the median step time), recorded above and predicted below, on "
    "one time axis: zoom or pan one and the other follows. Lanes by kind of work; bars coloured by unit "
    "(a merged unit of the prediction has its own colour), backward hatched; a red strip marks "
    "communication no compute covered. Below, the allocated memory of both: the predicted curve is "
    "the recorded step's memory by category with what the setting changes (its highest point is the "
    "predicted peak), laid on the predicted step's time."
)
HOVER = [("unit_name", "unit"), ("kind", "kind"), ("phase", "phase"), ("start_ms", "start (ms)"),
         ("dur_ms", "duration (ms)"), ("lane", "lane")]
RECORDED_COLOR = "#4c78a8"
PREDICTED_COLOR = "#f58518"


@dataclass(frozen=True, slots=True)
class WhatifPage:
    path: Path
    size_bytes: int
    seconds: float


def numbers_table(baseline: Outcome, predicted: Outcome,
                  split: list[tuple[str, float, float]] | None = None) -> HtmlTable:
    """Recorded beside predicted: the step's time figures, then ``split`` (:func:`split_rows`: FSDP's
    per-unit work and the idle time, as the terminal's table shows them), the peak and its categories."""
    rows: list[list[TableCell]] = []
    for label, before_ms, after_ms in [*time_rows(baseline, predicted), *(split or [])]:
        rows.append([TableCell(text=label, header=True), TableCell(text=f"{before_ms:,.3f} ms"),
                     TableCell(text=f"{after_ms:,.3f} ms", sub=format_change(before_ms, after_ms, "ms"))])
    b_peak, p_peak = baseline.peak_allocated_bytes, predicted.peak_allocated_bytes
    rows.append([TableCell(text="peak allocated", header=True), TableCell(text=format_bytes(b_peak) or "n/a"),
                 TableCell(text=format_bytes(p_peak) or "n/a", sub=format_change(b_peak, p_peak, "bytes"))])
    floor, listed, smaller = category_moves(baseline, predicted)  # the terminal's too
    for c, b, a in listed:  # the categories of the peak the setting changes
        rows.append([TableCell(text=f"… {TITLES[c]} at the peak", header=True), TableCell(text=format_bytes(b) or "0"),
                     TableCell(text=format_bytes(a) or "0", sub=format_change(b, a, "bytes"))])
    if smaller:  # as the terminal's clause: the rows above are not the peak's whole change
        rows.append([TableCell(text=f"… under {mib_text(floor)} each", header=True), TableCell(text=""),
                     TableCell(text=", ".join(f"{TITLES[c]} {mib_change_text(d)}" for c, d in smaller))])
    return HtmlTable(columns=["", "recorded", "predicted"], rows=rows)


def settings_table(prediction: Prediction, device: str) -> HtmlTable:
    """Each setting, its value and where it came from, named as the terminal names it."""
    from fsdpviz.replay.settings import setting_name

    rows = [[TableCell(text=setting_name(key, device), header=True), TableCell(text=str(v["value"])),
             TableCell(text=str(v["source"]))] for key, v in prediction.settings.to_json().items()]
    return HtmlTable(columns=["setting", "value", "source"], rows=rows)


def units_table(prediction: Prediction) -> HtmlTable:
    rows = [[TableCell(text=u.name, header=True), *(TableCell(text="n/a" if v is None else f"{v:,.3f}") for v in (
        u.all_gather_ms, u.forward_ms, u.backward_ms, u.reduce_scatter_ms, u.exposed_comm_ms))]
        for u in prediction.predicted.units]
    unknown = any(v is None for u in prediction.predicted.units for v in (
        u.all_gather_ms, u.forward_ms, u.backward_ms, u.reduce_scatter_ms, u.exposed_comm_ms))
    return HtmlTable(columns=["predicted unit", "all-gather ms", "forward ms", "backward ms", "reduce-scatter ms",
                              "exposed ms"], rows=rows,
                     caption="per unit, medians over ranks and steps" + ("; n/a: unknown, the notes say why"
                                                                          if unknown else ""))


def _memory_figure(curves: list[tuple[str, Any, str]]) -> Any | None:
    from bokeh.models import ColumnDataSource, HoverTool
    from bokeh.plotting import figure

    from fsdpviz.formatting import bytes_scale
    from fsdpviz.report.timeline.figure import MIN_BORDER_LEFT_PX, TIME_LABEL

    shown = [(label, frame, color) for label, frame, color in curves if not frame.empty]
    if not shown:
        return None
    divisor, unit = bytes_scale(max(float(f["allocated_bytes"].max()) for _, f, _ in shown))
    fig = figure(title="allocated memory during the step", height=260, sizing_mode="stretch_width",
                 tools="xpan,xwheel_zoom,box_zoom,reset,save", active_scroll="xwheel_zoom", active_drag="xpan",
                 output_backend="canvas", min_border_left=MIN_BORDER_LEFT_PX, x_axis_label=TIME_LABEL,
                 y_axis_label=f"allocated ({unit})")
    fig.toolbar.logo = None
    renderers = []
    for label, frame, color in shown:
        source = ColumnDataSource({"t_ms": frame["t_ms"].to_numpy(float),
                                   "memory": frame["allocated_bytes"].to_numpy(float) / divisor,
                                   "run": [label] * len(frame)})
        renderers.append(fig.step("t_ms", "memory", source=source, mode="after", line_width=1.8, color=color,
                                  legend_label=label))
    fig.add_tools(HoverTool(renderers=renderers, tooltips=[("", "@run"), ("time (ms)", "@{t_ms}{0.000}"),
                                                           (f"allocated ({unit})", "@{memory}{0.000}")]))
    fig.legend.location = "top_right"
    return fig


def build_whatif(model: Model, prediction: Prediction, output: str | Path, *, source: str) -> WhatifPage:
    """Write the what-if page of ``prediction`` to ``output`` (its folder must exist)."""
    from fsdpviz.report.compare.plots import share_time_axis
    from fsdpviz.report.timeline.figure import gantt
    from fsdpviz.report.whatif.data import prepare

    started = time.perf_counter()
    out = Path(output)
    data = prepare(model, prediction)
    colors = unit_colors(data.units, {u: i for i, u in enumerate(data.units)})
    colors["(optimizer)"] = "#9d9d9d"
    figures = [gantt(t.rows, t.segments, t.exposed, title=t.title, colors=colors, color_by="unit_name", hover=HOVER)
               for t in (data.recorded, data.predicted)]
    memory = _memory_figure([("recorded", data.recorded.memory, RECORDED_COLOR),
                             ("predicted", data.predicted.memory, PREDICTED_COLOR)])
    views = [*figures, *([memory] if memory is not None else [])]
    share_time_axis(views, max(data.recorded.step_ms, data.predicted.step_ms))
    rec = model.recording
    name = prediction.settings.describe()
    if prediction.measurable is None:
        spread = f"{SPREAD_UNKNOWN_WHY[0].upper()}{SPREAD_UNKNOWN_WHY[1:]}."
    elif prediction.measurable:
        spread = f"The predicted change is beyond the recording's own step-to-step spread ({prediction.spread_ms:,.2f} ms)."
    else:
        within = within_spread_words(prediction.spread_ms or 0.0)
        spread = f"{within[0].upper()}{within[1:]}."
    notes = [*(f"Warning: {w}." for w in prediction.warnings), spread,
             *(f"Assumed: {figure}." for figure in prediction.assumed),
             f"Replay: {prediction.replay_words()}.", *prediction.notes,
             *([f"{prediction.bound['note'][0].upper()}{prediction.bound['note'][1:]}."]
               if prediction.bound and prediction.bound.get("note") else [])]
    apply = prediction.apply
    code = [] if apply is None or apply.code is None else [
        (f"{name}: the change as code (fsdpviz whatif ... --code)", apply.code)]
    if apply is not None and apply.code is None and apply.note:
        notes.append(f"No code for this setting: {apply.note}.")
    sections = [
        Section(key="numbers", title=f"Recorded vs predicted: {name}", howto=HOWTO_NUMBERS, notes=notes,
                tables=[numbers_table(prediction.baseline, prediction.predicted,
                                      split_rows(model.result.summary.bound, prediction.bound)),
                        settings_table(prediction, rec.device),
                        units_table(prediction)], code=code),
        Section(key="timeline", title="One step, recorded and predicted", howto=HOWTO_TIMELINE,
                legend=[("units", [LegendItem(label=u, color=colors[u]) for u in data.units])],
                views={"timeline": views}),
    ]
    read = len({st.rank for st in rec.steps})
    page = Page(title=f"fsdpviz whatif: {name}", subtitle=f"predicted from {source}",
                meta=[Fact(label="framework", value=rec.framework),
                      Fact(label="world size", value=str(rec.world_size), hint=f"{read} rank(s) read by the model"),
                      Fact(label="device", value=rec.device), Fact(label="kind", value="PREDICTED (not recorded)")],
                sections=sections)
    try:
        size = write_page(page, out)
    except OSError as exc:
        raise RunFolderError(f"{out}: cannot write the page: {exc.strerror or exc}") from exc
    return WhatifPage(path=out, size_bytes=size, seconds=time.perf_counter() - started)
