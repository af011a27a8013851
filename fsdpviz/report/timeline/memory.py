"""Plot data for the memory curve under the Gantt: the allocator curve of one step.

A GPU trace records one ``[memory]`` sample per allocation and free: tens of thousands per step,
more than a browser needs to draw a curve a thousand pixels wide. The analysis already thins each
rank's curve (``RunAnalysis.memory``, see ``fsdpviz.analysis.memory.curve``: per time bin the lowest
and highest sample, so every peak and trough survives) on the device it analyses -- the rank's GPU
when it has one, else its CPU allocator; this module cuts that curve to the drawn step.

With many ranks, one curve per rank turns into a thicket: the page draws the ranks with the
highest peaks (and rank 0), and says which ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from fsdpviz.analysis.memory_categories import CATEGORIES
from fsdpviz.formatting import NS_PER_MS
from fsdpviz.report.timeline.steps import StepChoice

MAX_MEMORY_RANKS = 4  # each curve is a holoviews element (~0.1 s to render); more is a thicket anyway


def choose_memory_ranks(memory: pd.DataFrame, max_ranks: int = MAX_MEMORY_RANKS) -> list[int]:
    """All ranks with samples when there are few; else rank 0 and the ranks with the highest peaks."""
    if memory.empty:
        return []
    peaks = memory.groupby("rank", observed=True)["allocated_bytes"].max().sort_values(
        ascending=False, kind="stable")
    ranks = sorted(int(r) for r in peaks.index)
    if len(ranks) <= max_ranks:
        return ranks
    chosen = [ranks[0]] + [int(r) for r in peaks.index if int(r) != ranks[0]][: max_ranks - 1]
    return sorted(chosen)


def memory_curves(memory: pd.DataFrame, choice: StepChoice, ranks: Sequence[int]) -> pd.DataFrame:
    """Allocated and reserved bytes of ``ranks`` during ``choice``'s step, x in ms from its origin.

    ``memory`` is the analysis' curve (``RunAnalysis.memory``, or ``fsdpviz.analysis.memory.curves``
    of the samples): one device per rank, already thinned with its peaks kept. Each curve starts
    with the last sample before the step (the level the step starts at) moved to the step's origin,
    so a step without allocations still shows its level. Returns ``rank``, ``device``, ``t_ns``,
    ``t_ms``, ``allocated_bytes``, ``reserved_bytes``.
    """
    cols = ["rank", "device", "t_ns", "t_ms", "allocated_bytes", "reserved_bytes"]
    if memory.empty or not ranks:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    parts: list[pd.DataFrame] = []
    for rank in ranks:
        mine = memory[(memory["rank"] == rank).to_numpy()].sort_values("t_ns", kind="stable")
        before = mine[mine["t_ns"] < choice.origin_ns].tail(1).copy()
        before["t_ns"] = choice.origin_ns
        inside = mine[(mine["t_ns"] >= choice.origin_ns) & (mine["t_ns"] <= choice.end_ns)]
        curve = pd.concat([before, inside], ignore_index=True)
        if curve.empty:
            continue
        # The level holds until the end of the step: repeat the last sample there.
        tail = curve.tail(1).copy()
        tail["t_ns"] = choice.end_ns
        parts.append(pd.concat([curve, tail], ignore_index=True))
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    out = pd.concat(parts, ignore_index=True)
    out["device"] = out["device"].astype(str)
    out["t_ms"] = (out["t_ns"] - choice.origin_ns) / NS_PER_MS
    return out[cols]


def category_curve(levels: pd.DataFrame, choice: StepChoice, rank: int) -> pd.DataFrame:
    """One rank's memory by category during ``choice``'s step (``levels``: the analysis'
    ``memory_categories``, memory_categories.CATEGORY_LEVELS), like :func:`memory_curves`: the level
    the step opens at moved to its origin, the last one held to its end. Columns ``t_ms`` and one
    per category; empty without levels for the rank."""
    cols = ["t_ms", *CATEGORIES]
    mine = levels[(levels["rank"] == rank).to_numpy()] if len(levels) else levels
    if mine.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    mine = mine.sort_values("t_ns", kind="stable")
    before = mine[mine["t_ns"] < choice.origin_ns].tail(1).assign(t_ns=choice.origin_ns)
    inside = mine[(mine["t_ns"] >= choice.origin_ns) & (mine["t_ns"] <= choice.end_ns)]
    curve = pd.concat([before, inside], ignore_index=True)
    if curve.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    curve = pd.concat([curve, curve.tail(1).assign(t_ns=choice.end_ns)], ignore_index=True)
    curve["t_ms"] = (curve["t_ns"] - choice.origin_ns) / NS_PER_MS
    return curve[cols]
