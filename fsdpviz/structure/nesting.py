"""Which range encloses a point: the lookup behind every attribution to a unit.

CPU ranges on one thread nest (a ``record_function`` range closes before its parent does), so the
ranges of a lane form a forest. For many query points at once, :func:`innermost_enclosing` finds
the innermost range that contains each point: a binary search for the last range starting at or
before the point, then a walk up the parent links until a range still open at that instant. The
walk is vectorised over all points and takes as many rounds as the ranges nest deep (a handful).

Ranges are half-open ``[start, end)``: a launch at the very instant a label closes is outside it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdpviz.structure.categorical import as_str


def parent_links(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Parent index of each range (``-1`` for a top-level one); ranges sorted by (start, -end)."""
    parent = [-1] * len(starts)
    stack: list[int] = []
    # One pass over Python ints (indexing numpy arrays one element at a time costs ~3x more); labels
    # per lane are thousands, not millions.
    end_of = ends.tolist()
    for i, s in enumerate(starts.tolist()):
        while stack and end_of[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return np.array(parent, dtype=np.int64)


def innermost_in_lane(starts: np.ndarray, ends: np.ndarray, parent: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the innermost range containing each time ``t`` (``-1`` if none), one lane."""
    idx = np.searchsorted(starts, t, side="right") - 1
    if len(starts) == 0:
        return np.full(len(t), -1, dtype=np.int64)
    for _ in range(64):  # bounded: nesting depth
        open_ = idx >= 0
        bad = open_ & (ends[np.clip(idx, 0, None)] <= t)
        if not bad.any():
            break
        idx = np.where(bad, parent[np.clip(idx, 0, None)], idx)
    return idx


def innermost_enclosing(ranges: pd.DataFrame, points: pd.DataFrame) -> np.ndarray:
    """For each row of ``points`` (``rank``, ``lane``, ``t_ns``), the row position in ``ranges``
    (``rank``, ``lane``, ``start_ns``, ``end_ns``) of the innermost range containing it, else -1."""
    out = np.full(len(points), -1, dtype=np.int64)
    if ranges.empty or points.empty:
        return out
    r_rank = ranges["rank"].to_numpy()
    r_lane = as_str(ranges["lane"])
    p_rank = points["rank"].to_numpy()
    p_lane = as_str(points["lane"])
    p_t = points["t_ns"].to_numpy(np.int64)
    r_start = ranges["start_ns"].to_numpy(np.int64)
    r_end = ranges["end_ns"].to_numpy(np.int64)
    range_groups = pd.DataFrame({"rank": r_rank, "lane": r_lane}).groupby(["rank", "lane"], sort=False).indices
    point_groups = pd.DataFrame({"rank": p_rank, "lane": p_lane}).groupby(["rank", "lane"], sort=False).indices
    for key, p_idx in point_groups.items():
        r_idx = range_groups.get(key)
        if r_idx is None:
            continue
        order = np.lexsort((-r_end[r_idx], r_start[r_idx]))
        rows = r_idx[order]
        starts, ends = r_start[rows], r_end[rows]
        found = innermost_in_lane(starts, ends, parent_links(starts, ends), p_t[p_idx])
        out[p_idx] = np.where(found >= 0, rows[np.clip(found, 0, None)], -1)
    return out
