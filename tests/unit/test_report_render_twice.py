"""A page rendered twice: its bokeh roots join the second render's document as they joined the first's,
and a range two sections share stays one model in both pages."""

from __future__ import annotations

import re

from bokeh.models import Range1d
from bokeh.plotting import figure

from fsdpviz.report.html import Page, Section, render_page


def _page() -> Page:
    shared = Range1d(0, 10)
    top, bottom = figure(x_range=shared, height=120), figure(x_range=shared, height=120)
    top.line([0, 5, 10], [1, 3, 2])
    bottom.scatter([1, 4, 9], [2, 2, 5])
    return Page(title="twice", sections=[Section(key="top", title="Top", views={"a": top}),
                                         Section(key="bottom", title="Bottom", views={"b": bottom})])


def test_a_page_renders_again_with_the_same_roots_and_the_shared_range() -> None:
    page = _page()
    first, second = render_page(page), render_page(page)
    shared = page.sections[0].views["a"].x_range
    assert shared is page.sections[1].views["b"].x_range
    for html in (first, second):
        assert html.count('"name":"Range1d"') == 1  # the shared range: one model, both plots refer to it
        assert f'"id":"{page.sections[0].views["a"].id}"' in html and f'"id":"{page.sections[1].views["b"].id}"' in html
    roots = [sorted(re.findall(r'data-root-id="([^"]+)"', html)) for html in (first, second)]
    assert roots[0] == roots[1] and len(roots[0]) == 2
