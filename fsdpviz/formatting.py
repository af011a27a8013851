"""Times and bytes, as numbers and as text: every unit conversion and every way fsdpviz writes them.

Numbers (the summary's and the predictions' JSON): :func:`ms` (ns -> ms rounded to the µs, None where
there is no number) and :func:`rounded_ms`. Text, by where it is read:

- the report page: :func:`format_ms`, :func:`format_bytes` (three significant digits, the unit that
  reads best), :func:`format_pct`, :func:`format_change`, :func:`bytes_scale` (an axis' unit);
- the terminal and the findings' sentences: :func:`ms_text` (``12.34 ms``), :func:`bytes_text`
  (``1.50 GiB``), :func:`mib_text` and :func:`change_text` (``whatif``'s fixed MiB columns).

Imports nothing, so that every layer may use it (docs/architecture.md).
"""

from __future__ import annotations

import math
from typing import Final

NS_PER_US: Final = 1_000
NS_PER_MS: Final = 1_000_000
KIB: Final = 1024
MIB: Final = 1024**2
GIB: Final = 1024**3


# --- numbers ---------------------------------------------------------------------------------------

def rounded_ms(ns: float) -> float:
    """ns -> ms, rounded to the µs."""
    return round(ns / NS_PER_MS, 3)


def ms(ns: float | None) -> float | None:
    """ns -> ms rounded to the µs; None for no number (None, NaN, infinite)."""
    return None if ns is None or not math.isfinite(float(ns)) else round(float(ns) / NS_PER_MS, 3)


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# --- the report page -------------------------------------------------------------------------------

def bytes_scale(max_bytes: float) -> tuple[float, str]:
    """Divisor and unit name (GiB, MiB or KiB) that show ``max_bytes`` with a readable number."""
    if max_bytes >= GIB:
        return float(GIB), "GiB"
    if max_bytes >= MIB:
        return float(MIB), "MiB"
    return float(KIB), "KiB"


def format_bytes(n_bytes: float | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; unknown (negative / NaN / None) -> ``""``."""
    if n_bytes is None or _missing(n_bytes) or n_bytes < 0:
        return ""
    if n_bytes < KIB:
        return f"{int(n_bytes)} B"
    divisor, name = bytes_scale(float(n_bytes))
    return f"{n_bytes / divisor:.3g} {name}" if n_bytes / divisor < 100 else f"{n_bytes / divisor:.0f} {name}"


def format_ms(value_ms: float | None) -> str:
    """A duration in ms with three significant digits; unknown -> ``"n/a"``."""
    if value_ms is None or _missing(value_ms):
        return "n/a"
    if abs(value_ms) >= 100:
        return f"{value_ms:.0f} ms"
    if abs(value_ms) >= 1 or value_ms == 0:
        return f"{value_ms:.3g} ms"
    return f"{value_ms * 1000:.3g} µs"


def format_pct(pct: float | None) -> str:
    """A percentage with one decimal; unknown -> ``"n/a"``."""
    if pct is None or _missing(pct):
        return "n/a"
    return f"{pct:.1f} %"


def format_change(before: float | None, after: float | None, unit: str) -> str:
    """``after`` against ``before``: ``+1.2 ms (+3.4 %)`` or ``−3.0 MiB (−8.1 %)``; "" if either is unknown."""
    if before is None or after is None:
        return ""
    diff = float(after) - float(before)
    text = ("+" if diff >= 0 else "−") + (format_bytes(abs(diff)) or "0 B") if unit == "bytes" else f"{diff:+.3g} ms"
    return text + (f" ({100 * diff / float(before):+.1f} %)" if before else "")


# --- the terminal and the findings -----------------------------------------------------------------

def ms_text(value_ms: float) -> str:
    """``12.34 ms``: two decimals."""
    return f"{value_ms:.2f} ms"


def bytes_text(value: float | None) -> str:
    """Two decimals in the largest unit that is at least one (``1.50 GiB``), whole bytes below 1 KiB;
    ``-`` for no number."""
    if value is None:
        return "-"
    size = abs(value)
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if size >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{int(value)} B"


# Below this many MiB the MiB columns show hundredths: a small run's peaks and changes (a 1.35 MiB peak, a
# +0.10 MiB change) would otherwise read as 1.4 and +0.0.
FINE_MIB: Final = 10.0


def _mib(value: float, sign: str = "") -> str:
    mib = value / MIB
    # decided on the figure as shown: 9.996 MiB reads 10.0, not 10.00
    return f"{mib:{sign},.2f} MiB" if round(abs(mib), 2) < FINE_MIB else f"{mib:{sign},.1f} MiB"


def mib_text(value: float | None) -> str:
    """``1,234.5 MiB`` (``1.35 MiB`` below :data:`FINE_MIB`); ``-`` for no number."""
    return "-" if value is None else _mib(value)


def mib_change_text(diff: float) -> str:
    """A change in MiB with its sign: ``+12.3 MiB``, ``+0.10 MiB`` below :data:`FINE_MIB`."""
    return _mib(diff, "+")


def change_text(before: float | None, after: float | None, unit: str) -> str:
    """``after`` against ``before`` in fixed units: ``+12.3 MiB (+4.5 %)`` or ``-1.25 ms (-0.3 %)``;
    "" if either is unknown."""
    if before is None or after is None:
        return ""
    diff = after - before
    text = mib_change_text(diff) if unit == "bytes" else f"{diff:+,.2f} ms"
    return text + (f" ({100 * diff / before:+.1f} %)" if before else "")
