"""Colours and number formats shared by every view of the report (and of the compare page).

A unit keeps one colour on every plot of a page, and on every page of the same model: its colour
comes from its forward order in the run's unit table (``order``), so neighbouring units, which sit
side by side on a Gantt, always get different colours, and a colour does not depend on which
units happen to appear in the step or rank being drawn. A unit without a known order (a label seen
in a trace but absent from the unit table) gets a colour from a CRC-32 of its name: stable across
processes, unlike Python's salted ``hash``.

Red is kept out of the unit palette: it means "exposed communication" everywhere in the report.
"""

from __future__ import annotations

import math
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

NS_PER_MS: Final = 1_000_000
KIB: Final = 1024
MIB: Final = 1024**2
GIB: Final = 1024**3


def unit_color(unit: str, order: int | None) -> str:
    """The colour of ``unit``: by forward order when known, else by a stable hash of its name."""
    if order is not None and order >= 0:
        return UNIT_PALETTE[order % len(UNIT_PALETTE)]
    return UNIT_PALETTE[zlib.crc32(unit.encode("utf-8")) % len(UNIT_PALETTE)]


def unit_colors(units: Iterable[str], orders: Mapping[str, int] | None = None) -> dict[str, str]:
    """Map each unit name to its colour (see :func:`unit_color`)."""
    orders = orders or {}
    return {unit: unit_color(unit, orders.get(unit)) for unit in units}


def bytes_scale(max_bytes: float) -> tuple[float, str]:
    """Divisor and unit name (GiB, MiB or KiB) that show ``max_bytes`` with a readable number."""
    if max_bytes >= GIB:
        return float(GIB), "GiB"
    if max_bytes >= MIB:
        return float(MIB), "MiB"
    return float(KIB), "KiB"


def format_bytes(n_bytes: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; unknown (negative / NaN / None) -> ``""``."""
    if n_bytes is None or (isinstance(n_bytes, float) and math.isnan(n_bytes)) or n_bytes < 0:
        return ""
    if n_bytes < KIB:
        return f"{int(n_bytes)} B"
    divisor, name = bytes_scale(float(n_bytes))
    return f"{n_bytes / divisor:.3g} {name}" if n_bytes / divisor < 100 else f"{n_bytes / divisor:.0f} {name}"


def format_ms(ms: float | None) -> str:
    """A duration in ms with three significant digits; unknown -> ``"n/a"``."""
    if ms is None or (isinstance(ms, float) and math.isnan(ms)):
        return "n/a"
    if abs(ms) >= 100:
        return f"{ms:.0f} ms"
    if abs(ms) >= 1 or ms == 0:
        return f"{ms:.3g} ms"
    return f"{ms * 1000:.3g} µs"


def format_pct(pct: float | None) -> str:
    """A percentage with one decimal; unknown -> ``"n/a"``."""
    if pct is None or (isinstance(pct, float) and math.isnan(pct)):
        return "n/a"
    return f"{pct:.1f} %"


def sentence(text: str) -> str:
    """``text`` as a sentence: a capital first letter and a final full stop."""
    text = str(text).strip()
    return (text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")) if text else text


def format_change(before: float | None, after: float | None, unit: str) -> str:
    """``after`` against ``before``: ``+1.2 ms (+3.4 %)`` or ``−3.0 MiB (−8.1 %)``; "" if either is unknown."""
    if before is None or after is None:
        return ""
    diff = float(after) - float(before)
    text = ("+" if diff >= 0 else "−") + (format_bytes(abs(diff)) or "0 B") if unit == "bytes" else f"{diff:+.3g} ms"
    return text + (f" ({100 * diff / float(before):+.1f} %)" if before else "")

