"""One standalone, offline HTML page from a :class:`Page` of sections (jinja2 + bokeh, inline JS).

Why the page is assembled here and not with ``hv.save`` or ``bokeh.io.save``: holoviews pulls in
panel, whose extension registers an ``es-module-shims`` script *URL* that bokeh adds to every page
(a network request, and 3 MB of panel JS when saved through ``hv.save``). Here the bokeh models
of all sections go into one bokeh document (so linked ranges work across sections), bokeh's own
JS and CSS are inlined from the bundle of the models actually used, and external script URLs are
dropped. A Content-Security-Policy meta tag then forbids the page any network request at all.

Safety: every string that comes from a trace (unit FQNs, kernel and lane names) reaches the page
either through this template, which autoescapes, or through bokeh models that draw text on a
canvas or escape it (titles, axis ticks, legends, ``@field`` tooltips, DataTable cells with the
default ``StringFormatter``). Nothing here uses bokeh ``Div``/``HTMLTemplateFormatter`` or jinja2's
``|safe`` on such strings; only bokeh's own script and div markup are marked safe.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from fsdpviz import __version__
from fsdpviz.report.glossary import mark_terms

TEMPLATE_NAME = "report.html.j2"


@dataclass(kw_only=True, slots=True)
class Fact:
    """One labelled number of a headline card row (``value`` is already formatted)."""

    label: str
    value: str
    hint: str = ""  # shown as a tooltip (title attribute) and under the value


_COLOR_RE = re.compile(r"^#[0-9a-fA-F]{6}$")


@dataclass(kw_only=True, slots=True)
class LegendItem:
    """A colour chip with a label, drawn in HTML (a legend of 80 units does not fit in a plot)."""

    label: str
    color: str  # "#rrggbb" only: it goes into a style attribute
    pattern: str = "solid"  # solid | hatched | strip

    def __post_init__(self) -> None:
        if not _COLOR_RE.match(self.color):
            raise ValueError(f"legend colour must be #rrggbb, got {self.color!r}")
        if self.pattern not in ("solid", "hatched", "strip"):
            raise ValueError(f"unknown legend pattern {self.pattern!r}")


@dataclass(kw_only=True, slots=True)
class TableCell:
    """One cell of an HTML table (plain text: the template escapes it)."""

    text: str
    sub: str = ""  # a smaller second line, e.g. the delta against the first run
    hint: str = ""  # tooltip (title attribute)
    best: bool = False  # marked as the best value of its row
    header: bool = False  # a row header
    left: bool = False  # text aligned left (lists, names); numbers stay right-aligned
    sort_key: float | None = None  # what a click on the column header sorts by (a number); None: the text


@dataclass(kw_only=True, slots=True)
class HtmlTable:
    """A table drawn in HTML (not bokeh): for tables whose cells need marks, such as best values."""

    columns: list[str]
    rows: list[list[TableCell]]
    caption: str = ""
    group_starts: set[int] = field(default_factory=set)  # row indices drawn with a separator above
    hints: list[str] = field(default_factory=list)  # per column: a definition shown on hover (title attribute)
    sortable: bool = False  # a click on a column header sorts the rows by that column
    left_columns: set[int] = field(default_factory=set)  # headers aligned left, over text columns
    key: str = ""  # an id for the table element ([a-z0-9-]), so that tests and links can find it


@dataclass(kw_only=True, slots=True)
class Section:
    """One section of the page: a title, a "how to read this" note and its content."""

    key: str  # anchor id, [a-z0-9-]
    title: str
    howto: str = ""
    notes: list[str] = field(default_factory=list)  # plain-text remarks (e.g. what was capped)
    facts: list[Fact] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)  # plain-text list items (findings)
    code: list[tuple[str, str]] = field(default_factory=list)  # (title, source) shown folded under the bullets
    legend: list[tuple[str, list[LegendItem]]] = field(default_factory=list)  # (group title, items)
    tables: list[HtmlTable] = field(default_factory=list)  # drawn before the plots
    # tab label -> holoviews object / bokeh model, or a list of them stacked in one column
    views: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True, slots=True)
class Page:
    """Everything the template needs; built by :mod:`fsdpviz.report.build`."""

    title: str
    subtitle: str = ""
    meta: list[Fact] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    generated: str = field(default_factory=lambda: _dt.datetime.now().astimezone().isoformat(timespec="seconds"))
    version: str = __version__


def _to_bokeh(view: Any) -> Any:
    """A holoviews object -> its bokeh model (canvas backend); a bokeh model passes through."""
    from bokeh.model import Model
    from bokeh.models import Plot, Toolbar

    if isinstance(view, Model):
        model = view
    else:
        import holoviews as hv

        model = hv.render(view, backend="bokeh")
    # holoviews defaults to WebGL, which is several times slower on a viewer without a GPU. One walk of
    # the model graph for both (each ``select`` walks all of it: 0.16-0.18 s of a small run's page,
    # benchmarks/bench_page_stages.py).
    for part in model.references():
        if isinstance(part, Plot):
            part.output_backend = "canvas"
        elif isinstance(part, Toolbar):
            part.logo = None
    return model


def _column(views: list[Any]) -> Any:
    """Several views stacked in one bokeh column (a table above its charts)."""
    from bokeh.layouts import column

    return column([_to_bokeh(view) for view in views], sizing_mode="stretch_width")


def _section_model(section: Section) -> Any | None:
    """The bokeh root of a section: its only view, or tabs when it has several."""
    if not section.views:
        return None
    models = {label: _column(view) if isinstance(view, list) else _to_bokeh(view)
              for label, view in section.views.items()}
    if len(models) == 1:
        return next(iter(models.values()))
    from bokeh.models import TabPanel, Tabs

    return Tabs(tabs=[TabPanel(child=model, title=label) for label, model in models.items()],
                sizing_mode="stretch_width")


class _Models:
    """Every model of a bokeh document, as bokeh's bundle reads a model's: its ``references()``. The
    document holds that set already; each root's ``references()`` walks its graph again (0.3 s of a
    small run's page)."""

    def __init__(self, doc: Any) -> None:
        self._doc = doc

    def references(self) -> set[Any]:
        return set(self._doc.models)


def _inline_resources(doc: Any) -> tuple[str, list[str]]:
    """Inline ``<script>`` tags and CSS texts for the models of ``doc``; script URLs are dropped (see
    module doc)."""
    from bokeh.embed.bundle import bundle_for_objs_and_resources
    from bokeh.resources import Resources

    bundle = bundle_for_objs_and_resources([_Models(doc)], Resources(mode="inline", log_level="warn"))
    return bundle.scripts(tag=True), list(bundle.css_raw)


def _environment() -> jinja2.Environment:
    # autoescape=True for every template, whatever its extension: names from traces pass through here.
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("fsdpviz.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["terms"] = mark_terms  # escapes, then marks the glossary's terms
    return env


def render_page(page: Page) -> str:
    """Render ``page`` to the text of one standalone HTML file."""
    from bokeh.embed import components

    doc, roots, section_roots = page_document(page)
    if doc is not None:
        # Bokeh's integrity checks walk every model of the document again and only log what they find
        # (0.4 s of a small run's 4 s render): a page's views are held to them in the tests instead
        # (tests/unit/test_report_document.py). Off for this document alone, which ``components`` uses
        # as it is (it holds every root), not through bokeh's process-wide setting.
        doc.validate = _not_validated
        script, divs = components(roots)
        js, css = _inline_resources(doc)
    else:
        script, divs, js, css = "", {}, "", []
    template = _environment().get_template(TEMPLATE_NAME)
    return template.render(
        page=page,
        plot_divs={section: [jinja2.utils.markupsafe.Markup(divs[key]) for key in keys]
                   for section, keys in section_roots.items()},
        bokeh_script=jinja2.utils.markupsafe.Markup(script),
        bokeh_js=jinja2.utils.markupsafe.Markup(js),
        bokeh_css=[jinja2.utils.markupsafe.Markup(text) for text in css],
    )


def page_document(page: Page) -> tuple[Any | None, dict[str, Any], dict[str, list[str]]]:
    """The bokeh document of ``page`` (None where no section has a view), its roots by key, and each
    section's root keys in order."""
    roots: dict[str, Any] = {}
    section_roots: dict[str, list[str]] = {}
    for section in page.sections:
        keys: list[str] = []
        views = list(section.views.values())
        if len(views) == 1 and isinstance(views[0], list):
            # A stack of views without tabs: one bokeh root each (a bokeh column of plots with
            # tools draws stray pixels at its left edge in bokeh 3.9).
            for i, view in enumerate(views[0]):
                roots[f"{section.key}-{i}"] = _to_bokeh(view)
                keys.append(f"{section.key}-{i}")
        else:
            model = _section_model(section)
            if model is not None:
                roots[section.key] = model
                keys.append(section.key)
        section_roots[section.key] = keys
    if not roots:
        return None, roots, section_roots
    # One document: ranges shared between sections stay linked. The roots join it in one freeze, so
    # bokeh walks the model graph once, not once per root added (a second of a small run's page).
    from bokeh.document import Document

    doc = Document()
    with doc.models.freeze():
        for model in roots.values():
            if model.document is not None:  # a page rendered again: its roots leave the last document
                model.document.remove_root(model)
            doc.add_root(model)
    return doc, roots, section_roots


def _not_validated() -> None:
    """A page's document's ``validate``: nothing (see :func:`render_page`)."""


def write_page(page: Page, path: str | Path) -> int:
    """Render ``page`` into ``path`` (written atomically); return the file size in bytes."""
    out = Path(path)
    text = render_page(page)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(out)
    except OSError:  # a full disk, or ``out`` is a folder: the previous page stays, nothing half-written
        tmp.unlink(missing_ok=True)
        raise
    return out.stat().st_size
