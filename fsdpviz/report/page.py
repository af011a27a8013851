"""Report data -> a :class:`~fsdpviz.report.html.Page`: the sections in reading order.

Each section's words and plots live with the section (``headline``, ``timeline.section``,
``units.section``, ``steps.section``); numbers come formatted from the data, never computed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fsdpviz.report.headline import headline_section
from fsdpviz.report.html import Fact, Page
from fsdpviz.report.predictions import predictions_section
from fsdpviz.report.steps.section import steps_section
from fsdpviz.report.timeline.section import timeline_section
from fsdpviz.report.units.section import units_section

if TYPE_CHECKING:
    from fsdpviz.report.data import ReportData


def build_page(data: ReportData) -> Page:
    """All sections, in reading order."""
    sections = [headline_section(data), timeline_section(data)]
    units = units_section(data)
    if units is not None:
        sections.append(units)
    sections.append(steps_section(data))
    predicted = predictions_section(data)
    if predicted is not None:
        sections.append(predicted)
    return Page(title=data.title, subtitle=data.subtitle,
                meta=[Fact(label=k, value=v) for k, v in data.meta], sections=sections)
