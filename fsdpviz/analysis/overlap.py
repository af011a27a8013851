"""Whole-step communication/computation overlap per rank.

The question: of the time a rank spent communicating, how much ran while it also computed?
``overlap_pct = |comm ∩ compute| / |comm|``; ``exposed_comm = |comm| - |comm ∩ compute|``.

GPU ranks (any kernel in the trace) use HTA 0.5.0's definitions so the numbers can be checked
against it: GPU events only; comm = kernels named ``nccl...Kernel`` (old and new NCCL, RCCL) and,
beyond HTA, the collectives of a host backend on CUDA tensors (``gloo:*`` / ``mpi:*`` ops on the
backend's CPU threads, which HTA leaves out and so reports as idle);
compute = every other kernel except names matching Memcpy / Memset / Sync; both merged into
interval unions. Window: the GPU work launched during the analysed ProfilerSteps (``steps.select_steps``:
by default every step the trace holds complete); idle = the span from the first to the
last analysed GPU event minus the union of all of them.

CPU ranks (gloo) have no kernels: comm = ``gloo:*`` collectives on gloo worker threads; compute =
CPU ops on the main and autograd threads minus the time inside collective-issuing ops (``c10d::*``,
``record_param_comms``) and blocking waits (ops named ``*wait*``), and minus, while a collective runs,
the time of an op that encloses such an op (the thread waiting inside it); the window is the analysed
steps' time span. docs/concepts.md states both definitions with examples.

The interval unions and their algebra are :mod:`fsdpviz.structure.intervals`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.analysis.bound import (
    carried_work,
    cpu_split,
    gap_starters,
    gpu_split,
    launch_times,
    step_windows,
)
from fsdpviz.errors import NoDataError
from fsdpviz.structure.categorical import matching, searching
from fsdpviz.structure.fsdp_work import all_lanes, fsdp_ranges, launched_inside
from fsdpviz.structure.intervals import (
    Intervals,
    clip_intervals,
    overlap_ns,
    subtract_intervals,
    total_ns,
    union_intervals,
)
from fsdpviz.structure.spans import GPU_WORK_KINDS, HTA_NOT_COMPUTE_RE
from fsdpviz.structure.staging import collective_work, communication_kernels, host_backend_collectives
from fsdpviz.structure.steps import AnalysedSteps, StepSelection, select_steps
from fsdpviz.trace import schema
from fsdpviz.trace.tables import TraceSet

# --- definitions -------------------------------------------------------------------------------
# HTA's definitions of communication and compute: structure/spans.py (HTA_COMM_RE, HTA_NOT_COMPUTE_RE).
CPU_COMPUTE_LANES: Final = (schema.LANE_CPU_MAIN, schema.LANE_CPU_AUTOGRAD)
CPU_WAIT_RE: Final = re.compile(r"wait", re.IGNORECASE)


def _intervals_of(frame: pd.DataFrame) -> Intervals:
    starts = frame["start_ns"].to_numpy(dtype=np.int64)
    return union_intervals(starts, starts + frame["dur_ns"].to_numpy(dtype=np.int64))


def gpu_sets(events: pd.DataFrame, analysed: AnalysedSteps | None) -> tuple[Intervals, Intervals, Intervals]:
    """(comm, compute, all work) unions of one rank's GPU events in the analysed steps.

    GPU events belong to the step their launching runtime call started in (the ``step`` column),
    so work queued in a step counts for it even when the GPU runs it later. Collectives of a host
    backend (gloo on CUDA tensors) are communication too, counted from their CPU op in the step
    it started in, and so are the copies they launch to and from the host; without any, the sets are
    HTA's.
    """
    gpu = events[events["kind"].isin(GPU_WORK_KINDS).to_numpy()]
    host = host_backend_collectives(events)
    if analysed is not None:
        gpu = gpu[gpu["step"].isin(list(analysed.steps)).to_numpy()]
        host = host[host["step"].isin(list(analysed.steps)).to_numpy()]
    is_compute = ~matching(gpu["name"], HTA_NOT_COMPUTE_RE)
    if host.empty:
        return (_intervals_of(gpu[communication_kernels(gpu)]), _intervals_of(gpu[is_compute]),
                _intervals_of(gpu))
    is_comm = collective_work(events, gpu)
    comm = _intervals_of(pd.concat([gpu[is_comm], host]))
    all_work = _intervals_of(pd.concat([gpu, host]))
    return comm, _intervals_of(gpu[is_compute & ~is_comm]), all_work


def is_model_work(events: pd.DataFrame, gpu: pd.DataFrame, ranges: dict[str, Intervals]) -> np.ndarray:
    """Per row of ``gpu`` (one rank's GPU work): neither communication (a collective's own work,
    :func:`gpu_sets`) nor launched from inside FSDP's own ranges (``ranges``:
    :func:`fsdpviz.structure.fsdp_work.fsdp_ranges`): the model's."""
    return ~collective_work(events, gpu) & ~launched_inside(events, gpu, ranges)


def cpu_sets(
    events: pd.DataFrame, lanes: pd.DataFrame, analysed: AnalysedSteps | None
) -> tuple[Intervals, Intervals, Intervals]:
    """(comm, compute, comm ∪ compute) of one CPU rank, cut to the analysed steps' span."""
    kind_of_lane = dict(zip(lanes["lane"].astype(str), lanes["lane_kind"].astype(str)))
    lane_kind = events["lane"].astype(str).map(kind_of_lane).to_numpy()
    has_comm = (events["comm"] != "").to_numpy()
    comm = _intervals_of(events[(lane_kind == schema.LANE_CPU_GLOO) & has_comm])
    on_compute_lanes = np.isin(lane_kind, CPU_COMPUTE_LANES)
    ops = events[on_compute_lanes & (events["kind"] == schema.KIND_CPU_OP).to_numpy()]
    is_blocked = (ops["comm"] != "").to_numpy() | searching(ops["name"], CPU_WAIT_RE)
    compute = subtract_intervals(_intervals_of(ops), _intervals_of(ops[is_blocked]))
    # the thread waits for a collective inside the op that issued it: an autograd node whose hook
    # gathers the next unit (FSDP2's backward prefetch), FSDP's post-backward reduction. While a
    # collective runs, such an op is the thread waiting, not computing: only the ops that issued or
    # waited for nothing (the ops inside it, any other op) are work that hid the collective
    working = _intervals_of(ops[~is_blocked & ~_enclosing(ops, is_blocked)])
    compute = subtract_intervals(compute, subtract_intervals(comm, working))
    if analysed is not None:
        comm = clip_intervals(comm, analysed.start_ns, analysed.end_ns)
        compute = clip_intervals(compute, analysed.start_ns, analysed.end_ns)
    busy = union_intervals(np.concatenate([comm[0], compute[0]]), np.concatenate([comm[1], compute[1]]))
    return comm, compute, busy


def _enclosing(ops: pd.DataFrame, blocked: np.ndarray) -> np.ndarray:
    """Per row of ``ops`` (CPU ops): a ``blocked`` op of its lane starts inside it (other than itself)."""
    starts = ops["start_ns"].to_numpy(dtype=np.int64)
    ends = starts + ops["dur_ns"].to_numpy(dtype=np.int64)
    lane = ops["lane"].astype(str).to_numpy()
    out = np.zeros(len(ops), dtype=bool)
    for name in np.unique(lane[blocked]):
        mine = lane == name
        at = np.sort(starts[mine & blocked])
        # blocked ops starting in [start, end), less the op itself where it is one
        inside = np.searchsorted(at, ends[mine], "left") - np.searchsorted(at, starts[mine], "left")
        out[mine] = inside - blocked[mine] > 0
    return out


def overlap_row(
    rank: int, device: str, analysed: AnalysedSteps | None, comm: Intervals, compute: Intervals,
    busy: Intervals,
) -> dict[str, object]:
    """One OVERLAP row from the three unions (the analysed steps' span, or the busy span)."""
    if device == schema.OVERLAP_CPU and analysed is not None and analysed.steps:
        start, end = analysed.start_ns, analysed.end_ns
    elif len(busy[0]):
        start, end = int(busy[0][0]), int(busy[1][-1])
    else:
        start = end = 0
    comm_ns, compute_ns, busy_ns = total_ns(comm), total_ns(compute), total_ns(busy)
    both_ns = overlap_ns(comm, compute)
    steps = analysed.steps if analysed is not None else ()
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
    selection: StepSelection | None = None,
) -> pd.DataFrame:
    """Whole-step overlap per rank (schema.OVERLAP), GPU or CPU definition per rank, over the steps
    ``selection`` analyses (default: ``steps.select_steps`` with ``steps`` and ``include_last_step``).

    Raises NoDataError naming the rank's file when a rank has nothing in its analysed steps.
    """
    if selection is None:
        selection = select_steps(traces, steps=steps, include_last_step=include_last_step)
    rows = []
    # One grouping of the (possibly huge) events table instead of one full scan per rank; each
    # rank's rows are taken when its turn comes, so only one rank's copy exists at a time.
    by_rank = traces.events.groupby("rank", sort=True).indices
    for rank in traces.rank_ids:
        mine = by_rank.get(rank)
        events = traces.events.iloc[mine] if mine is not None else traces.events.iloc[:0]
        rows.append(rank_overlap(traces, rank, events, selection.of(rank), selection.requested))
    return overlap_frame(rows)


def overlap_frame(rows: Sequence[dict[str, object]]) -> pd.DataFrame:
    """schema.OVERLAP from :func:`rank_overlap` rows."""
    if not rows:
        return schema.make_empty(schema.OVERLAP)
    return schema.conform(pd.DataFrame(list(rows)), schema.OVERLAP, table="overlap")


def rank_overlap(traces: TraceSet, rank: int, events: pd.DataFrame, analysed: AnalysedSteps | None,
                 requested: Sequence[int] | None) -> dict[str, object]:
    """The OVERLAP row of one rank (``events``: its own) over its analysed steps; NoDataError naming
    the rank's file when nothing of it is in them."""
    if (events["kind"] == schema.KIND_KERNEL).any():
        device = schema.OVERLAP_GPU
        comm, compute, busy = gpu_sets(events, analysed)
        # the bound covers each step's wall time: all GPU work, whichever step launched it
        all_comm, all_compute, all_busy = gpu_sets(events, None)
        host_comm = host_backend_collectives(events)
        starts, launches = gap_starters(events, host_comm)
        ranges = fsdp_ranges(events)
        windows = step_windows(traces.steps, rank, analysed, busy)
        gpu = events[events["kind"].isin(GPU_WORK_KINDS).to_numpy()]
        model = is_model_work(events, gpu, ranges)
        # the analysed steps' own work (with no ProfilerStep the window is the busy span: all of it is)
        carried = (carried_work(windows, gpu, launch_times(events, gpu), model, _intervals_of(host_comm))
                   if analysed is not None and analysed.steps else 0)
        bound = gpu_split(windows, all_comm, all_compute, all_busy, starts, launches,
                          _intervals_of(gpu[model]), all_lanes(ranges), carried)
    else:
        device = schema.OVERLAP_CPU
        lanes = traces.lanes[traces.lanes["rank"] == rank]
        comm, compute, busy = cpu_sets(events, lanes, analysed)
        bound = cpu_split(step_windows(traces.steps, rank, analysed, busy), comm, compute,
                          all_lanes(fsdp_ranges(events)))
    if total_ns(busy) == 0:
        if analysed is None:
            where = "the whole trace, which has no ProfilerStep"
        elif analysed.steps:
            where = f"steps {list(analysed.steps)}"
        else:
            where = f"steps {list(requested or [])}, not in this trace"
        raise NoDataError(f"{traces.source_of(rank)}: no {device.upper()} events in the analysis window ({where})")
    return overlap_row(rank, device, analysed, comm, compute, busy) | bound
