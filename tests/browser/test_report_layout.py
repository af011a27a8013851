"""The report reads without cut text at 1400 and 1920 px: checked in headless Chromium's layout.

One report of the CPU sample recording, opened once at 1400 px and resized to 1920 px (bokeh
lays its plots out again; the page is not reloaded). At each width the test reads the layout the
browser computed, not the HTML the code wrote:

- no text box is cut: every table header and cell, fact card, legend item, tab title and section
  heading has ``scrollWidth <= clientWidth``, and the page itself scrolls only downwards;
- the unit table's headers each name a unit (ms, KiB/MiB/GiB, count) or hold text, and carry a
  definition on hover (title attribute) for its terms (exposed, prefetch lead);
- the peak labels of the memory curve, measured with the canvas' own text metrics at the screen
  positions bokeh computed, overlap neither each other nor any drawn curve, and stay in the plot;
- every legend drawn in a plot lies outside the plot area (it covers no bar or curve);
- the optimizer step and ``zero_grad`` are named on the units Gantt, and each gloo lane has the
  same name on every rank.

Screenshots of both widths are saved under the test's ``tmp_path`` so that a failure can be seen.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .cdp import Browser

pytestmark = pytest.mark.browser

WIDTHS = (1400, 1920)

# Every element whose text a reader must see whole, in the light DOM and in bokeh's shadow roots:
# which of them is cut (scrollWidth > clientWidth), and whether the page scrolls sideways.
CLIPPED_JS = r"""
(() => {
  const selectors = ['th', 'td', '.fact .label', '.fact .value', '.fact .hint', '.legend .item', 'nav a',
                     'h1', 'h2', '.bk-tab', '.slick-column-name', '.slick-header-column'];
  const found = [];
  const walk = (root) => {
    for (const sel of selectors) for (const el of root.querySelectorAll(sel)) found.push(el);
    for (const el of root.querySelectorAll('*')) if (el.shadowRoot) walk(el.shadowRoot);
  };
  walk(document);
  const cut = found.filter(el => el.getClientRects().length > 0 && el.scrollWidth > el.clientWidth + 1)
                   .map(el => `${el.tagName.toLowerCase()}.${el.className}: ${el.textContent.trim().slice(0, 60)}`
                              + ` (${el.scrollWidth} > ${el.clientWidth})`);
  return {checked: found.length, cut: cut,
          page_width: document.documentElement.scrollWidth, viewport: window.innerWidth};
})()
"""

# The unit table: headers (text and title) and the number of body rows.
UNIT_TABLE_JS = r"""
(() => {
  const table = document.getElementById('unit-table');
  if (!table) return null;
  return {headers: Array.from(table.tHead.rows[0].cells).map(th => ({text: th.textContent.trim(),
                                                                      title: th.getAttribute('title') || ''})),
          rows: table.tBodies[0].rows.length,
          terms: Array.from(document.querySelectorAll('abbr.term')).map(a => [a.textContent, a.title])};
})()
"""

# Clicks the unit table's "exposed comm" header twice; the column's values after each click.
SORT_JS = r"""
(() => {
  const table = document.getElementById('unit-table');
  const i = Array.from(table.tHead.rows[0].cells).findIndex(th => th.textContent.startsWith('exposed comm'));
  const values = () => Array.from(table.tBodies[0].rows).map(r => parseFloat(r.cells[i].textContent));
  table.tHead.rows[0].cells[i].click();
  const up = values();
  table.tHead.rows[0].cells[i].click();
  return {up: up, down: values()};
})()
"""

# Walks bokeh's view tree: for every plot, its frame box and canvas position; the boxes of its
# legends; the boxes of its LabelSet texts (canvas text metrics at bokeh's screen positions and
# offsets, baseline bottom, align left) and the screen points of its Step curves.
PLOT_GEOMETRY_JS = r"""
(() => {
  const views = [];
  const walk = (v) => { views.push(v); for (const c of (v.child_views ?? [])) walk(c); };
  for (const v of Object.values(Bokeh.index)) walk(v);
  const ctx = document.createElement('canvas').getContext('2d');
  const plots = [];
  for (const v of views) {
    if (!v.renderer_views || !v.frame) continue;
    const f = v.frame.bbox;
    const plot = {title: v.model.title?.text ?? '', frame: [f.left, f.top, f.right, f.bottom],
                  legends: [], labels: [], curves: [], visible: v.el.getClientRects().length > 0};
    for (const [model, rv] of v.renderer_views) {
      if (model.type === 'Legend' && rv.bbox) {
        const b = rv.bbox;
        plot.legends.push([b.left, b.top, b.right, b.bottom]);
      } else if (model.type === 'LabelSet' && rv.sx) {
        ctx.font = rv.visuals.text.font_value(0);
        for (let i = 0; i < rv.sx.length; i++) {
          const text = String(rv.text.get ? rv.text.get(i) : rv.text[i]);
          const xo = rv.x_offset.get ? rv.x_offset.get(i) : rv.x_offset[i];
          const yo = rv.y_offset.get ? rv.y_offset.get(i) : rv.y_offset[i];
          const m = ctx.measureText(text);
          const x = rv.sx[i] + xo, y = rv.sy[i] - yo;
          plot.labels.push({text, box: [x, y - m.fontBoundingBoxAscent - m.fontBoundingBoxDescent,
                                        x + m.width, y]});
        }
      } else if (model.type === 'GlyphRenderer' && rv.glyph?.model?.type === 'Step' && rv.glyph.sx) {
        plot.curves.push({xs: Array.from(rv.glyph.sx), ys: Array.from(rv.glyph.sy)});
      }
    }
    plots.push(plot);
  }
  return plots;
})()
"""

# The units Gantt: its lane labels (y tick overrides) and the names its bars carry.
GANTT_JS = r"""
(() => {
  const out = {lanes: [], units: []};
  for (const doc of Bokeh.documents) for (const m of doc._all_models.values()) {
    const overrides = m.type === 'LinearAxis' ? m.major_label_overrides : null;
    if (overrides) {
      const labels = overrides instanceof Map ? overrides.values() : Object.values(overrides);
      for (const label of labels) out.lanes.push(String(label));
    }
    const data = m.type === 'ColumnDataSource' ? m.data : null;
    const units = data ? (data instanceof Map ? data.get('unit_name') : data.unit_name) : null;
    if (units) out.units.push(...Array.from(units).map(String));
  }
  return out;
})()
"""


def _overlap(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _crosses(box: list[float], xs: list[float], ys: list[float]) -> bool:
    """Whether a step curve (level held until the next point, then a vertical jump) enters ``box``."""
    x0, y0, x1, y1 = box
    for i in range(len(xs) - 1):
        # horizontal piece at ys[i] from xs[i] to xs[i+1], then vertical at xs[i+1] from ys[i] to ys[i+1]
        if y0 < ys[i] < y1 and min(xs[i], xs[i + 1]) < x1 and max(xs[i], xs[i + 1]) > x0:
            return True
        if x0 < xs[i + 1] < x1 and min(ys[i], ys[i + 1]) < y1 and max(ys[i], ys[i + 1]) > y0:
            return True
    return False


def _check_layout(browser: Browser, width: int, tmp_path: Path) -> None:
    shot = browser.screenshot(tmp_path / f"report-{width}.png", full_page=True)
    assert shot.stat().st_size > 50_000, f"{shot} looks empty"

    clipped = browser.evaluate(CLIPPED_JS)
    assert clipped["checked"] > 50, clipped
    assert clipped["cut"] == [], f"cut at {width} px (see {shot}): {clipped['cut']}"
    assert clipped["page_width"] <= clipped["viewport"], f"page scrolls sideways at {width} px (see {shot})"

    plots = browser.evaluate(PLOT_GEOMETRY_JS)
    shown = [p for p in plots if p["visible"]]
    assert len(shown) >= 8, [p["title"] for p in plots]
    for plot in shown:
        for legend in plot["legends"]:
            assert not _overlap(legend, plot["frame"]), \
                f"legend {legend} covers the plot area {plot['frame']} of {plot['title']!r} at {width} px (see {shot})"
    labelled = [p for p in shown if p["labels"]]
    assert labelled, "no peak labels drawn"
    for plot in labelled:
        labels = plot["labels"]
        assert len(plot["curves"]) >= 2  # both ranks' allocated memory
        for i, a in enumerate(labels):
            x0, y0, x1, y1 = plot["frame"]
            assert x0 <= a["box"][0] and a["box"][2] <= x1 and y0 <= a["box"][1] and a["box"][3] <= y1, \
                f"label {a['text']!r} {a['box']} leaves the plot area {plot['frame']} (see {shot})"
            for b in labels[i + 1:]:
                assert not _overlap(a["box"], b["box"]), f"labels {a} and {b} overlap at {width} px (see {shot})"
            for curve in plot["curves"]:
                assert not _crosses(a["box"], curve["xs"], curve["ys"]), \
                    f"label {a['text']!r} covers a memory curve at {width} px (see {shot})"


def test_report_layout_at_1400_and_1920_px(chromium: str, sample_report: Path, tmp_path: Path) -> None:
    report = sample_report  # the bundled FSDP2 CPU sample's page (tests/browser/conftest.py)
    with Browser(chromium, width=WIDTHS[0], height=900) as browser:
        browser.open(report.resolve().as_uri())
        ready = ("window.Bokeh !== undefined && Bokeh.documents.length > 0 && "
                 "Bokeh.documents.every(d => d.is_idle)")
        assert browser.wait_for(ready, timeout_s=60)
        browser.pump(1.0)
        assert browser.log.exceptions == [] and browser.log.console_errors == []

        table = browser.evaluate(UNIT_TABLE_JS)
        assert table is not None and table["rows"] == 3  # (root), blocks.0, blocks.1
        for header in table["headers"]:
            text = header["text"]
            assert re.search(r"\((ms|KiB|MiB|GiB|count)\)$", text) or text in {
                "#", "unit", "parameters counted"}, f"header without a unit: {text!r}"
            assert header["title"], f"header {text!r} has no definition on hover"
        titles = {h["text"]: h["title"] for h in table["headers"]}
        assert "waited" in titles["exposed comm (ms)"]
        assert "Negative" in titles["forward prefetch lead (ms)"]
        terms = {text.lower(): title for text, title in table["terms"]}
        assert {"exposed communication", "prefetch lead"} <= set(terms)

        # a click on a header sorts the rows by that column's numbers, descending on a second click
        order = browser.evaluate(SORT_JS)
        assert order["up"] == sorted(order["up"]) and order["down"] == sorted(order["down"], reverse=True)
        assert len(order["up"]) == 3 and order["up"] != order["down"]

        gantt = browser.evaluate(GANTT_JS)
        assert "optimizer step" in gantt["units"] and "zero_grad" in gantt["units"]
        assert "(no unit)" not in gantt["units"]
        roles: dict[str, set[str]] = {}
        for label in gantt["lanes"]:
            match = re.match(r"rank \d+ · (gloo \d+) · (.+)$", label)
            if match:
                roles.setdefault(match[1], set()).add(match[2])
        assert len(roles) == 2 and all(len(r) == 1 for r in roles.values()), roles

        _check_layout(browser, WIDTHS[0], tmp_path)
        browser.call("Emulation.setDeviceMetricsOverride", session=True, width=WIDTHS[1], height=900,
                     deviceScaleFactor=1, mobile=False)
        browser.pump(1.5)  # bokeh's resize observers lay the plots out again
        assert browser.wait_for(ready, timeout_s=30)
        _check_layout(browser, WIDTHS[1], tmp_path)
        assert browser.log.exceptions == [] and browser.log.console_errors == []
