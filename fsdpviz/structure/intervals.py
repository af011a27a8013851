"""Interval arithmetic: the one home of union, intersection, difference and coverage of time.

Two shapes, one set of rules (half-open ``[start, end)`` intervals of int64 nanoseconds):

- :data:`Intervals`: a pair ``(starts, ends)`` of numpy arrays, the analysis' unions of time (a
  rank's communication, its compute, a window's framework labels). The functions return them
  *normalised*: sorted, disjoint, non-empty, touching ones merged. They work in O(n log n) without
  Python loops, so a rank with a million kernels costs milliseconds.
- Rows of a DataFrame with ``start_ns`` / ``end_ns`` and key columns (the report's Gantt segments):
  :func:`merge_rows` unites them per key, :func:`cover_rows` cuts them to another table's
  intervals, :func:`clip_rows` to a window.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

Intervals = tuple[np.ndarray, np.ndarray]

_EMPTY = np.zeros(0, dtype=np.int64)


def empty_intervals() -> Intervals:
    """No time at all."""
    return _EMPTY.copy(), _EMPTY.copy()


def union_intervals(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge possibly overlapping ``[start, end)`` intervals into a normalised union."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return empty_intervals()
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # A new group starts where an interval begins after everything before it has ended.
    new_group = np.empty(len(starts), dtype=bool)
    new_group[0] = True
    new_group[1:] = starts[1:] > reach[:-1]
    group_starts = np.flatnonzero(new_group)
    group_ends = np.append(group_starts[1:], len(starts)) - 1
    return starts[group_starts], reach[group_ends]


def total_ns(intervals: Intervals) -> int:
    """Total length of normalised intervals."""
    starts, ends = intervals
    return int((ends - starts).sum()) if len(starts) else 0


def _segments(a: Intervals, b: Intervals) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Elementary segments between all boundaries, with whether each lies in ``a`` and in ``b``."""
    bounds = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    if len(bounds) < 2:
        return _EMPTY, _EMPTY, np.zeros(0, bool), np.zeros(0, bool)
    seg_start, seg_end = bounds[:-1], bounds[1:]
    return seg_start, seg_end, covers(a, seg_start), covers(b, seg_start)


def covers(iv: Intervals, t: np.ndarray) -> np.ndarray:
    """Whether each time ``t`` lies inside normalised ``iv`` (start inclusive, end exclusive)."""
    starts, ends = iv
    if len(starts) == 0:
        return np.zeros(len(t), dtype=bool)
    idx = np.searchsorted(starts, t, side="right") - 1
    return (idx >= 0) & (t < ends[np.clip(idx, 0, None)])


def _from_mask(seg_start: np.ndarray, seg_end: np.ndarray, mask: np.ndarray) -> Intervals:
    return union_intervals(seg_start[mask], seg_end[mask])


def intersect_intervals(a: Intervals, b: Intervals) -> Intervals:
    """Time in both ``a`` and ``b``."""
    seg_start, seg_end, in_a, in_b = _segments(a, b)
    return _from_mask(seg_start, seg_end, in_a & in_b)


def subtract_intervals(a: Intervals, b: Intervals) -> Intervals:
    """Time in ``a`` but not in ``b``."""
    seg_start, seg_end, in_a, in_b = _segments(a, b)
    return _from_mask(seg_start, seg_end, in_a & ~in_b)


def clip_intervals(iv: Intervals, lo_ns: int, hi_ns: int) -> Intervals:
    """Normalised ``iv`` cut to ``[lo_ns, hi_ns)``."""
    starts = np.clip(iv[0], lo_ns, hi_ns)
    ends = np.clip(iv[1], lo_ns, hi_ns)
    return union_intervals(starts, ends)


def coverage_ns(iv: Intervals, t: np.ndarray) -> np.ndarray:
    """Length of ``iv`` before each time in ``t`` (a cumulative measure, for per-span overlap).

    ``coverage_ns(iv, end) - coverage_ns(iv, start)`` is how much of ``[start, end)`` lies in ``iv``,
    for many spans at once.
    """
    starts, ends = iv
    t = np.asarray(t, dtype=np.int64)
    if len(starts) == 0:
        return np.zeros(len(t), dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(ends - starts)])
    idx = np.searchsorted(starts, t, side="right") - 1
    safe = np.clip(idx, 0, None)
    partial = np.clip(np.minimum(t, ends[safe]) - starts[safe], 0, None)
    return np.where(idx >= 0, before[safe] + partial, 0)


def overlap_ns(a: Intervals, b: Intervals) -> int:
    """|a ∩ b| for normalised intervals."""
    starts, ends = a
    if len(starts) == 0 or len(b[0]) == 0:
        return 0
    return int((coverage_ns(b, ends) - coverage_ns(b, starts)).sum())


def covered_ns(iv: Intervals, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """|iv ∩ [lo, hi)| for many windows at once."""
    return coverage_ns(iv, hi) - coverage_ns(iv, lo)


def exposed_ns(start: np.ndarray, end: np.ndarray, cover: Intervals) -> np.ndarray:
    """For each ``[start, end)``: the part not covered by the normalised ``cover`` union."""
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    return (end - start) - covered_ns(cover, start, end)


def complement(lo: int, hi: int, iv: Intervals) -> list[tuple[int, int]]:
    """``[lo, hi)`` minus normalised ``iv``, as a list of pieces."""
    pieces, cursor = [], lo
    for s, e in zip(iv[0].tolist(), iv[1].tolist()):
        if e <= cursor:
            continue
        if s >= hi:
            break
        if s > cursor:
            pieces.append((cursor, min(s, hi)))
        cursor = max(cursor, e)
    if cursor < hi:
        pieces.append((cursor, hi))
    return pieces


# --- rows of a table ---------------------------------------------------------------------------

def merge_rows(df: pd.DataFrame, keys: Sequence[str], *, gap_ns: int = 0,
                    label: str | None = None) -> pd.DataFrame:
    """Union of ``[start_ns, end_ns)`` intervals per group of ``keys``.

    Intervals of a group that overlap, touch, or lie closer than ``gap_ns`` become one. Returns
    ``keys`` + ``start_ns``, ``end_ns``, ``n_merged`` (how many input rows each output row covers)
    and ``busy_ns`` (the summed input durations: less than end - start when gaps were bridged).
    With ``label`` (a column name), each output row also gets that column's value of its longest
    input row.
    """
    cols = [*keys, "start_ns", "end_ns", "n_merged", "busy_ns", *([label] if label else [])]
    if df.empty:
        out = df.loc[:, [*keys, *([label] if label else [])]].iloc[:0].copy()
        for col in ("start_ns", "end_ns", "n_merged", "busy_ns"):
            out[col] = pd.Series(dtype="int64")
        return out[cols]
    extra = [label] if label and label not in keys else []
    work = df.loc[:, [*keys, "start_ns", "end_ns", *extra]].sort_values([*keys, "start_ns"], kind="stable")
    work = work.reset_index(drop=True)
    group_id = work.groupby(list(keys), sort=False, observed=True).ngroup().to_numpy()
    start = work["start_ns"].to_numpy(np.int64)
    end = work["end_ns"].to_numpy(np.int64)
    # Running max of the ends within each group: an interval opens a new run when it starts after
    # everything before it in its group has ended (plus the tolerated gap).
    run_end = pd.Series(end).groupby(group_id).cummax().to_numpy()
    prev_end = np.empty_like(run_end)
    prev_end[0] = np.iinfo(np.int64).min
    prev_end[1:] = run_end[:-1]
    new_group = np.ones(len(work), dtype=bool)
    new_group[1:] = group_id[1:] != group_id[:-1]
    new_run = new_group | (start > prev_end + gap_ns)
    work["_run"] = np.cumsum(new_run)
    work["_dur"] = end - start
    runs = work.groupby("_run", sort=True)
    agg = runs.agg(
        **{key: (key, "first") for key in keys},
        start_ns=("start_ns", "min"),
        end_ns=("end_ns", "max"),
        n_merged=("start_ns", "size"),
        busy_ns=("_dur", "sum"),
    )
    if extra:
        agg[label] = work.loc[runs["_dur"].idxmax().to_numpy(), label].to_numpy()
    return agg.reset_index(drop=True)[cols]


def clip_rows(df: pd.DataFrame, start_ns: int, end_ns: int) -> pd.DataFrame:
    """Rows of ``df`` overlapping ``[start_ns, end_ns)``, cut to it."""
    inside = df[(df["end_ns"] > start_ns) & (df["start_ns"] < end_ns)].copy()
    inside["start_ns"] = inside["start_ns"].clip(lower=start_ns)
    inside["end_ns"] = inside["end_ns"].clip(upper=end_ns)
    return inside


def cover_rows(a: pd.DataFrame, b: pd.DataFrame, key: str = "rank") -> pd.DataFrame:
    """Pieces of each row of ``a`` covered by the intervals of ``b`` with the same ``key``.

    ``b`` must be disjoint within a key (a union, e.g. the exposed-communication intervals of a
    rank). Returns ``a``'s columns with ``start_ns``/``end_ns`` replaced by the covered pieces
    and ``source_row`` (the index of the ``a`` row each piece came from).
    """
    pieces: list[pd.DataFrame] = []
    a = a.assign(source_row=a.index)
    for value, rows in a.groupby(key, sort=False, observed=True):
        cover = b[b[key] == value].sort_values("start_ns")
        if cover.empty or rows.empty:
            continue
        c_start = cover["start_ns"].to_numpy(np.int64)
        c_end = cover["end_ns"].to_numpy(np.int64)
        r_start = rows["start_ns"].to_numpy(np.int64)
        r_end = rows["end_ns"].to_numpy(np.int64)
        # Candidate cover intervals of each row: those starting before the row ends, from the
        # first one that ends after the row starts.
        first = np.searchsorted(c_end, r_start, side="right")
        last = np.searchsorted(c_start, r_end, side="left")
        counts = np.maximum(last - first, 0)
        if counts.sum() == 0:
            continue
        row_idx = np.repeat(np.arange(len(rows)), counts)
        cover_idx = np.concatenate([np.arange(f, l) for f, l in zip(first, last) if l > f])
        starts = np.maximum(r_start[row_idx], c_start[cover_idx])
        ends = np.minimum(r_end[row_idx], c_end[cover_idx])
        keep = ends > starts
        part = rows.iloc[row_idx[keep]].copy()
        part["start_ns"] = starts[keep]
        part["end_ns"] = ends[keep]
        pieces.append(part)
    if not pieces:
        return a.iloc[:0].copy()
    return pd.concat(pieces, ignore_index=True)
