"""The report's bokeh document, held to bokeh's own checks that a user's render skips.

``render_page`` skips bokeh's validation of the page's document (a walk of every model that only logs)
and reads the bundle's JS and CSS from the document's set of models rather than from a walk of each
root: here the report pages of the FSDP2 and ZeRO-3 samples pass bokeh's integrity checks with no error
and no warning, and their bundle is the one bokeh makes from the roots themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from bokeh.core.validation.check import check_integrity
from bokeh.embed.bundle import bundle_for_objs_and_resources
from bokeh.resources import Resources
from bokeh.settings import settings

from fsdpviz.report.data import prepare_report
from fsdpviz.report.html import _inline_resources, page_document, render_page
from fsdpviz.report.page import build_page


@pytest.mark.parametrize("name", ["fsdp2-cpu-2rank", "zero3-cpu-2rank"])
def test_the_pages_document_passes_bokehs_checks_and_bundles_as_its_roots(
        name: str, sample_run: Callable[[str], Any]) -> None:
    page = build_page(prepare_report(sample_run(name)))
    doc, roots, _ = page_document(page)
    assert doc is not None and len(roots) >= 5
    models = set().union(*(root.references() for root in doc.roots))
    assert models == set(doc.models)
    issues = check_integrity(models)
    assert issues.error == [] and issues.warning == [], (issues.error, issues.warning)
    ours = _inline_resources(doc)
    bokehs = bundle_for_objs_and_resources(list(doc.roots), Resources(mode="inline", log_level="warn"))
    assert ours == (bokehs.scripts(tag=True), list(bokehs.css_raw))
    assert "BEGIN bokeh.min.js" in ours[0]


def test_a_table_in_a_tab_brings_the_widgets_and_tables_bundles() -> None:
    """A model a root's walk reaches only through a tab: bokeh adds the widgets' and tables' JS for it."""
    from bokeh.models import ColumnDataSource, DataTable, TableColumn, TabPanel, Tabs
    from bokeh.plotting import figure

    from fsdpviz.report.html import Page, Section

    chart = figure(height=120)
    chart.line([0, 1], [0, 1])
    table = DataTable(source=ColumnDataSource({"unit": ["a"]}), columns=[TableColumn(field="unit")])
    tabs = Tabs(tabs=[TabPanel(child=chart, title="chart"), TabPanel(child=table, title="table")])
    doc, _, _ = page_document(Page(title="t", sections=[Section(key="s", title="S", views={"v": tabs})]))
    assert doc is not None
    ours = _inline_resources(doc)
    bokehs = bundle_for_objs_and_resources(list(doc.roots), Resources(mode="inline", log_level="warn"))
    assert ours == (bokehs.scripts(tag=True), list(bokehs.css_raw))
    assert "BEGIN bokeh-widgets.min.js" in ours[0] and "BEGIN bokeh-tables.min.js" in ours[0]


def test_a_page_is_rendered_without_bokehs_validation_and_leaves_its_setting(
        caplog: pytest.LogCaptureFixture) -> None:
    """A page with an empty column, which bokeh's validation warns of (EMPTY_LAYOUT): its document's own
    validation logs the warning, rendering it logs nothing, and bokeh's setting is as it was."""
    from bokeh.layouts import column

    from fsdpviz.report.html import Page, Section

    def page() -> Page:
        return Page(title="t", sections=[Section(key="s", title="S", views={"v": column()})])

    settings.perform_document_validation.set_value(True)  # whatever the environment says
    try:
        with caplog.at_level(logging.WARNING, logger="bokeh"):
            render_page(page())
            assert not [r for r in caplog.records if r.name.startswith("bokeh")]
            doc, _, _ = page_document(page())
            assert doc is not None
            type(doc).validate(doc)  # bokeh's own check of the same page
            assert any("EMPTY_LAYOUT" in r.getMessage() for r in caplog.records), caplog.records
        assert settings.perform_document_validation() is True
    finally:
        settings.perform_document_validation.unset_value()
