"""``analyse_run``: every per-unit result of a loaded run, as a :class:`RunAnalysis` of tables.

Per rank (on the rank's own clock): labels -> unit windows and compute pieces -> spans ->
per-unit overlap (UNIT_STEPS) -> memory peaks -> step times. Then across ranks: collectives are
matched, rank clocks compared and, where they disagree, every time of a rank is moved onto the
reference rank's clock; collective skew and stragglers are measured on that common clock. Last,
units are summarised and findings written.

The analysed steps are those of the whole-step overlap (:func:`fsdpviz.structure.steps.select_steps`):
by default every ProfilerStep the trace holds complete.

Why one module of ~550 lines: the per-rank pass (:func:`analyse_ranks`, each rank a :class:`RankPart`)
and the combination across ranks (:func:`combine_parts`) are the two halves of one analysis that a
mapped run (:mod:`.rankmap`) runs in two places; they share the parts' table names and must change
together. Dividing what was on the device before the trace is :mod:`.memory_split`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.analysis import memory
from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis import memory_split as msplit
from fsdpviz.analysis import unseen_frees as unseen
from fsdpviz.analysis.bound import gap_starters, host_wait_gaps, unit_host_wait, unit_pass_gaps
from fsdpviz.analysis.findings import build_findings
from fsdpviz.analysis.memory import MemoryModel
from fsdpviz.analysis.overlap import cpu_sets, gpu_sets
from fsdpviz.analysis.unit_overlap import STAGED_COLUMNS, unit_steps
from fsdpviz.analysis.units import derive_units, moved_pass_ns, unit_stats
from fsdpviz.formatting import NS_PER_MS
from fsdpviz.structure import crossrank
from fsdpviz.structure import label_rules as rules
from fsdpviz.structure.categorical import startswith
from fsdpviz.structure.collectives import is_gpu_rank
from fsdpviz.structure.framework import decide_framework
from fsdpviz.structure.intervals import (
    Intervals,
    covered_ns,
    empty_intervals,
    overlap_ns,
    subtract_intervals,
    total_ns,
    union_intervals,
)
from fsdpviz.structure.labels import (
    ENGINE_BACKWARD,
    ENGINE_FORWARD,
    ENGINE_STEP,
    FAMILY_FSDPVIZ,
    has_unit_labels,
    optimizer_own_starts,
    parse_labels,
)
from fsdpviz.structure.packed import Packed, concat_packed, pack, release_freed_memory
from fsdpviz.structure.parallelism import run_parallelism
from fsdpviz.structure.profiler_cost import ProfilerCost
from fsdpviz.structure.purposes import (
    PURPOSE_TIMES,
    collective_purposes,
    one_row_per_collective,
    purpose_times,
)
from fsdpviz.structure.records import (
    CLOCK_MOVED,
    NO_UNIT_LABELS,
    SHARED_COLLECTIVES,
    UNIT_SIZES_UNKNOWN,
    Note,
)
from fsdpviz.structure.spans import ISSUED_GATHERS, unit_tables
from fsdpviz.structure.staging import host_backend_collectives, staged_copies
from fsdpviz.structure.steps import StepSelection, select_steps
from fsdpviz.structure.windows import overhead_labels, unit_ancestors
from fsdpviz.trace import schema
from fsdpviz.trace.tables import TraceSet

_UNIT_TIME_COLS = ("window_start_ns", "window_end_ns", "compute_start_ns", "compute_end_ns", "ag_issue_ns",
                   "ag_start_ns", "ag_end_ns")


@dataclass(kw_only=True, slots=True)
class RunAnalysis:
    """Per-unit analysis of a run. Times are int ns on the reference rank's clock (see ``clock``)."""

    framework: str  # fsdp2 / fsdp1 / zero3 / unknown
    world_size: int
    ranks: list[int]
    steps: list[int]  # analysed ProfilerSteps (union over ranks); [-1] when the traces have none
    has_units: bool  # False: no unit labels, only the whole-step analysis applies
    units: pd.DataFrame  # schema.UNITS
    spans: pd.DataFrame  # schema.SPANS, analysed steps
    windows: pd.DataFrame  # windows.WINDOWS: every unit pass's label window, analysed steps
    labels: pd.DataFrame  # labels.LABELS: the framework's and fsdpviz's ranges, analysed steps (none when
    # the run was analysed rank by rank, see labels_of)
    unit_steps: pd.DataFrame  # schema.UNIT_STEPS
    unit_stats: pd.DataFrame  # schema.UNIT_STATS
    step_times: pd.DataFrame  # schema.STEP_TIMES
    memory: pd.DataFrame  # schema.MEMORY: analysed device per rank, thinned with peaks kept
    memory_peaks: pd.DataFrame  # schema.MEMORY_PEAKS
    memory_model: MemoryModel | None  # the ZeRO arithmetic beside the measured categories
    memory_categories: pd.DataFrame  # memory_categories.CATEGORY_LEVELS at the curve's samples
    category_peaks: pd.DataFrame  # memory_categories.CATEGORY_PEAKS: each step's and unit pass's peak
    sharded_state: dict[int, msplit.ShardedState]  # per rank, what the units' shards come to (known sizes only)
    clock: pd.DataFrame  # schema.CLOCK
    skew: pd.DataFrame  # schema.SKEW
    findings: pd.DataFrame  # schema.FINDINGS, most time lost first
    purposes: pd.DataFrame  # purposes.PURPOSE_TIMES: each rank's communication per purpose, analysed steps
    notes: list[Note] = field(default_factory=list)
    # per rank, the memory categories that cannot be known, each with why (memory_split.Split)
    memory_unknown: dict[int, dict[str, str]] = field(default_factory=dict)
    # per rank, what its allocated level counts (memory_categories.LEVEL_*)
    memory_level: dict[int, str] = field(default_factory=dict)
    # blocks freed where the profiler did not see it, each with when it died (unseen_frees.UNSEEN_FREES);
    # every level above (curve, peaks, categories) is without them from then on
    unseen_frees: pd.DataFrame = field(default_factory=lambda: schema.make_empty(unseen.UNSEEN_FREES))


def _compute_set(events: pd.DataFrame, lanes: pd.DataFrame) -> Intervals:
    """What counts as computing on a rank: the whole-step overlap's compute union."""
    if is_gpu_rank(events):
        return gpu_sets(events, None)[1]
    return cpu_sets(events, lanes, None)[1]


def _in_steps(frame: pd.DataFrame, wanted: dict[int, set[int] | None]) -> pd.DataFrame:
    """Rows of each rank's analysed steps (all rows of a rank without ProfilerSteps)."""
    if frame.empty:
        return frame
    keep = np.ones(len(frame), dtype=bool)
    ranks = frame["rank"].to_numpy()
    steps = frame["step"].to_numpy()
    for rank, chosen in wanted.items():
        if chosen is not None:
            m = ranks == rank
            keep[m] = np.isin(steps[m], list(chosen))
    return frame[keep]


def _engine_intervals(labels: pd.DataFrame, actions: Sequence[str], windows: pd.DataFrame) -> Intervals:
    """ZeRO-3: the time inside DeepSpeed's engine calls (``fsdpviz::engine_*`` ranges) outside every
    unit window -- the engine's own work around the model (on any lane: on GPU, backward runs on
    the autograd thread while the main thread waits inside ``engine.backward``)."""
    rows = labels[((labels["family"] == FAMILY_FSDPVIZ) & labels["action"].isin(list(actions))).to_numpy()]
    if rows.empty:
        return empty_intervals()
    inside = union_intervals(windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy())
    return subtract_intervals(union_intervals(rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()), inside)


# STEP_TIMES columns that add up to a rank's step on its training threads, and the one name each has
# wherever it is shown (the report's step chart, compare's step finding). The framework's ranges hold
# the collectives they wait for: not the bound's FSDP per-unit work, which leaves those out.
STEP_PARTS: Final = (
    ("unit_compute_ns", "units' compute"),
    ("framework_ns", "in FSDP's / ZeRO's ranges"),
    ("optimizer_ns", "optimizer"),
    ("other_ns", "other (data, loss, Python)"),
)


def _backward_end(labels: pd.DataFrame) -> pd.Series:
    """Per step of one rank's labels, when its last backward label ended (steps without one absent)."""
    return labels[(labels["phase"] == vocabulary.BACKWARD).to_numpy()].groupby("step")["end_ns"].max()


def _step_times(rank: int, steps: pd.DataFrame, pieces: pd.DataFrame, labels: pd.DataFrame,
                events: pd.DataFrame, collectives: pd.DataFrame, compute: Intervals,
                windows: pd.DataFrame, staged: tuple[np.ndarray, Intervals] | None = None,
                backward_end: pd.Series | None = None) -> pd.DataFrame:
    """STEP_TIMES of one rank: where the training threads' time went, step by step. ``staged``: the
    copies the rank's host-backend collectives staged (:func:`staged_copies` of ``collectives`` one row
    per collective): each is communication of its collective's step, as the whole-step overlap counts it.
    ``backward_end``: :func:`_backward_end` of ``labels``, where the caller has it already."""
    overhead = overhead_labels(labels)
    engine = _engine_intervals(labels, (ENGINE_FORWARD, ENGINE_BACKWARD), windows)
    over = union_intervals(np.concatenate([overhead["start_ns"].to_numpy(np.int64), engine[0]]),
                           np.concatenate([overhead["end_ns"].to_numpy(np.int64), engine[1]]))
    lo = steps["start_ns"].to_numpy(np.int64)
    hi = steps["end_ns"].to_numpy(np.int64)
    # After backward: from the end of the step's last backward label to the step's end (the
    # optimizer step, however the framework wraps it); without backward labels, Optimizer.step#.
    bwd_end = _backward_end(labels) if backward_end is None else backward_end
    after = steps["step"].map(bwd_end).to_numpy(dtype=np.float64)
    opt = events[((events["kind"] == schema.KIND_ANNOTATION)
                  & startswith(events["name"], rules.OPTIMIZER_STEP_PREFIX))]
    engine_step = _engine_intervals(labels, (ENGINE_STEP,), windows)
    opt_end = (opt["start_ns"] + opt["dur_ns"]).to_numpy(np.int64)
    # a step given a closure ran its forward and backward inside the range: those are not the optimizer
    opt_start = optimizer_own_starts(np.full(len(opt), rank), opt["start_ns"].to_numpy(np.int64), opt_end, labels)
    starts = np.concatenate([opt_start, engine_step[0],
                             np.where(np.isnan(after), hi, np.nan_to_num(after)).astype(np.int64)])
    ends = np.concatenate([opt_end, engine_step[1], hi])
    # categories never overlap: framework labels (e.g. ZeRO-3's final reduce) win over "after backward"
    opt_iv = subtract_intervals(union_intervals(starts, ends), over)
    piece_ns = (pieces["end_ns"] - pieces["start_ns"]).groupby(pieces["step"]).sum()
    comm_ns, exposed = [], []
    copy_row, (copy_start, copy_end) = staged if staged is not None else (
        np.zeros(0, dtype=np.int64), (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)))
    known = copy_row >= 0
    copy_step = np.full(len(copy_row), schema.NO_STEP, dtype=np.int64)
    if known.any():
        copy_step[known] = collectives["step"].to_numpy()[copy_row[known]]
    # a copy launched in a collective op no row holds counts for the step it ran in, as the whole-step
    # overlap counts every staged copy
    for step, lo_ns, hi_ns in zip(steps["step"], lo, hi):
        copy_step[~known & (copy_start >= lo_ns) & (copy_start < hi_ns)] = step
    for step in steps["step"]:
        c = collectives[collectives["step"] == step]
        mine = copy_step == step
        comm = union_intervals(np.concatenate([c["start_ns"].to_numpy(np.int64), copy_start[mine]]),
                               np.concatenate([c["end_ns"].to_numpy(np.int64), copy_end[mine]]))
        comm_ns.append(total_ns(comm))
        exposed.append(total_ns(comm) - overlap_ns(comm, compute))
    out = pd.DataFrame({
        "rank": rank, "step": steps["step"].to_numpy(), "start_ns": lo, "end_ns": hi, "step_ns": hi - lo,
        "unit_compute_ns": steps["step"].map(piece_ns).fillna(0).to_numpy(dtype=np.int64),
        "framework_ns": covered_ns(over, lo, hi), "optimizer_ns": covered_ns(opt_iv, lo, hi),
        "comm_ns": np.array(comm_ns, dtype=np.int64), "exposed_comm_ns": np.array(exposed, dtype=np.int64),
        "late_ns": 0,
    })
    out["other_ns"] = (out["step_ns"] - out["unit_compute_ns"] - out["framework_ns"] - out["optimizer_ns"]).clip(lower=0)
    return schema.conform(out, schema.STEP_TIMES, table="step_times")


def _shift(frame: pd.DataFrame, offsets: dict[int, int], cols: Sequence[str]) -> pd.DataFrame:
    return crossrank.shift_times(frame, offsets, cols, markers=_UNIT_TIME_COLS)


@dataclass(kw_only=True, slots=True)
class RankPart:
    """What the per-unit analysis of some ranks hands to the cross-rank step (:func:`combine_parts`):
    tables of O(units x steps) rows per rank, on each rank's own clock, never the ranks' events."""

    ranks: list[int]  # the ranks it covers (one, from a worker; every rank of a run loaded whole)
    has_unit_labels: bool
    shared_collectives: tuple[int, int]  # ZeRO-3 buckets: labels carrying several units, the most units in one
    labels: pd.DataFrame  # labels.LABELS, analysed steps
    windows: pd.DataFrame  # windows.WINDOWS, every step (units are ordered and nested from them)
    spans: pd.DataFrame  # schema.SPANS, analysed steps
    collectives: pd.DataFrame  # spans.UNIT_COLLECTIVES, every step (clock alignment, shard groups)
    gathers: pd.DataFrame  # spans.ISSUED_GATHERS, every step (units' sizes where run.json has none)
    unit_steps: pd.DataFrame  # schema.UNIT_STEPS, analysed steps, peaks filled in
    memory: pd.DataFrame  # schema.MEMORY: the analysed device, thinned with peaks kept
    memory_peaks: pd.DataFrame  # schema.MEMORY_PEAKS
    memory_categories: pd.DataFrame  # memory_categories.CATEGORY_LEVELS at the curve's samples, unsplit
    category_peaks: pd.DataFrame  # memory_categories.CATEGORY_PEAKS, unsplit
    memory_facts: pd.DataFrame  # memory_categories.MEMORY_FACTS
    step_times: pd.DataFrame  # schema.STEP_TIMES, late_ns still 0
    purposes: pd.DataFrame  # purposes.PURPOSE_TIMES: each purpose's communication, analysed steps
    unseen_frees: pd.DataFrame  # unseen_frees.UNSEEN_FREES: settled in the memory tables above

    def compact(self, *, keep_labels: bool) -> RankPart:
        """Every table packed (:mod:`fsdpviz.structure.packed`: a fraction of the bytes to send and to
        hold); without ``keep_labels`` the labels are left out (:func:`labels_of` computes them again
        for the ranks that need them)."""
        if not keep_labels:
            self.labels = self.labels.iloc[:0]
        for name in PART_TABLES:
            setattr(self, name, pack(getattr(self, name)))
        return self


PART_TABLES: Final = ("labels", "windows", "spans", "collectives", "gathers", "unit_steps", "memory",
                      "memory_peaks", "memory_categories", "category_peaks", "memory_facts", "step_times",
                      "purposes", "unseen_frees")


def _wanted(selection: StepSelection, ranks: Sequence[int]) -> dict[int, set[int] | None]:
    """Per rank, its analysed steps (None: a rank without ProfilerSteps, all its rows count)."""
    out: dict[int, set[int] | None] = {}
    for rank in ranks:
        analysed_steps = selection.of(rank)
        out[rank] = set(analysed_steps.steps) if analysed_steps is not None else None
    return out


def _rank_parts(frame: pd.DataFrame) -> Callable[[int], pd.DataFrame]:
    """``part(rank)``: the rows of ``frame`` of one rank, in their order (empty with the same columns)."""
    rows = frame.groupby("rank", sort=False).indices if len(frame) else {}
    return lambda rank: frame.iloc[rows[rank]] if rank in rows else frame.iloc[:0]


def _concat(frames: list[pd.DataFrame], table: schema.Schema) -> pd.DataFrame:
    frames = [f for f in frames if len(f)]
    return schema.conform(pd.concat(frames, ignore_index=True), table) if frames else schema.make_empty(table)


def _staged_frame(colls: dict[int, pd.DataFrame], staged: dict[int, tuple[np.ndarray, Intervals]]) -> pd.DataFrame:
    """The copies each rank's host-backend collectives staged (rank -> its collectives, one row each,
    and :func:`staged_copies` of them), as :data:`fsdpviz.analysis.unit_overlap.STAGED_COLUMNS`: each
    copy beside its collective's op, so that the unit that ran the collective counts it."""
    frames = []
    for rank, (row, (start, end)) in staged.items():
        known = row >= 0
        if not known.any():
            continue
        coll = colls[rank].iloc[row[known]]
        frames.append(pd.DataFrame({"rank": rank, "lane": coll["lane"].astype(str).to_numpy(),
                                    "coll_start_ns": coll["start_ns"].to_numpy(np.int64),
                                    "coll_end_ns": coll["end_ns"].to_numpy(np.int64),
                                    "start_ns": start[known], "end_ns": end[known]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(STAGED_COLUMNS))


def _fill_gpu_waits(us: pd.DataFrame, rank: int, events: pd.DataFrame, windows: pd.DataFrame,
                    steps: pd.DataFrame, unit_spans: pd.DataFrame) -> None:
    """On a GPU ``rank`` (else left -1): ``us``'s ``host_gap_ns`` and ``idle_gap_ns``, the idle inside
    each unit pass's compute spans (``unit_spans``, the rank's), and where its trace holds launches
    ``host_wait_ns``, the GPU's waits for launches made in each unit pass (analysis/bound.py). Without
    launches no gap can be told to be the host's: all are other idle, as the bound counts them."""
    mine = (us["rank"] == rank).to_numpy()
    if not mine.any() or not (events["kind"] == schema.KIND_KERNEL).any():
        return
    _, _, busy = gpu_sets(events, None)
    starts, launches = gap_starters(events, host_backend_collectives(events))
    passes = unit_spans[(unit_spans["kind"] == vocabulary.COMPUTE).to_numpy()]
    host, idle = unit_pass_gaps(us.loc[mine], passes, busy, starts, launches)
    us.loc[mine, "host_gap_ns"] = host
    us.loc[mine, "idle_gap_ns"] = idle
    if not (launches >= 0).any():
        return
    spans = [(int(a), int(b)) for a, b in zip(steps["start_ns"], steps["end_ns"]) if b > a]
    at, size = host_wait_gaps(spans, busy, starts, launches)
    us.loc[mine, "host_wait_ns"] = unit_host_wait(us.loc[mine], windows, at, size)


def analyse_ranks(traces: TraceSet, ranks: Sequence[int], selection: StepSelection,
                  events: pd.DataFrame) -> RankPart:
    """The per-rank half of :func:`analyse_run` for ``ranks`` (all of a run loaded whole, or the one
    rank a worker parsed): ``events`` are those ranks' own, ``selection`` gives their analysed steps;
    of ``traces`` (which may hold other ranks too) only these ranks' lanes, steps and memory and the
    run-wide units are read. Per-rank work on tables of several ranks is done in one pass each."""
    chosen_ranks = list(ranks)
    lanes = traces.lanes[traces.lanes["rank"].isin(chosen_ranks).to_numpy()]
    labels = parse_labels(events)
    ut = unit_tables(events, lanes, labels)
    wanted = _wanted(selection, chosen_ranks)
    event_rows = events.groupby("rank", sort=True).indices if len(events) else {}
    compute = {r: _compute_set(events.iloc[event_rows[r]], lanes) for r in chosen_ranks if r in event_rows}
    sizes = traces.units[traces.units["param_bytes"] > 0] if len(traces.units) else traces.units
    ancestors = unit_ancestors(ut.windows)
    in_steps_coll = _rank_parts(_in_steps(ut.collectives, wanted))
    rank_colls = {r: one_row_per_collective(in_steps_coll(r)).reset_index(drop=True) for r in chosen_ranks}
    staged = {r: staged_copies(events.iloc[event_rows.get(r, [])], rank_colls[r], wanted[r]) for r in chosen_ranks}
    us = unit_steps(ut.spans, ut.windows, compute, ancestors,
                    dict(zip(sizes["unit"].astype(str), sizes["param_bytes"].astype(int))),
                    staged=_staged_frame(rank_colls, staged))
    mem_samples = traces.memory[traces.memory["rank"].isin(chosen_ranks).to_numpy()] if len(traces.ranks) > 1 \
        else traces.memory
    devices = memory.main_devices(mem_samples)
    peaks, curves, times = [], [], []
    parallel = run_parallelism(traces, traces.run.framework if traces.run is not None else "")
    purpose_rows: list[pd.DataFrame] = []
    cat_curves: list[pd.DataFrame] = []
    cat_peaks: list[pd.DataFrame] = []
    facts: list[dict[str, Any]] = []
    # Each table split by rank once (not one full scan per rank: 64 ranks x 6 tables add up).
    by_rank = {name: _rank_parts(frame) for name, frame in (
        ("steps", traces.steps), ("windows", ut.windows), ("pieces", _in_steps(ut.pieces, wanted)),
        ("labels", labels), ("unit_spans", ut.spans),
        ("all_collectives", ut.collectives))}
    lost_parts: list[pd.DataFrame] = []
    for rank in chosen_ranks:
        rank_steps = by_rank["steps"](rank)
        rank_windows = by_rank["windows"](rank)
        rank_events = events.iloc[event_rows.get(rank, [])]
        wanted_steps = wanted[rank]
        chosen = rank_steps if wanted_steps is None else rank_steps[rank_steps["step"].isin(list(wanted_steps))]
        if rank in devices:
            samples = memory.device_samples(mem_samples, rank, devices[rank])
            where = mcat.sites(by_rank["labels"](rank), rank_windows, rank_events)
            if devices[rank] == memory.CPU_DEVICE:  # the CPU profiler's own level never saw these frees
                lost = unseen.unseen_frees(rank, samples, by_rank["all_collectives"](rank), rank_events,
                                           where.gather_buffer, where.fsdp2_gathers, where.copy_outs)
                samples = unseen.settle(samples, lost)
                lost_parts.append(lost)
            cats = mcat.categorise(samples, where)
            facts.append({"rank": rank, "persistent_bytes": cats.persistent, "reduced_bytes": cats.reduced_bytes,
                          "reductions": cats.reductions, "optimizer_made": cats.optimizer_made,
                          "relative": devices[rank] == memory.CPU_DEVICE, "optimizer_class": where.optimizer_class})
            mine = (us["rank"] == rank).to_numpy()
            if mine.any() and len(rank_windows):
                # per window, then the highest per step, unit and phase: under gradient accumulation
                # a phase has one window per micro-batch, and the time between them is not the unit's
                key = ["step", "unit", "phase"]
                at = memory.window_peak_positions(samples, rank_windows["start_ns"].to_numpy(),
                                                  rank_windows["end_ns"].to_numpy())
                values = samples["allocated_bytes"].to_numpy(np.int64)
                best = (rank_windows[key].assign(at=at, v=np.where(at >= 0, values[np.clip(at, 0, None)], -1))
                        .sort_values("v", ascending=False, kind="stable").drop_duplicates(key))
                peak = best.set_index(key)["v"]
                found = peak.reindex(pd.MultiIndex.from_frame(us.loc[mine, key])).fillna(-1)
                us.loc[mine, "peak_allocated_bytes"] = found.to_numpy(dtype=np.int64)
                best = best[(best["at"] >= 0).to_numpy() & best["step"].isin(
                    list(wanted_steps) if wanted_steps is not None else best["step"]).to_numpy()]
                cat_peaks.append(_category_rows(rank, samples, cats, best["at"].to_numpy(np.int64),
                                                best["step"].to_numpy(), best["unit"].astype(str).to_numpy(),
                                                best["phase"].astype(str).to_numpy()))
            # the peak sample itself (several samples can share its time stamp), found once for both tables
            at = memory.step_peak_positions(samples, chosen["start_ns"].to_numpy(np.int64),
                                            chosen["end_ns"].to_numpy(np.int64))
            peaks.append(memory.step_peaks(samples, chosen, rank_windows, devices[rank], ancestors, at=at))
            found = at >= 0
            if found.any():
                cat_peaks.append(_category_rows(rank, samples, cats, at[found], chosen["step"].to_numpy()[found],
                                                np.full(int(found.sum()), "", dtype=object),
                                                np.full(int(found.sum()), "", dtype=object)))
            analysed_steps = selection.of(rank)
            if analysed_steps is not None and analysed_steps.steps:
                drawn = memory.curve(samples, analysed_steps.start_ns, analysed_steps.end_ns)
            else:
                drawn = memory.curve(samples)
            curves.append(drawn)
            # the categories at fewer samples than the drawn curve (eight columns each), peaks kept;
            # positions: device_samples numbers its rows from 0
            kept = memory.thin_curve(drawn, mcat.MAX_CATEGORY_POINTS).index.to_numpy(np.int64)
            cat_curves.append(mcat.levels_frame(rank, samples["t_ns"].to_numpy(np.int64)[kept], cats.levels[kept]))
        rank_coll = rank_colls[rank]
        rank_labels = by_rank["labels"](rank)
        backward_end = _backward_end(rank_labels)  # read once: the purposes' words and the step times
        purpose_rows.append(purpose_times(rank, rank_coll, collective_purposes(
            rank_coll, tp_groups=parallel.tp_groups, tp=parallel.parallelism.tp), compute.get(rank, empty_intervals()),
            staged[rank], backward_end=dict(zip(backward_end.index.astype(int).tolist(), backward_end.to_numpy(np.int64).tolist()))))
        _fill_gpu_waits(us, rank, rank_events, rank_windows, chosen, by_rank["unit_spans"](rank))
        times.append(_step_times(rank, chosen, by_rank["pieces"](rank), rank_labels, rank_events,
                                 rank_colls[rank], compute.get(rank, empty_intervals()), rank_windows,
                                 staged[rank], backward_end))
    shared = labels[rules.fsdpviz_collective(labels) & labels["unit"].str.contains(",", regex=False).to_numpy()]
    widest = max((len(u.split(",")) for u in shared["unit"]), default=0)
    return RankPart(ranks=chosen_ranks, has_unit_labels=has_unit_labels(labels),
                    shared_collectives=(len(shared), widest), labels=_in_steps(labels, wanted), windows=ut.windows,
                    spans=_in_steps(ut.spans, wanted), collectives=ut.collectives, gathers=ut.gathers,
                    unit_steps=_in_steps(us, wanted),
                    memory=_concat(curves, schema.MEMORY), memory_peaks=_concat(peaks, schema.MEMORY_PEAKS),
                    memory_categories=_concat(cat_curves, mcat.CATEGORY_LEVELS),
                    category_peaks=_concat(cat_peaks, mcat.CATEGORY_PEAKS),
                    memory_facts=schema.conform(pd.DataFrame(facts), mcat.MEMORY_FACTS) if facts
                    else schema.make_empty(mcat.MEMORY_FACTS),
                    step_times=_concat(times, schema.STEP_TIMES), purposes=_concat(purpose_rows, PURPOSE_TIMES),
                    unseen_frees=_concat(lost_parts, unseen.UNSEEN_FREES))


def _category_rows(rank: int, samples: pd.DataFrame, cats: mcat.Categorised, at: np.ndarray, steps: np.ndarray,
                   units: np.ndarray, phases: np.ndarray) -> pd.DataFrame:
    """CATEGORY_PEAKS rows: the categories at sample positions ``at`` (a step's or a unit pass's peak)."""
    out = pd.DataFrame({"rank": rank, "step": steps, "unit": units, "phase": phases,
                        "t_ns": samples["t_ns"].to_numpy(np.int64)[at],
                        "allocated_bytes": samples["allocated_bytes"].to_numpy(np.int64)[at]})
    for k, c in enumerate(mcat.CATEGORIES):
        out[c] = cats.levels[at, k]
    return schema.conform(out, mcat.CATEGORY_PEAKS, table="category peaks")


def analyse_run(traces: TraceSet, *, steps: Sequence[int] | None = None,
                selection: StepSelection | None = None, framework: str | None = None,
                profiler: ProfilerCost | None = None, idle_ns: float | None = None,
                scale: float = 1.0, step_ns: float | None = None,
                gap_scales: tuple[float, float] = (1.0, 1.0), comm_scale: float | None = None) -> RunAnalysis:
    """Per-unit analysis of a loaded run (see the module docstring) over the steps ``selection``
    analyses (default: ``steps.select_steps(traces, steps=steps)``); ``framework`` as
    ``framework.decide_framework`` decides it (the pipeline passes its decision); ``profiler`` (what
    it cost, from the timers) and ``idle_ns`` (the time the GPU waited per traced step, as the bound
    counts it; None on a CPU) for the
    profiler's finding; ``scale``: what moves the findings' times to the run's clock (the bound's
    ``device_scale``), ``step_ns`` the run's step there (the findings' noise floor; None: the traced
    step times ``scale``); ``gap_scales``: what moves the idle inside a GPU unit's pass there (the bound's
    ``host_scale`` and ``idle_scale``; UNIT_STEPS ``compute_clock_ns``); ``comm_scale``: what moves the
    findings' communication times there (the bound's ``comm_scale``; None: ``scale``)."""
    if selection is None:
        selection = select_steps(traces, steps=steps)
    framework = decide_framework(traces) if framework is None else framework
    # one part for every rank: the per-rank half runs on the whole tables, one pass per step
    return combine_parts([analyse_ranks(traces, traces.rank_ids, selection, traces.events)], traces, selection,
                         framework, profiler=profiler, idle_ns=idle_ns, scale=scale, step_ns=step_ns,
                         gap_scales=gap_scales, comm_scale=comm_scale)


def _frame_of(parts: Sequence[RankPart], name: str, table: schema.Schema | None, *,
              text_as_category: bool = False) -> pd.DataFrame:
    """The ranks' ``name`` tables as one, in rank order (packed ones unpacked, text columns as
    categories if ``text_as_category``; each part's table is let go once copied: a large run's
    parts are not held twice)."""
    frames: list[Any] = [getattr(p, name) for p in parts]
    for p in parts:
        setattr(p, name, None)
    if frames and isinstance(frames[0], Packed):
        out = concat_packed(frames, text_as_category=text_as_category)
    else:
        kept = [f for f in frames if len(f)]
        if not kept:
            return frames[0].iloc[:0] if table is None and frames else schema.make_empty(table) if table else \
                pd.DataFrame()
        out = pd.concat(kept, ignore_index=True) if len(kept) > 1 else kept[0].reset_index(drop=True)
    del frames
    release_freed_memory()
    return schema.conform(out, table, table=name) if table is not None else out


def labels_of(aligned: TraceSet, selection: StepSelection) -> pd.DataFrame:
    """``RunAnalysis.labels`` of the ranks ``aligned`` holds (with their events, on the reference
    clock: ``RunResult.aligned_detail``): their analysed steps' labels. A run analysed rank by rank
    keeps no labels (each rank's are as many as its spans): what needs them reads its ranks again
    and calls this."""
    return _in_steps(parse_labels(aligned.events), _wanted(selection, aligned.rank_ids))


def combine_parts(parts: Sequence[RankPart], traces: TraceSet, selection: StepSelection,
                  framework: str, *, profiler: ProfilerCost | None = None,
                  idle_ns: float | None = None, scale: float = 1.0,
                  step_ns: float | None = None, gap_scales: tuple[float, float] = (1.0, 1.0),
                  comm_scale: float | None = None) -> RunAnalysis:
    """The cross-rank half of :func:`analyse_run`: clocks compared and aligned, collective skew and
    stragglers, units, their statistics and findings, from each rank's :class:`RankPart` (in rank
    order). ``traces`` is read for run-wide facts only (units and run.json, ranks, world size);
    ``profiler``, ``idle_ns``, ``scale``, ``step_ns``, ``gap_scales`` and ``comm_scale`` as :func:`analyse_run`
    takes them."""
    ranks = [r for p in parts for r in p.ranks]
    wanted = _wanted(selection, ranks)
    analysed = set().union(*[w if w is not None else {schema.NO_STEP} for w in wanted.values()]) if ranks else set()
    labels = _frame_of(parts, "labels", None)
    windows = _frame_of(parts, "windows", None)
    # the collectives are read here only (as many rows as the spans): text kept as categories
    all_coll = _frame_of(parts, "collectives", None, text_as_category=True)
    us = _frame_of(parts, "unit_steps", schema.UNIT_STEPS)
    coll = crossrank.with_seq(all_coll)
    clock = crossrank.estimate_clocks(coll, ranks) if ranks else schema.make_empty(schema.CLOCK)
    offsets = crossrank.applied_offsets(clock)
    # what the memory model needs of them (a unit's all-gathers run on its shard group, its HSDP
    # all-reduces on the replica group), before they are let go
    gathers = pd.DataFrame({"rank": all_coll["rank"].to_numpy(), "pg": all_coll["pg"].astype(str).to_numpy(),
                            "unit": np.where((all_coll["kind"] == vocabulary.ALL_GATHER).to_numpy(),
                                             all_coll["unit"].astype(str).to_numpy(), "")})
    # what each unit's all-gathers moved in one pass of one micro-batch (its size where neither run.json
    # nor the issuing ops say it): a unit gathered in several collectives counts them all, and a step's
    # micro-batches, which gather it again, do not add up; a ZeRO-3 bucket carrying several units is no
    # one unit's size
    moved = all_coll[(all_coll["kind"] == vocabulary.ALL_GATHER).to_numpy() & (all_coll["bytes"] > 0).to_numpy()
                     & (all_coll["unit"].astype(str) != "").to_numpy() & (all_coll["n_units"] == 1).to_numpy()]
    per_pass = moved.groupby([moved["rank"], moved["step"], moved["micro"], moved["phase"].astype(str),
                              moved["unit"].astype(str)], observed=True)["bytes"].sum()
    gathered_bytes = per_pass.groupby(level=4).median()
    del all_coll, moved
    spans = _shift(_frame_of(parts, "spans", schema.SPANS), offsets, ("start_ns", "end_ns", "issue_ns"))
    pass_windows = _shift(_in_steps(windows, wanted), offsets,
                          ("start_ns", "end_ns", "region_start_ns", "region_end_ns", "excl_end_ns"))
    step_labels = _shift(labels, offsets, ("start_ns", "end_ns"))
    us = _shift(us, offsets, _UNIT_TIME_COLS)
    mem_curve = _shift(_frame_of(parts, "memory", schema.MEMORY), offsets, ("t_ns",))
    cat_curve = _shift(_frame_of(parts, "memory_categories", mcat.CATEGORY_LEVELS), offsets, ("t_ns",))
    cat_peaks = _shift(_frame_of(parts, "category_peaks", mcat.CATEGORY_PEAKS), offsets, ("t_ns",))
    facts = _frame_of(parts, "memory_facts", mcat.MEMORY_FACTS)
    peaks_t = _shift(_frame_of(parts, "memory_peaks", schema.MEMORY_PEAKS), offsets, ("peak_t_ns",))
    step_times = _shift(_frame_of(parts, "step_times", schema.STEP_TIMES), offsets, ("start_ns", "end_ns"))
    skew = schema.make_empty(schema.SKEW)
    if len(coll):
        coll = _in_steps(_shift(coll, offsets, ("start_ns", "end_ns", "issue_ns")), wanted)
        skew = crossrank.collective_skew(coll, min(ranks))
        lateness = crossrank.rank_lateness(coll)
        late = step_times[["rank", "step"]].merge(lateness, on=["rank", "step"], how="left")["late_ns"]
        step_times["late_ns"] = late.fillna(0).astype(np.int64).to_numpy()
    del coll
    release_freed_memory()
    has_units = any(p.has_unit_labels for p in parts)
    units = derive_units(traces.units, windows, gathered_bytes, framework,
                         _frame_of(parts, "gathers", ISSUED_GATHERS)) if has_units else traces.units
    purposes = _frame_of(parts, "purposes", PURPOSE_TIMES)
    stats, findings = _on_clock(us, units, spans, step_times, framework, profiler=profiler, idle_ns=idle_ns,
                                scale=scale, step_ns=step_ns, gap_scales=gap_scales, comm_scale=comm_scale,
                                purposes=purposes if has_units else None)
    gpu = bool(traces.ranks["n_kernels"].sum() > 0)
    shards, shards_source = memory.shard_sizes(traces.run.units if traces.run else None, gathers,
                                               len(traces.rank_ids), traces.world_size) if has_units \
        else ({}, "world_size")
    fact_rows = facts.to_dict(orient="records")
    states = {int(f["rank"]): msplit.sharded_state(units, shards, traces.world_size, int(f["reduced_bytes"]))
              for f in fact_rows}
    persistent = {int(f["rank"]): int(f["persistent_bytes"]) for f in fact_rows}
    split = {int(f["rank"]): msplit.split_of(f, states[int(f["rank"])], traces.run) for f in fact_rows}
    cat_curve = msplit.apply_split(cat_curve, persistent, split)
    cat_peaks = msplit.apply_split(cat_peaks, persistent, split)
    optimizer = sorted({str(c) for c in facts["optimizer_class"] if str(c)})
    model = _model(stats, units, peaks_t, gpu, shards, shards_source,
                   [s for s in states.values() if s is not None], optimizer[0] if len(optimizer) == 1 else "",
                   traces.world_size, msplit.optimizer_bytes(
                       split, states, traces.run, {int(f["rank"]): bool(f["optimizer_made"]) for f in fact_rows}))
    if model is not None:
        model.master_bytes_per_param = msplit.master_bytes(traces.run, states)
    shared = (sum(p.shared_collectives[0] for p in parts), max((p.shared_collectives[1] for p in parts), default=0))
    return RunAnalysis(
        framework=framework, world_size=traces.world_size, ranks=ranks, steps=sorted(analysed),
        has_units=has_units, units=units, spans=spans, windows=pass_windows, labels=step_labels, unit_steps=us,
        unit_stats=stats, step_times=step_times, memory=mem_curve, memory_peaks=peaks_t, memory_model=model,
        memory_categories=cat_curve, category_peaks=cat_peaks,
        sharded_state={r: st for r, st in states.items() if st is not None},
        memory_unknown={r: sp.unknown for r, sp in split.items() if sp.unknown},
        memory_level={r: msplit.level_of(f, traces.run) for r, f in ((int(f["rank"]), f) for f in fact_rows)},
        clock=clock, skew=skew, findings=findings, notes=_notes(has_units, clock, shared, units),
        purposes=purposes,
        unseen_frees=_shift(_frame_of(parts, "unseen_frees", unseen.UNSEEN_FREES), offsets, ("alloc_ns", "free_ns")),
    )


def rescaled(analysis: RunAnalysis, *, profiler: ProfilerCost | None = None, idle_ns: float | None = None,
             scale: float = 1.0, step_ns: float | None = None,
             gap_scales: tuple[float, float] = (1.0, 1.0), comm_scale: float | None = None) -> RunAnalysis:
    """``analysis`` with its figures on the run's clock moved again: by ``scale``, ``gap_scales``,
    ``comm_scale``, on ``step_ns``, with ``profiler`` and ``idle_ns``, as :func:`combine_parts` takes them. What they move is
    the passes on the run's clock (UNIT_STEPS ``compute_clock_ns``), the units' statistics and the
    findings; every other table is the trace's and is shared, not copied. What the pipeline reads once
    the run's split is the replay's (``RunResult.adopt_bound``), without reading the ranks again."""
    us = analysis.unit_steps.copy()
    stats, findings = _on_clock(us, analysis.units, analysis.spans, analysis.step_times, analysis.framework,
                                profiler=profiler, idle_ns=idle_ns, scale=scale, step_ns=step_ns, gap_scales=gap_scales,
                                comm_scale=comm_scale, purposes=analysis.purposes if analysis.has_units else None)
    return replace(analysis, unit_steps=us, unit_stats=stats, findings=findings)


def _on_clock(us: pd.DataFrame, units: pd.DataFrame, spans: pd.DataFrame, step_times: pd.DataFrame, framework: str,
              *, profiler: ProfilerCost | None, idle_ns: float | None, scale: float, step_ns: float | None,
              gap_scales: tuple[float, float], comm_scale: float | None = None,
              purposes: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the run's clock moves (``scale``, ``gap_scales``, ``step_ns``, ``comm_scale``, as
    :func:`combine_parts` takes them): the passes of UNIT_STEPS ``us`` (``compute_clock_ns``, set in place),
    then the units' statistics and the findings read off them (their communication's times by
    ``comm_scale``; ``purposes``, PURPOSE_TIMES where the run has unit labels, for the communication no
    unit issued)."""
    us["compute_clock_ns"] = moved_pass_ns(us["compute_ns"].astype("float64"), us["host_gap_ns"], us["idle_gap_ns"],
                                           scale, *gap_scales)
    traced_ns = float(step_times["step_ns"].median()) if len(step_times) else float("nan")
    findings = build_findings(us, spans, step_times, traced_ns * scale if step_ns is None else step_ns, framework,
                              profiler=profiler, idle_ns=idle_ns, scale=scale, comm_scale=comm_scale, purposes=purposes)
    return unit_stats(us, units), findings


def _model(stats: pd.DataFrame, units: pd.DataFrame, peaks: pd.DataFrame, gpu: bool, shards: dict[str, int],
           shards_source: str, states: list[msplit.ShardedState], optimizer_class: str,
           world_size: int, optimizer_bytes: int | None) -> MemoryModel | None:
    """The memory model of the run's units (run.json's, completed from the trace), their shard groups
    and what the ranks' categories measured (bytes per sharded element, the optimizer's class)."""
    if stats.empty:
        return None
    elem, measured = memory.element_bytes(units, 2 if gpu else 4)
    sharded = [s.bytes_per_element for s in states if s.measured]
    model = memory.memory_model(
        stats.set_index("unit")["param_bytes"], world_size, elem, measured_elem=measured,
        sharded_elem_bytes=max(set(sharded), key=sharded.count) if sharded else None,
        optimizer_bytes=optimizer_bytes, optimizer_class=optimizer_class,
        unit_shards=shards, shards_source=shards_source)
    if model is not None and len(peaks):
        model.measured_peak_bytes = int(peaks["peak_allocated_bytes"].max())
    return model


def _notes(has_units: bool, clock: pd.DataFrame, shared: tuple[int, int], units: pd.DataFrame) -> list[Note]:
    notes = []
    unsized = units["unit"][(units["param_bytes"] < 0).to_numpy()].astype(str).tolist() if len(units) else []
    if has_units and unsized:
        named = ", ".join(unsized[:5]) + (f" and {len(unsized) - 5} more" if len(unsized) > 5 else "")
        notes.append(Note(UNIT_SIZES_UNKNOWN, f"{named}: size unknown (null): no run.json lists it, and no "
                          "all-gather in the traces carried it alone (ZeRO-3 buckets carry several units), so no "
                          "one unit's bytes can be read"))
    if not has_units:
        notes.append(Note(NO_UNIT_LABELS, "no FSDP unit labels in the traces (FSDP2's FSDP::... or fsdpviz's "
                          "fsdpviz::... ranges): only whole-step numbers are available"))
    n_shared, widest = shared
    if n_shared:
        notes.append(Note(SHARED_COLLECTIVES, f"{n_shared} collectives carried several units at once (up to "
                          f"{widest}, ZeRO-3 buckets): each of those units shows the collective, and its exposed "
                          "time counts for the unit that waited on it (the first to compute after a gather, the "
                          "last before a reduction)"))
    moved = clock[clock["applied"]]
    for row in moved.itertuples():
        notes.append(Note(CLOCK_MOVED, f"rank {row.rank}'s clock differs from rank {int(clock['rank'].min())}'s by "
                          f"{row.offset_ns / NS_PER_MS:.3f} ms (from {row.n_matched} collective end times): its times "
                          "were moved onto the reference clock"))
    return notes
