"""Re-create the pictures of docs/concepts.md: the report's own time line on tiny synthetic runs.

    python docs/images/concepts_pictures.py

Each picture shows one definition of docs/concepts.md on one step of rank 0 of a synthetic FSDP2
GPU run (``tests/synth``: 2 ranks, 3 blocks of 2 M parameters, no root parameters), whose answers
are known by construction. The runs go through the real pipeline: ``load_traces``,
``analyse_traces`` (its analysis and summary), ``prepare_report`` (one rank, the median step) and the report's
time-line figure (``fsdpviz.report.page.timeline_plot``, zoomed with ``window_ms`` where one
detail matters), written with the report's page writer and captured with headless Chromium as
``docs/images/report_screenshots.py`` does. The only additions are a shaded interval and a short
label where a caption needs them, both placed at the analysis' own times.

The numbers quoted in the captions are printed (from ``RunAnalysis.unit_steps``, the summary and
``RunAnalysis.memory_peaks``), so the captions can be checked against them.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))

from cdp import Browser, find_chromium  # test helpers, not part of the package
from shots import READY, save_png
from synth import Scenario, generate_run, make_units

from fsdpviz.analysis.pipeline import analyse_traces
from fsdpviz.analysis.run import RunAnalysis
from fsdpviz.formatting import format_bytes, format_ms
from fsdpviz.report.data import ReportData, prepare_report
from fsdpviz.report.html import Page, write_page
from fsdpviz.report.timeline.section import timeline_plot, timeline_section
from fsdpviz.report.timeline.view import StepView
from fsdpviz.trace import load_traces

OUT = Path(__file__).resolve().parent
WIDTH_PX = 900
BROWSER_WIDTH_PX = 960  # the page's margins leave the figure about 900 px
RANK = 0
PAD_MS = 0.04  # space left and right of a zoomed window
LEGEND_TITLES = {"units tabs": "units", "all-events tabs": "busy time", "red strips": "red strips"}
# From the first legend line to the bottom of the figure: the unit colours belong to the picture.
FIGURE_BOX = """(() => { const s = document.getElementById('figure');
  const top = (s.querySelector('.legend') || s.querySelector('.plot')).getBoundingClientRect().top;
  const r = s.querySelector('.plot').getBoundingClientRect();
  return {x: r.left + window.scrollX, y: top + window.scrollY - 4, width: r.width, height: r.bottom - top + 8}; })()"""

# 2 M bf16 parameters per block: a 0.18 ms all-gather against 0.4 ms of forward compute.
BLOCKS = make_units(3, numel=2_000_000)
SCENARIOS = {
    # FSDP2's default (implicit) prefetch: each gather overlaps the previous block's compute.
    "prefetch": Scenario(units=BLOCKS, world_size=2, steps=(3, 4)),
    # The loop synchronises after every block: no gather can run ahead of the compute.
    "no-overlap": Scenario(units=BLOCKS, world_size=2, steps=(3, 4), backward_prefetch=0, sync_per_unit=True),
}


@dataclass(kw_only=True, slots=True)
class Analysed:
    """One synthetic run through the real pipeline."""

    analysis: RunAnalysis
    summary: dict[str, Any]
    data: ReportData

    def view(self, kind: str) -> StepView:
        return next(v for v in self.data.views if v.kind == kind)

    def ms(self, t_ns: float) -> float:
        """A time of the analysis as x on the picture: ms since the drawn step's origin."""
        return (t_ns - self.view("units").choice.origin_ns) / 1e6

    def unit(self, unit: str, phase: str) -> pd.Series:
        us = self.analysis.unit_steps
        mine = us[(us["rank"] == RANK) & (us["unit"] == unit) & (us["phase"] == phase)]
        return mine.iloc[0]

    def span(self, unit: str, phase: str, kind: str) -> pd.Series:
        sp = self.analysis.spans
        mine = sp[(sp["rank"] == RANK) & (sp["unit"] == unit) & (sp["phase"] == phase) & (sp["kind"] == kind)]
        return mine.sort_values("start_ns").iloc[0]


def analyse(scenario: Scenario, folder: Path) -> Analysed:
    run = generate_run(scenario, folder, run_folder=True)
    traces = load_traces([run.folder], cache=False)
    result = analyse_traces(traces)
    data = prepare_report(result, gantt_ranks=[RANK], views=("median", "events"))
    return Analysed(analysis=result.analysis, summary=result.summary.to_json(), data=data)


def mark(fig: Any, start_ms: float, end_ms: float, text: str, *, color: str = "#2ca02c",
         label_left: bool = False) -> None:
    """Shade ``start_ms``..``end_ms`` on a Gantt and name it in the top row, right of the shade
    (or left of it: ``label_left``)."""
    from bokeh.models import BoxAnnotation, Label

    fig.add_layout(BoxAnnotation(left=start_ms, right=end_ms, fill_color=color, fill_alpha=0.18,
                                 line_color=color, line_alpha=0.8, line_dash="dashed"))
    fig.add_layout(Label(x=start_ms if label_left else end_ms, y=0.05, text=text, x_offset=-4 if label_left else 4,
                         text_align="right" if label_left else "left", text_font_size="9pt", text_color=color,
                         text_baseline="top", background_fill_color="white", background_fill_alpha=0.85))


def figure_page(run: Analysed, kind: str, fig: Any, path: Path) -> Path:
    """A standalone page holding ``fig`` under the report's own legend for that kind of view."""
    section = timeline_section(run.data)
    wanted = ("units tabs", "red strips") if kind == "units" else ("all-events tabs", "red strips")
    # The page's group titles name its tabs; a single figure has none.
    legend = [(LEGEND_TITLES.get(group, group), items) for group, items in section.legend if group in wanted]
    section = replace(section, key="figure", title="", howto="", notes=[], legend=legend, views={"figure": fig})
    write_page(Page(title="fsdpviz concepts", sections=[section]), path)
    return path


def whole_step(runs: dict[str, Analysed]) -> tuple[Analysed, str, Any]:
    run = runs["prefetch"]
    ov = run.summary["overlap"]["per_rank"][str(RANK)]
    print(f"whole-step overlap (prefetch run, rank {RANK}, step {run.view('lanes').choice.step}): "
          f"comm {ov['comm_ms']} ms, compute {ov['compute_ms']} ms, overlap {ov['overlap_pct']} %, "
          f"exposed comm {ov['exposed_comm_ms']} ms, idle {ov['idle_ms']} ms")
    return run, "lanes", timeline_plot(run.view("events"), run.data, with_memory=False)


def unit_spans(runs: dict[str, Analysed]) -> tuple[Analysed, str, Any]:
    run = runs["prefetch"]
    sp = run.analysis.spans
    mine = sp[(sp["rank"] == RANK) & (sp["step"] == run.view("units").choice.step)]
    b1 = mine[(mine["unit"] == "blocks.1") & (mine["phase"] == "forward")]
    parts = ", ".join(f"{k} {format_ms((e - s) / 1e6)} on {lane}"
                      for k, s, e, lane in zip(b1["kind"], b1["start_ns"], b1["end_ns"], b1["lane"]))
    print(f"unit spans (prefetch run): {len(mine)} spans in the step; blocks.1 forward: {parts}")
    return run, "units", timeline_plot(run.view("units"), run.data, with_memory=False)


def _forward_window(run: Analysed) -> tuple[float, float]:
    """From blocks.0's copy-in to the end of blocks.1's forward compute."""
    start = run.span("blocks.0", "forward", "copy_in")["start_ns"]
    end = run.unit("blocks.1", "forward")["compute_end_ns"]
    return run.ms(start) - PAD_MS, run.ms(end) + PAD_MS


def _describe(run: Analysed, unit: str, phase: str) -> str:
    u = run.unit(unit, phase)
    return (f"{unit} {phase}: all-gather {format_ms(u['ag_ns'] / 1e6)}, exposed {format_ms(u['ag_exposed_ns'] / 1e6)}, "
            f"prefetch lead {format_ms(u['prefetch_lead_ns'] / 1e6)}, issue depth {int(u['issue_depth'])}, "
            f"compute {format_ms(u['compute_ns'] / 1e6)}")


def prefetch(runs: dict[str, Analysed]) -> tuple[Analysed, str, Any]:
    run = runs["prefetch"]
    print("prefetch (implicit):", "; ".join(_describe(run, f"blocks.{i}", "forward") for i in range(3)))
    fig = timeline_plot(run.view("units"), run.data, window_ms=_forward_window(run), with_memory=False)
    b1 = run.unit("blocks.1", "forward")
    mark(fig, run.ms(b1["ag_end_ns"]), run.ms(b1["compute_start_ns"]),
         f"blocks.1 prefetch lead {format_ms(b1['prefetch_lead_ns'] / 1e6)}")
    return run, "units", fig


def no_overlap(runs: dict[str, Analysed]) -> tuple[Analysed, str, Any]:
    run = runs["no-overlap"]
    print("no overlap (sync per unit):", "; ".join(_describe(run, f"blocks.{i}", "forward") for i in range(3)))
    ov = run.summary["overlap"]["per_rank"][str(RANK)]
    print(f"  whole step: comm {ov['comm_ms']} ms, overlap {ov['overlap_pct']} %, exposed comm {ov['exposed_comm_ms']} ms")
    findings = run.analysis.findings
    for f in findings[findings["rank"] == -1].sort_values("lost_ns", ascending=False, kind="stable").itertuples():
        print(f"  finding: {f.message} (knob: {f.knob or 'none'})")
    fig = timeline_plot(run.view("units"), run.data, window_ms=_forward_window(run), with_memory=False)
    b1 = run.unit("blocks.1", "forward")
    mark(fig, run.ms(b1["ag_end_ns"]), run.ms(b1["compute_start_ns"]),
         f"blocks.1 prefetch lead {format_ms(b1['prefetch_lead_ns'] / 1e6)}", color="#d62728")
    return run, "units", fig


def exposed_reduce_scatter(runs: dict[str, Analysed]) -> tuple[Analysed, str, Any]:
    run = runs["prefetch"]
    for unit in ("blocks.1", "blocks.0"):
        u = run.unit(unit, "backward")
        print(f"reduce-scatter {unit} backward: {format_ms(u['rs_ns'] / 1e6)}, exposed {format_ms(u['rs_exposed_ns'] / 1e6)}")
    start = run.unit("blocks.1", "backward")["compute_start_ns"]
    opt = run.analysis.spans
    opt = opt[(opt["rank"] == RANK) & (opt["phase"] == "optimizer")]
    window = (run.ms(start) - PAD_MS, run.ms(opt["end_ns"].max()) + PAD_MS)
    fig = timeline_plot(run.view("units"), run.data, window_ms=window, with_memory=False)
    rs = run.span("blocks.0", "backward", "reduce_scatter")
    mark(fig, run.ms(rs["start_ns"]), run.ms(rs["end_ns"]),
         f"blocks.0 reduce-scatter exposed {format_ms(run.unit('blocks.0', 'backward')['rs_exposed_ns'] / 1e6)}",
         color="#d62728", label_left=True)
    return run, "units", fig


def memory(runs: dict[str, Analysed]) -> tuple[Analysed, str, Any]:
    run = runs["no-overlap"]
    peaks = run.analysis.memory_peaks
    peak = peaks[peaks["rank"] == RANK].iloc[0]
    print(f"memory (no-overlap run): step peak {format_bytes(peak['peak_allocated_bytes'])} "
          f"({int(peak['peak_allocated_bytes'])} B) at {run.ms(peak['peak_t_ns']):.3f} ms, "
          f"in {peak['unit']} {peak['phase']}")
    us = run.analysis.unit_steps
    mine = us[us["rank"] == RANK]
    print("  window peaks: " + ", ".join(f"{u} {p} {format_bytes(b)}" for u, p, b in
                                         zip(mine["unit"], mine["phase"], mine["peak_allocated_bytes"])))
    return run, "units", timeline_plot(run.view("units"), run.data)


PICTURES: dict[str, Callable[[dict[str, Analysed]], tuple[Analysed, str, Any]]] = {
    "concept-whole-step.png": whole_step,
    "concept-unit-spans.png": unit_spans,
    "concept-prefetch.png": prefetch,
    "concept-no-overlap.png": no_overlap,
    "concept-exposed-reduce-scatter.png": exposed_reduce_scatter,
    "concept-memory.png": memory,
}


def main() -> None:
    chromium = find_chromium()
    if chromium is None:
        sys.exit("needs Chromium (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        runs = {name: analyse(sc, tmp / name) for name, sc in SCENARIOS.items()}
        pages = {}
        for name, draw in PICTURES.items():
            run, kind, fig = draw(runs)
            pages[name] = figure_page(run, kind, fig, tmp / name.replace(".png", ".html"))
        with Browser(chromium, width=BROWSER_WIDTH_PX, height=900) as browser:
            for name, page in pages.items():
                browser.open(page.as_uri())
                browser.wait_for(READY)
                browser.pump(0.5)
                print(name)
                save_png(browser.screenshot(tmp / name, clip=browser.evaluate(FIGURE_BOX)), OUT / name, WIDTH_PX)


if __name__ == "__main__":
    main()
