"""Colours and sentences shared by every view of the report (and of the compare page); times and
bytes are written by :mod:`fsdpviz.formatting`.

A unit keeps one colour on every plot of a page, and on every page of the same model: its colour
comes from its forward order in the run's unit table (``order``), so neighbouring units, which sit
side by side on a Gantt, always get different colours, and a colour does not depend on which
units happen to appear in the step or rank being drawn. A unit without a known order (a label seen
in a trace but absent from the unit table) gets a colour from a CRC-32 of its name: stable across
processes, unlike Python's salted ``hash``.

Red is kept out of the unit palette: it means "exposed communication" everywhere in the report.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Final

# Category20 without its reds and greys, dark hues first so that units 0..7 are the most distinct.
UNIT_PALETTE: Final = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5",
)
EXPOSED_COLOR: Final = "#d62728"
COMM_COLOR: Final = "#f58518"
COMPUTE_COLOR: Final = "#4c78a8"
OTHER_COLOR: Final = "#9d9d9d"
ALLOCATED_COLOR: Final = "#1f77b4"
RESERVED_COLOR: Final = "#7f7f7f"
# memory categories (fsdpviz.analysis.memory_categories.CATEGORIES), stacked bottom to top
MEMORY_CATEGORY_COLORS: Final = {
    "sharded_params": "#3b5b92", "optimizer_state": "#7b9fd6", "gradients": "#9467bd",
    "unsharded_params": "#2ca02c", "unsharded_grads": "#c5b0d5", "comm_buffers": "#f58518",
    "activations": "#e6c229", "other": "#b0b0b0",
}
# Backward spans are hatched so that phase reads without relying on colour.
PHASE_HATCH: Final = {"forward": " ", "backward": "/", "optimizer": "."}

def unit_color(unit: str, order: int | None) -> str:
    """The colour of ``unit``: by forward order when known, else by a stable hash of its name."""
    if order is not None and order >= 0:
        return UNIT_PALETTE[order % len(UNIT_PALETTE)]
    return UNIT_PALETTE[zlib.crc32(unit.encode("utf-8")) % len(UNIT_PALETTE)]


def unit_colors(units: Iterable[str], orders: Mapping[str, int] | None = None) -> dict[str, str]:
    """Map each unit name to its colour (see :func:`unit_color`)."""
    orders = orders or {}
    return {unit: unit_color(unit, orders.get(unit)) for unit in units}


def sentence(text: str) -> str:
    """``text`` as a sentence: a capital first letter and a final full stop."""
    text = str(text).strip()
    return (text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")) if text else text
