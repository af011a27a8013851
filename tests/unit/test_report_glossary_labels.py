"""The page's glossary marks (escaped text, one hover definition per term) and the placement of
the memory curve's peak labels (clear of each other and of the curves under them)."""

from __future__ import annotations

import numpy as np
from markupsafe import escape

from fsdpviz.report.glossary import TERMS, mark_terms
from fsdpviz.report.timeline import figure


def test_terms_get_a_definition_and_text_stays_escaped() -> None:
    text = "blocks.1 <b>x</b>: exposed 3 ms; prefetch lead 0.8 ms, prefetch lead again; issue depth 0"
    html = str(mark_terms(text))
    assert "<b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert html.count('<abbr class="term"') == 3  # exposed, prefetch lead (once), issue depth
    assert f'title="{escape(TERMS["prefetch lead"])}">prefetch lead</abbr> 0.8 ms, prefetch lead again' in html
    # a term inside a longer word or a hyphenated name is no use of the term
    assert "<abbr" not in str(mark_terms("unexposed overlapping pre-exposed"))


def _box(t: float, y: float, dy: float, text: str, x_range, y_range) -> tuple[float, float, float, float]:
    width_px, height_px = figure._LABEL_FRAME_PX
    x0 = (t - x_range[0]) / (x_range[1] - x_range[0]) * width_px + 4
    base = (y - y_range[0]) / (y_range[1] - y_range[0]) * height_px + dy
    return (x0, base, x0 + figure._LABEL_CHAR_PX * len(text), base + figure.LABEL_FONT_PX)


def test_peak_labels_clear_each_other_and_the_curve() -> None:
    # three peaks at the same time (the page's "(block)s.3"), one under a taller stretch of curve
    t = np.array([10.0, 10.0, 10.0, 30.0])
    y = np.array([1.0, 1.0, 0.9, 0.5])
    texts = ["(root)", "blocks.3", "blocks.2", "blocks.0"]
    curve_t = np.array([0.0, 29.0, 31.0, 32.0, 50.0])
    curve_y = np.array([0.2, 0.5, 1.2, 0.3, 0.3])  # from 31 to 32 ms the curve stands at 1.2
    x_range, y_range = (0.0, 50.0), (0.0, 1.6)
    dy = figure.label_offsets(t, y, texts, x_range=x_range, y_range=y_range, curves=[(curve_t, curve_y)])
    boxes = [_box(t[i], y[i], dy[i], texts[i], x_range, y_range) for i in range(len(texts))]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
    # the blocks.0 label (from 30 ms, ~50 px wide: past 31 ms) sits above the curve's 1.2 level
    level_px = 1.2 / 1.6 * figure._LABEL_FRAME_PX[1]
    assert boxes[3][1] >= level_px
    assert all(d >= 2.0 for d in dy)
