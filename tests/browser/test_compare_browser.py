"""The compare page opens offline in headless Chromium, draws every section and links its time axes.

Built from two real 2-rank CPU recordings (the FSDP2 and ZeRO-3 samples: different frameworks, so
the page must also carry the comparability note), one of them labelled with an HTML payload that
must stay text. Checked in the browser: no uncaught exception, console error, dialog or request
outside the file; bokeh documents idle with canvases drawn; screenshots not blank; the best-value
star in the headline table; and every Gantt plus the memory overlay sharing one x range.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdpviz.report.compare.build import build_compare, load_runs

from .cdp import Browser
from .conftest import PAGE_STATE_JS, image_stats

pytestmark = pytest.mark.browser

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
RUNS = [SAMPLES / "fsdp2-cpu-2rank", SAMPLES / "zero3-cpu-2rank"]
XSS = "<img src=x onerror=alert(1)>"
READY = "window.Bokeh !== undefined && Bokeh.documents.length > 0 && Bokeh.documents.every(d => d.is_idle)"
# x range ids of the timeline plots: each run's Gantt (titled "<label>: median step ...") and the overlay.
TIME_RANGES_JS = r"""
(() => {
  const plots = [...Bokeh.documents[0].all_models].filter(m => m.x_range !== undefined && m.title
                 && m.title.text !== undefined);
  const timeline = plots.filter(p => p.title.text.includes(': median step')
                                || p.title.text.startsWith('allocated memory during'));
  return {n: timeline.length, ranges: [...new Set(timeline.map(p => p.x_range.id))].length,
          end: timeline.length ? timeline[0].x_range.end : null};
})()
"""


def test_compare_page_draws_offline_with_linked_time_axes(chromium: str, tmp_path: Path) -> None:
    for run in RUNS:
        if not run.is_dir():
            pytest.skip(f"sample recording {run} missing")
    runs = load_runs(RUNS, ["fsdp2", XSS], cache=False)
    result = build_compare(runs, tmp_path / "compare.html")
    with Browser(chromium, width=1400, height=900) as browser:
        browser.open(result.path.resolve().as_uri())
        assert browser.wait_for(READY, timeout_s=60)
        browser.pump(1.0)
        state = browser.evaluate(PAGE_STATE_JS)
        ranges = browser.evaluate(TIME_RANGES_JS)
        shot = browser.screenshot(tmp_path / "compare.png", full_page=True)
        plot_shots = [browser.screenshot(tmp_path / f"plot{i}.png", clip=box)
                      for i, box in enumerate(state["plots"]) if box["width"] > 0 and box["height"] > 0]
        log = browser.log
    assert log.exceptions == [] and log.console_errors == [] and log.dialogs == []
    assert [u for u in log.requests if not u.startswith("file://")] == []
    assert state["scripts_with_src"] == 0
    assert state["bokeh_documents"] == 1 and state["bokeh_idle"]
    assert state["sections"] == ["headline", "findings", "structure", "units", "timelines"]
    assert state["canvases"] >= 5  # structure strip, per-unit bars, 2 Gantts, memory overlay
    stddev, colours = image_stats(shot)
    assert stddev > 10 and colours > 20, "page screenshot looks blank"
    assert len(plot_shots) >= 5
    for path in plot_shots:
        stddev, colours = image_stats(path)
        assert stddev > 5 and colours > 8, f"{path.name} looks blank"
    # Two Gantts and the memory overlay on one shared range that spans the longer median step.
    assert ranges["n"] == 3 and ranges["ranges"] == 1
    assert ranges["end"] == pytest.approx(result.time_axis_ms * 1.01)
    text = state["text"]
    assert "★" in text and "Frameworks differ" in text
    assert XSS in state["title"] and text.count(XSS) >= 3  # shown as text, never run
    assert XSS not in result.path.read_text(encoding="utf-8")
