"""FSDP's own per-unit work in a rank's trace: the host ranges of its hooks and the GPU work they launch.

Every unit costs the step some work that is FSDP's, not the model's: the pre-forward / pre-backward
hooks that unshard the unit (FSDP2's ``FSDP::pre_forward (u)``, ``FSDP::all_gather (u)`` around the
copy-in op ``fsdp::all_gather_copy_in``, ``FSDP::all_gather_copy_out (u)`` around
``fsdp::split_with_sizes_copy``), the post-forward / post-backward hooks that reshard and reduce
(``FSDP::post_backward_reduce (u)`` around ``fsdp::chunk_cat``), FSDP1's
``FullyShardedDataParallel._*`` ranges, fsdpviz's gather / reduce / fetch labels of FSDP1 and ZeRO-3,
and DeepSpeed's hook autograd functions: the framework ranges that are never a unit's own compute
(:func:`fsdpviz.structure.windows.overhead_labels`), less FSDP2's labels that name no unit (the root's
pre-forward and post-backward callback run once a step). A coarser wrap runs them fewer times.

Their GPU work is what the host launched inside those ranges, communication kernels aside (they are
the step's communication): the copy-in, copy-out and reduce-scatter input copies.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdpviz.structure.intervals import Intervals, union_intervals
from fsdpviz.structure.labels import FAMILY_FSDP2, parse_labels
from fsdpviz.structure.windows import overhead_labels
from fsdpviz.trace import schema

EMPTY: Intervals = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def all_lanes(ranges: dict[str, Intervals]) -> Intervals:
    """The union of ``ranges`` over every lane."""
    if not ranges:
        return EMPTY
    return union_intervals(np.concatenate([r[0] for r in ranges.values()]),
                           np.concatenate([r[1] for r in ranges.values()]))


def inside(points: np.ndarray, intervals: Intervals) -> np.ndarray:
    """Per point: whether it lies in one of the (merged, sorted) ``intervals``."""
    starts, ends = intervals
    if not len(starts):
        return np.zeros(len(points), dtype=bool)
    i = np.searchsorted(starts, points, side="right") - 1
    safe = np.clip(i, 0, None)
    return (i >= 0) & (points < ends[safe])


def launch_points(events: pd.DataFrame, gpu: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``gpu`` (GPU events of the same rank as ``events``): when and on which CPU lane the
    runtime call that launched it began (-1 and None where the trace holds no launch)."""
    runtime = events[(events["kind"] == schema.KIND_RUNTIME).to_numpy() & (events["correlation"] >= 0).to_numpy()]
    # the first runtime call of a correlation launched it (as analysis/bound.py's launch times read it)
    runtime = runtime.sort_values("start_ns", kind="stable").drop_duplicates("correlation")
    launch = pd.DataFrame({"t": runtime["start_ns"].to_numpy(np.int64),
                           "lane": runtime["lane"].astype(str).to_numpy()}, index=runtime["correlation"].to_numpy())
    found = launch.reindex(gpu["correlation"].to_numpy())
    return found["t"].fillna(-1).to_numpy(np.int64), found["lane"].to_numpy(dtype=object)


def launched_inside(events: pd.DataFrame, gpu: pd.DataFrame, ranges: dict[str, Intervals]) -> np.ndarray:
    """Per row of ``gpu`` (GPU events of the same rank as ``events``): launched from inside one of
    ``ranges`` (per CPU lane: FSDP's ranges, :func:`fsdp_ranges`, or a collective's host ops) on the
    launching thread (False where the trace holds no launch)."""
    out = np.zeros(len(gpu), dtype=bool)
    if not ranges or not len(gpu):
        return out
    t, lanes = launch_points(events, gpu)
    for lane, intervals in ranges.items():
        mine = (t >= 0) & (lanes == lane)
        if mine.any():
            out[mine] = inside(t[mine], intervals)
    return out


def _own_ranges(events: pd.DataFrame) -> pd.DataFrame:
    """FSDP's ranges of one rank's ``events`` (module docstring), one row each."""
    return own_label_ranges(parse_labels(events))


def own_label_ranges(labels: pd.DataFrame) -> pd.DataFrame:
    """FSDP's ranges (module docstring) among parsed ``labels`` (:func:`fsdpviz.structure.labels.parse_labels`)."""
    ranges = overhead_labels(labels)
    return ranges[~((ranges["family"] == FAMILY_FSDP2) & (ranges["unit"] == "")).to_numpy()]


def fsdp_ranges(events: pd.DataFrame) -> dict[str, Intervals]:
    """Per CPU lane of one rank's ``events``: the union of FSDP's own ranges on it (module docstring)."""
    ranges = _own_ranges(events)
    return {str(lane): union_intervals(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
            for lane, g in ranges.groupby(ranges["lane"].astype(str), sort=False)}


def launching_units(events: pd.DataFrame, gpu: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``gpu`` (GPU events of the same rank as ``events``) launched from inside FSDP's own
    ranges (:func:`fsdp_ranges`): the launch's time (``launch_ns``) and the unit named by the innermost
    of those ranges that names one (``unit``; "" where none does: FSDP1's
    ``FullyShardedDataParallel._*`` ranges outside fsdpviz's labels). Rows launched elsewhere are left
    out; the index is ``gpu``'s."""
    t, lanes = launch_points(events, gpu)
    ranges = _own_ranges(events)
    unit = np.full(len(gpu), None, dtype=object)
    for lane, g in ranges.groupby(ranges["lane"].astype(str), sort=False):
        g = g.sort_values(["start_ns", "end_ns"], ascending=[True, False], kind="stable")
        starts, ends = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
        names = g["unit"].astype(str).to_numpy(dtype=object)
        parent = np.full(len(g), -1, dtype=np.int64)  # the range holding each (FSDP's ranges nest)
        open_: list[int] = []
        for i in range(len(g)):
            while open_ and ends[open_[-1]] <= starts[i]:
                open_.pop()
            parent[i] = open_[-1] if open_ else -1
            open_.append(i)
        for k in np.flatnonzero((t >= 0) & (lanes == lane)):
            i = int(np.searchsorted(starts, t[k], side="right")) - 1
            while i >= 0 and ends[i] <= t[k]:
                i = int(parent[i])
            if i < 0:
                continue
            j = i  # the innermost range that names a unit (FSDP1's own sit inside fsdpviz's)
            while j >= 0 and not names[j]:
                j = int(parent[j])
            unit[k] = names[j] if j >= 0 else ""
    keep = np.array([u is not None for u in unit], dtype=bool)
    return pd.DataFrame({"launch_ns": t[keep], "unit": unit[keep].astype(str)}, index=gpu.index[keep])
