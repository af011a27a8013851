"""Whole-step communication/computation overlap per rank, and the interval algebra behind it.

The question: of the time a rank spent communicating, how much ran while it also computed?
``overlap_pct = |comm ∩ compute| / |comm|``; ``exposed_comm = |comm| - |comm ∩ compute|``.

GPU ranks (any kernel in the trace) use HTA 0.5.0's definitions so the numbers can be checked
against it: GPU events only; comm = kernels named ``nccl...Kernel`` (old and new NCCL, RCCL);
compute = every other kernel except names matching Memcpy / Memset / Sync; both merged into
interval unions. Window: the GPU work launched during the analysed ProfilerSteps (``steps.choose_steps``:
by default every step the trace holds complete); idle = the span from the first to the
last analysed GPU event minus the union of all of them.

CPU ranks (gloo) have no kernels: comm = ``gloo:*`` collectives on gloo worker threads; compute =
CPU ops on the main and autograd threads minus the time inside collective-issuing ops (``c10d::*``,
``record_param_comms``) and blocking waits (ops named ``*wait*``); the window is the analysed
steps' time span. docs/concepts.md states both definitions with examples.

Interval helpers work on numpy arrays in O(n log n) without Python loops, so a rank with a
million kernels costs milliseconds. An ``Intervals`` value is a pair ``(starts, ends)`` of int64
arrays; the helpers return them normalised: sorted, disjoint, non-empty, touching ones merged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.analysis.steps import StepChoice, StepWindow, choose_steps
from fsdpviz.errors import NoDataError
from fsdpviz.trace import schema
from fsdpviz.trace.tables import TraceSet

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
    return seg_start, seg_end, _covers(a, seg_start), _covers(b, seg_start)


def _covers(iv: Intervals, t: np.ndarray) -> np.ndarray:
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


# --- definitions -------------------------------------------------------------------------------
# HTA 0.5.0 (hta/utils/utils.py): comm = ^nccl.*Kernel; "not compute" = that, or a name containing
# Memcpy, or starting with Memset, or containing Sync (re.match semantics).
HTA_COMM_RE: Final = re.compile(r"^nccl.*Kernel")
HTA_NOT_COMPUTE_RE: Final = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
GPU_WORK_KINDS: Final = (schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET)
CPU_COMPUTE_LANES: Final = (schema.LANE_CPU_MAIN, schema.LANE_CPU_AUTOGRAD)
CPU_WAIT_RE: Final = re.compile(r"wait", re.IGNORECASE)


def _intervals_of(frame: pd.DataFrame) -> Intervals:
    starts = frame["start_ns"].to_numpy(dtype=np.int64)
    return union_intervals(starts, starts + frame["dur_ns"].to_numpy(dtype=np.int64))


def _names_matching(names: pd.Series, pattern: re.Pattern[str]) -> np.ndarray:
    """Regex test once per distinct (categorical) name, mapped back onto the rows."""
    cats = names.cat.categories
    hit = np.fromiter((pattern.match(str(c)) is not None for c in cats), dtype=bool, count=len(cats))
    codes = names.cat.codes.to_numpy()
    return hit[codes] & (codes >= 0) if len(cats) else np.zeros(len(names), dtype=bool)


def _names_searching(names: pd.Series, pattern: re.Pattern[str]) -> np.ndarray:
    cats = names.cat.categories
    hit = np.fromiter((pattern.search(str(c)) is not None for c in cats), dtype=bool, count=len(cats))
    codes = names.cat.codes.to_numpy()
    return hit[codes] & (codes >= 0) if len(cats) else np.zeros(len(names), dtype=bool)


def gpu_sets(events: pd.DataFrame, window: StepWindow | None) -> tuple[Intervals, Intervals, Intervals]:
    """(comm, compute, all GPU work) unions of one rank's GPU events in the window.

    GPU events belong to the step their launching runtime call started in (the ``step`` column),
    so work queued in a step counts for it even when the GPU runs it later.
    """
    gpu = events[events["kind"].isin(GPU_WORK_KINDS).to_numpy()]
    if window is not None:
        gpu = gpu[gpu["step"].isin(list(window.steps)).to_numpy()]
    is_comm = _names_matching(gpu["name"], HTA_COMM_RE)
    is_compute = ~_names_matching(gpu["name"], HTA_NOT_COMPUTE_RE)
    return _intervals_of(gpu[is_comm]), _intervals_of(gpu[is_compute]), _intervals_of(gpu)


def cpu_sets(
    events: pd.DataFrame, lanes: pd.DataFrame, window: StepWindow | None
) -> tuple[Intervals, Intervals, Intervals]:
    """(comm, compute, comm ∪ compute) of one CPU rank, cut to the window."""
    kind_of_lane = dict(zip(lanes["lane"].astype(str), lanes["lane_kind"].astype(str)))
    lane_kind = events["lane"].astype(str).map(kind_of_lane).to_numpy()
    has_comm = (events["comm"] != "").to_numpy()
    comm = _intervals_of(events[(lane_kind == schema.LANE_CPU_GLOO) & has_comm])
    on_compute_lanes = np.isin(lane_kind, CPU_COMPUTE_LANES)
    ops = events[on_compute_lanes & (events["kind"] == schema.KIND_CPU_OP).to_numpy()]
    blocked = ops[(ops["comm"] != "").to_numpy() | _names_searching(ops["name"], CPU_WAIT_RE)]
    compute = subtract_intervals(_intervals_of(ops), _intervals_of(blocked))
    if window is not None:
        comm = clip_intervals(comm, window.start_ns, window.end_ns)
        compute = clip_intervals(compute, window.start_ns, window.end_ns)
    busy = union_intervals(np.concatenate([comm[0], compute[0]]), np.concatenate([comm[1], compute[1]]))
    return comm, compute, busy


def overlap_row(
    rank: int, device: str, window: StepWindow | None, comm: Intervals, compute: Intervals,
    busy: Intervals,
) -> dict[str, object]:
    """One OVERLAP row from the three unions (window span from the steps, or the busy span)."""
    if device == schema.OVERLAP_CPU and window is not None and window.steps:
        start, end = window.start_ns, window.end_ns
    elif len(busy[0]):
        start, end = int(busy[0][0]), int(busy[1][-1])
    else:
        start = end = 0
    comm_ns, compute_ns, busy_ns = total_ns(comm), total_ns(compute), total_ns(busy)
    both_ns = overlap_ns(comm, compute)
    steps = window.steps if window is not None else ()
    return {
        "rank": rank,
        "device": device,
        "n_steps": len(steps),
        "first_step": steps[0] if steps else schema.NO_STEP,
        "last_step": steps[-1] if steps else schema.NO_STEP,
        "window_start_ns": start,
        "window_end_ns": end,
        "window_ns": end - start,
        "comm_ns": comm_ns,
        "compute_ns": compute_ns,
        "overlap_ns": both_ns,
        "exposed_comm_ns": comm_ns - both_ns,
        "busy_ns": busy_ns,
        "idle_ns": max(end - start - busy_ns, 0),
        "non_compute_ns": busy_ns - compute_ns,
        "overlap_pct": 100.0 * both_ns / comm_ns if comm_ns else float("nan"),
    }


def compute_overlap(
    traces: TraceSet, *, steps: Sequence[int] | None = None, include_last_step: bool = False,
    choice: StepChoice | None = None,
) -> pd.DataFrame:
    """Whole-step overlap per rank (schema.OVERLAP), GPU or CPU definition per rank, over the steps
    ``choice`` analyses (default: ``steps.choose_steps`` with ``steps`` and ``include_last_step``).

    Raises NoDataError naming the rank's file when a rank has nothing in its analysis window.
    """
    if choice is None:
        choice = choose_steps(traces, steps=steps, include_last_step=include_last_step)
    rows = []
    # One grouping of the (possibly huge) events table instead of one full scan per rank; each
    # rank's rows are taken when its turn comes, so only one rank's copy exists at a time.
    by_rank = traces.events.groupby("rank", sort=True).indices
    for rank in traces.rank_ids:
        mine = by_rank.get(rank)
        events = traces.events.iloc[mine] if mine is not None else traces.events.iloc[:0]
        window = choice.window(rank)
        if (events["kind"] == schema.KIND_KERNEL).any():
            device = schema.OVERLAP_GPU
            comm, compute, busy = gpu_sets(events, window)
        else:
            device = schema.OVERLAP_CPU
            lanes = traces.lanes[traces.lanes["rank"] == rank]
            comm, compute, busy = cpu_sets(events, lanes, window)
        if total_ns(busy) == 0:
            if window is None:
                where = "the whole trace, which has no ProfilerStep"
            elif window.steps:
                where = f"steps {list(window.steps)}"
            else:
                where = f"steps {list(choice.requested or [])}, not in this trace"
            raise NoDataError(
                f"{traces.source_of(rank)}: no {device.upper()} events in the analysis window ({where})"
            )
        rows.append(overlap_row(rank, device, window, comm, compute, busy))
    if not rows:
        return schema.make_empty(schema.OVERLAP)
    return schema.conform(pd.DataFrame(rows), schema.OVERLAP, table="overlap")
