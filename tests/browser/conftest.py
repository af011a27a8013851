"""Browser-test fixtures: a headless Chromium (skipped with a reason when none is installed) and a
helper that opens a report and reports what the page did and drew."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from .cdp import Browser, PageLog, find_chromium

# Walks the light DOM and every shadow root (bokeh renders into shadow roots) and reports what a
# reader would see: bokeh documents, canvases with a size, <img> elements, and the visible text.
PAGE_STATE_JS = r"""
(() => {
  const all = [];
  const texts = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      all.push(el);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  for (const el of all) {
    for (const node of el.childNodes) {
      if (node.nodeType === Node.TEXT_NODE && node.textContent.trim()) texts.push(node.textContent);
    }
  }
  const canvases = all.filter(e => e.tagName === 'CANVAS' && e.width > 0 && e.height > 0);
  const docs = (window.Bokeh && Bokeh.documents) ? Bokeh.documents : [];
  const plots = Array.from(document.querySelectorAll('div.plot')).map(d => {
    const r = d.getBoundingClientRect();
    return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height};
  });
  return {
    bokeh_documents: docs.length,
    bokeh_idle: docs.length > 0 && docs.every(d => d.is_idle),
    bokeh_roots: docs.reduce((n, d) => n + d.roots().length, 0),
    canvases: canvases.length,
    imgs: all.filter(e => e.tagName === 'IMG').map(e => e.getAttribute('src')),
    scripts_with_src: all.filter(e => e.tagName === 'SCRIPT' && e.getAttribute('src')).length,
    sections: Array.from(document.querySelectorAll('main > section')).map(s => s.id),
    plots: plots,
    title: document.title,
    text: texts.join('\n'),
  };
})()
"""


@dataclass
class OpenedPage:
    """What a report did in the browser."""

    log: PageLog
    state: dict[str, Any]
    screenshot: Path
    plot_shots: list[Path] = field(default_factory=list)
    browser: Browser | None = None  # still open until the test ends (for hovering, clicking)


@pytest.fixture(scope="session")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("headless Chromium not installed (Debian: apt-get install chromium); .ci/run installs it")
    return path


@pytest.fixture(scope="session")
def sample_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of the bundled FSDP2 CPU sample, built once per session; tests only open and read it."""
    from fsdpviz.analysis.pipeline import analyse_traces
    from fsdpviz.report.build import build_report
    from fsdpviz.trace import load_traces

    sample = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"
    out = tmp_path_factory.mktemp("sample-report") / "report.html"
    return build_report(analyse_traces(load_traces([sample], cache=False)), out).path


@pytest.fixture
def open_report(chromium: str, tmp_path: Path) -> Iterator[Any]:
    """``open_report(html_path)`` -> :class:`OpenedPage` (full-page and per-plot screenshots)."""
    browsers: list[Browser] = []

    def _open(html: Path, *, settle_s: float = 1.0) -> OpenedPage:
        browser = Browser(chromium, width=1400, height=900)
        browsers.append(browser)
        browser.open(html.resolve().as_uri())
        browser.wait_for("window.Bokeh !== undefined && Bokeh.documents.length > 0 && "
                         "Bokeh.documents.every(d => d.is_idle)", timeout_s=60)
        browser.pump(settle_s)
        state = browser.evaluate(PAGE_STATE_JS)
        shot = browser.screenshot(tmp_path / f"{html.stem}.png", full_page=True)
        plot_shots = []
        for i, box in enumerate(state["plots"]):
            if box["width"] > 0 and box["height"] > 0:
                plot_shots.append(browser.screenshot(tmp_path / f"{html.stem}-plot{i}.png", clip=box))
        browser.pump(0.2)
        return OpenedPage(log=browser.log, state=state, screenshot=shot, plot_shots=plot_shots, browser=browser)

    yield _open
    for browser in browsers:
        browser.close()


def image_stats(path: Path) -> tuple[float, int]:
    """(pixel standard deviation over grey levels, number of distinct colours) of a PNG."""
    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(path.read_bytes())) as img:
        rgb = img.convert("RGB")
        grey = rgb.convert("L")
        stddev = ImageStat.Stat(grey).stddev[0]
        colours = rgb.getcolors(maxcolors=1 << 20)
        return stddev, len(colours) if colours is not None else 1 << 20


# Where on screen (CSS px) a Gantt bar whose ``field`` equals ``value`` is drawn: walks bokeh's view
# tree for a glyph renderer whose data has that value, scrolls its plot into view and maps the bar's
# centre through the plot's scales.
BAR_POSITION_JS = r"""
((field, value) => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views ?? [])) walk(c); };
  for (const v of Object.values(Bokeh.index)) walk(v);
  for (const v of views) {
    if (!v.renderer_views) continue;
    for (const [model, rv] of v.renderer_views) {
      const data = model.data_source?.data;
      if (!data || !data[field] || !data.left) continue;
      const i = Array.from(data[field]).findIndex(u => u === value);
      if (i < 0) continue;
      v.el.scrollIntoView();
      const rect = v.canvas_view.el.getBoundingClientRect();
      return {x: rect.left + v.frame.x_scale.compute((data.left[i] + data.right[i]) / 2),
              y: rect.top + v.frame.y_scale.compute((data.bottom[i] + data.top[i]) / 2)};
    }
  }
  return null;
})
"""

TOOLTIP_TEXT_JS = r"""
(() => {
  const out = [];
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if ([...el.classList].some(c => c.includes('tooltip'))) out.push(el.textContent);
      if (el.shadowRoot) walk(el.shadowRoot);
    }
  };
  walk(document);
  return out.join('\n');
})()
"""


def hover_bar(page: OpenedPage, field_name: str, value: str) -> str:
    """Move the mouse onto the first Gantt bar with ``field_name == value``; return the tooltip text."""
    import json

    assert page.browser is not None
    point = page.browser.evaluate(f"{BAR_POSITION_JS}({json.dumps(field_name)}, {json.dumps(value)})")
    assert point is not None, f"no bar with {field_name} == {value!r} on the page"
    page.browser.pump(0.3)
    page.browser.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=point["x"], y=point["y"])
    page.browser.pump(1.0)
    return str(page.browser.evaluate(TOOLTIP_TEXT_JS))
