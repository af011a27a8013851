"""A recording read as programs: per rank and step, what the host did and what each unit pass cost.

The host (the training thread; on GPU the autograd thread during backward) is read on a *busy
clock*: wall time minus the time it waited -- on GPU inside CUDA synchronisations, on CPU inside
collectives (gloo's collectives are synchronous for FSDP2 on CPU: the thread that issues one waits
for it). Busy time is what the host would spend again under another setting; waiting is what the
simulator recomputes.

A step is read as, per micro-batch (one unless gradient accumulation):

- ``pre``: host work before the first unit's forward (data loading), ``mid``: between the forward
  and the backward (the loss), and at the end ``post``: after the backward (the optimizer step, and
  on GPU the synchronisation that ends the step);
- one :class:`Pass` per unit and phase in the order the host ran them. The root unit, whose window
  holds its children's, is two passes per phase: ``a`` before its first child, ``b`` after its last.
  A unit nested in another's (a block's experts sharded as a unit of their own) splits its parent's
  passes the same way, at any depth.
  A pass holds its host busy time before its compute (``pre_ns``), its compute, its host time after
  (``post_ns``), the time between the previous pass and its window (``gap_ns``: the model's own
  Python between blocks);
- one :class:`Gather` per all-gather (its host time to issue, copy-in, the collective, copy-out),
  remembered with the pass that issued it; where no collective ran (torch's fake process group), one
  per gather label of FSDP's, with its host work and copies and no communication; one
  :class:`Reduce` per reduce-scatter (and HSDP all-reduce).

On GPU a pass's compute is the time its kernels kept the device busy: its compute span runs from the
first kernel to the last, and where the host launched slower than the device ran, the span also holds
the device's waits for those launches, which are the host's time already.

The reading is split by job: :class:`_StepTables` holds one step's spans and labels as arrays,
:class:`_PassReader` reads a pass (and the reduction it issued) off them on the busy clock, and
:func:`_gathers` the step's all-gathers. Memory is read apart, by category, for the memory model
(:class:`~fsdpviz.replay.memory.StepMemory` on each step, ``StepProgram.memory``).

Why one module of ~700 lines: a pass, a segment and a gather are read off the same instants of one
step -- its tables (:class:`_StepTables`), the rank's busy clock and its kernels -- and each reader
needs the others' boundaries (a pass ends where its gathers' copy-outs begin). Split, they would hand
those back and forth; what does not depend on a step's instants (the recording's units, resharding,
ranks per host) is :mod:`.recording_facts`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pandas as pd
from pandas.core.groupby import DataFrameGroupBy

from fsdpviz import vocabulary
from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.memory import ASSUMED_OPTIMIZER_STATES, CPU_DEVICE, device_samples, main_devices
from fsdpviz.analysis.memory_split import ShardedState, Split, split_of
from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.analysis.run import labels_of
from fsdpviz.replay import prefetch_args
from fsdpviz.replay import recording_facts as facts
from fsdpviz.replay.memory import step_memory
from fsdpviz.replay.recorded import (
    Gather,
    MicroBatch,
    Pass,
    Recording,
    Reduce,
    Segment,
    StepProgram,
)
from fsdpviz.structure import label_rules as rules
from fsdpviz.structure.categorical import as_str
from fsdpviz.structure.fsdp_work import inside, launching_units, own_label_ranges
from fsdpviz.structure.intervals import (
    Intervals,
    intersect_intervals,
    subtract_intervals,
    total_ns,
    union_intervals,
)
from fsdpviz.structure.labels import listed_units
from fsdpviz.structure.spans import GPU_WORK_KINDS, gpu_work
from fsdpviz.structure.staging import collective_work
from fsdpviz.structure.windows import first_backward_ns
from fsdpviz.trace import schema

SYNC_CALLS: Final = ("Synchronize",)  # cudaDeviceSynchronize, cudaStreamSynchronize, cuEventSynchronize ...
# A GPU pass's compute kernels, in this many groups of consecutive launches (Pass.launches): each group
# waits for its own launch. 32 split the shared recordings' idle time as one group per kernel does.
LAUNCH_GROUPS: Final = 32
# Host events the profiler records, each at a cost to the training thread (hostcost).
HOST_EVENT_KINDS: Final = (schema.KIND_CPU_OP, schema.KIND_RUNTIME, schema.KIND_ANNOTATION)


class BusyClock:
    """Host busy time: wall time minus the blocked intervals before it; with ``per_op_ns``, also
    minus what the profiler cost each traced host event (``ops``: their starts) before it, which
    makes it the host's work as the unprofiled run does it (:mod:`fsdpviz.replay.hostcost`)."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, ops: np.ndarray | None = None,
                 per_op_ns: float = 0.0) -> None:
        self.s, self.e = union_intervals(starts, ends)
        self.cum = np.concatenate([[0], np.cumsum(self.e - self.s)]).astype(np.int64)
        self.ops = np.sort(ops) if ops is not None and per_op_ns > 0 else np.empty(0, np.int64)
        self.per_op_ns = per_op_ns
        self.host_ops: np.ndarray = np.empty(0, np.int64)  # GPU: the traced host events' starts
        self.waited_for: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        """CPU: the collectives behind the blocked intervals, (starts, ends, kinds) per source in the order
        :func:`_wait_kinds` asks them."""

    def __call__(self, t: float) -> float:
        i = int(np.searchsorted(self.s, t, side="right"))  # intervals starting at or before t
        blocked = float(self.cum[i])
        if i and t < self.e[i - 1]:
            blocked -= float(self.e[i - 1] - t)
        if len(self.ops):
            blocked += self.per_op_ns * float(np.searchsorted(self.ops, t, side="right"))
        return t - blocked

    def between(self, a: float, b: float) -> float:
        return max(0.0, self(b) - self(a))


def read_recording(result: RunResult, ranks: Sequence[int] | None = None, per_op_ns: float = 0.0) -> Recording:
    """The programs of every analysed rank and step of ``result`` (of ``ranks`` only, when given).

    ``per_op_ns``: the host's time is read net of this much per traced host event (the profiler's
    cost per event, :mod:`fsdpviz.replay.hostcost`). what-if reads a GPU recording so; a CPU one it
    scales per rank instead (:mod:`fsdpviz.replay.calibration`, which says why)."""
    analysis = result.analysis
    traces = result.aligned_detail(ranks)
    events = traces.events
    lanes = traces.lanes
    host_lanes = set(zip(lanes.loc[lanes["lane_kind"].isin([schema.LANE_CPU_MAIN, schema.LANE_CPU_AUTOGRAD]), "rank"],
                         lanes.loc[lanes["lane_kind"].isin([schema.LANE_CPU_MAIN, schema.LANE_CPU_AUTOGRAD]),
                                   "lane"].astype(str)))
    gpu = bool((events["kind"] == schema.KIND_KERNEL).any())
    work = gpu_work(events) if gpu else None
    memory = traces.memory
    devices = main_devices(memory)
    units = facts.unit_order(result)
    unit_bytes = facts.unit_bytes(result, units)
    programs = []
    steps = traces.steps
    labels = analysis.labels if result.events_kept else labels_of(traces, result.selection)
    by = {name: frame.groupby("rank", sort=True) for name, frame in (
        ("spans", analysis.spans), ("windows", analysis.windows), ("labels", labels),
        ("events", events), ("steps", steps), ("times", analysis.step_times))}
    gathered: dict[str, set[str]] = {}  # unit -> the phases its gather labels opened in
    notes: list[str] = []
    op_counts: list[float] = []
    for rank in analysis.ranks if ranks is None else [r for r in analysis.ranks if r in set(ranks)]:
        parts = {name: _group(g, rank) for name, g in by.items()}
        facts.gather_label_phases(parts["labels"], parts["windows"], gathered)
        ev = parts["events"]
        clock = _busy_clock(ev, parts["spans"], host_lanes, rank, gpu, per_op_ns)
        rank_work = work[work["rank"] == rank] if work is not None else None
        kernels = _Kernels.of(rank_work) if rank_work is not None else None
        own = _FsdpKernels.of(ev) if gpu else None
        lane_work = _LaneWork.of(rank_work) if rank_work is not None else None
        samples = device_samples(memory, rank, devices[rank]) if rank in devices else memory.iloc[:0]
        times = parts["times"].set_index("step") if len(parts["times"]) else None
        cats = split = None
        assumed: dict[str, int] = {}
        if len(samples):
            where = mcat.sites(parts["labels"], parts["windows"], ev)
            cats = mcat.categorise(samples, where)
            split = split_of({"rank": rank, "persistent_bytes": cats.persistent, "reduced_bytes": cats.reduced_bytes,
                              "reductions": cats.reductions, "optimizer_made": cats.optimizer_made,
                              "relative": devices[rank] == CPU_DEVICE},
                             analysis.sharded_state.get(rank), result.traces.run)
            split, assumed = _assume_optimizer(split, analysis.sharded_state.get(rank))
        sample_t = samples["t_ns"].to_numpy(np.int64)
        for step in sorted(set(parts["windows"]["step"].tolist())):
            if times is None or step not in times.index:
                continue
            row = times.loc[step]
            program = _read_step(rank, step, int(row["start_ns"]), int(row["end_ns"]), parts, clock, rank_work, gpu,
                                 unit_bytes, kernels, own, lane_work)
            program.comm_ns, program.comm_exposed_ns = int(row["comm_ns"]), int(row["exposed_comm_ns"])
            program.start_ns = int(row["start_ns"])
            ops = clock.host_ops
            op_counts.append(float(np.searchsorted(ops, int(row["end_ns"])) - np.searchsorted(ops, int(row["start_ns"]))))
            if cats is not None and split is not None:
                step_windows = parts["windows"][(parts["windows"]["step"] == step).to_numpy()]
                program.memory = step_memory(rank, step, int(row["start_ns"]), int(row["end_ns"]),
                                             sample_t, cats, split, step_windows)
                if program.memory is not None:
                    program.memory.unknown, program.memory.assumed = dict(split.unknown), dict(assumed)
            programs.append(program)
    prefetch, prefetch_words = prefetch_args.recorded(result.traces.run, analysis.framework)
    return Recording(
        framework=analysis.framework, device="gpu" if gpu else "cpu", world_size=analysis.world_size,
        units=units, unit_bytes=unit_bytes, modules=facts.unit_modules(units),
        reshard_after_forward=facts.observed_reshard(facts.declared_reshard(result, units), programs, gathered),
        prefetch=prefetch, prefetch_args=prefetch_words,
        prefetch_depths=(prefetch_args.fsdp2_depths(result.traces.run) if analysis.framework == vocabulary.FSDP2
                         else None),
        unit_numels=facts.unit_numels(result), unit_params=facts.unit_params(result),
        unit_param_names=facts.unit_param_names(result),
        steps=programs, ranks_per_host=facts.ranks_per_host(result), cpu_count=facts.cpu_count(result), notes=notes,
        host_ops_per_step=sum(op_counts) / len(op_counts) if op_counts else 0.0,
        reshard_sizes=facts.reshard_sizes(result), fsdp1_strategy=facts.fsdp1_strategy(result),
        serial_collectives=gpu and _fsdp_on_host_backend(analysis.spans, lanes, programs),
        launch_latency_ns=_launch_latency(work) if work is not None else 0.0,
    )


def _launch_latency(work: pd.DataFrame) -> float:
    """The median time from a launch to its work's start, over the work that started on an idle device
    (after all work before it ended, on every stream of its rank) and was launched after the device went
    idle: the device waited for that launch alone (:attr:`Recording.launch_latency_ns`)."""
    out = []
    for _, w in work.groupby("rank", sort=False):  # gpu_work keeps only work with a launch
        w = w.sort_values("start_ns", kind="stable")
        start, end, launch = (w[c].to_numpy(np.int64) for c in ("start_ns", "end_ns", "launch_ns"))
        if len(start) < 2:
            continue
        before = np.maximum.accumulate(end)[:-1]  # the device's last end before each piece of work
        waited = (start[1:] > before) & (launch[1:] > before)
        out.extend((start[1:] - launch[1:])[waited].tolist())
    return float(np.median(out)) if out else 0.0


def _fsdp_on_host_backend(spans: pd.DataFrame, lanes: pd.DataFrame, programs: Sequence[StepProgram]) -> bool:
    """FSDP's own collectives ran on a host backend's threads (gloo on CUDA tensors), not as a GPU's
    kernels: all-gathers on gloo's lanes for at least half of the gathers the ``programs`` hold. A gloo
    group beside FSDP's collectives (a barrier, a metric's all-reduce, which a trace without shapes can
    pair with one of FSDP's issuing ops) does not count."""
    gathers = sum(len(p.gathers) for p in programs)
    if not gathers:
        return False
    gloo = set(zip(lanes.loc[lanes["lane_kind"] == schema.LANE_CPU_GLOO, "rank"].astype(int),
                   lanes.loc[lanes["lane_kind"] == schema.LANE_CPU_GLOO, "lane"].astype(str)))
    steps = {(p.rank, p.step) for p in programs}
    ran = spans[(spans["kind"] == vocabulary.ALL_GATHER).to_numpy()]
    on_gloo = sum((int(r), str(lane)) in gloo and (int(r), int(s)) in steps
                  for r, s, lane in zip(ran["rank"], ran["step"], ran["lane"]))
    return 2 * on_gloo >= gathers


def _assume_optimizer(split: Split, state: ShardedState | None) -> tuple[Split, dict[str, int]]:
    """``split`` with an unknown optimizer state assumed (:data:`ASSUMED_OPTIMIZER_STATES` per sharded
    element, out of what was left in ``other``), so that a prediction that reshards scales it, and the
    bytes assumed per category (empty when the state is known, the shards are not, or ``other``
    holds nothing to carve it from: a CPU level that starts at 0 with the trace never counted it).
    The category stays unknown (``split.unknown``): the assumption is the prediction's, said where it
    moves the peak (:mod:`fsdpviz.whatif.predict`)."""
    if mcat.OPTIMIZER_STATE not in split.unknown or state is None:
        return split, {}
    parts = dict(split.parts)
    assumed = min(parts[mcat.OTHER], round(ASSUMED_OPTIMIZER_STATES * state.elements * state.bytes_per_element))
    if assumed <= 0:
        return split, {}
    parts[mcat.OPTIMIZER_STATE], parts[mcat.OTHER] = assumed, parts[mcat.OTHER] - assumed
    return Split(parts=parts, unknown=split.unknown), {mcat.OPTIMIZER_STATE: assumed}


def _group(grouped: DataFrameGroupBy, rank: int) -> pd.DataFrame:
    try:
        return grouped.get_group(rank)
    except KeyError:
        return grouped.obj.iloc[:0]


def _busy_clock(events: pd.DataFrame, spans: pd.DataFrame, host_lanes: set[tuple[int, str]], rank: int,
                gpu: bool, per_op_ns: float = 0.0) -> BusyClock:
    """Where the host waited. GPU: CUDA synchronisations on the host threads. CPU: while a collective
    it issued ran (from the issue to its end), except where the host computed meanwhile. On both, the
    traced host events' starts (``host_ops``), which ``per_op_ns`` is taken off for."""
    on_host = events["lane"].isin({name for r, name in host_lanes if r == rank}).to_numpy()
    kinds = events["kind"]
    traced = on_host & kinds.isin(list(HOST_EVENT_KINDS)).to_numpy()
    ops = np.sort(events["start_ns"].to_numpy(np.int64)[traced])
    if gpu:
        names = events["name"].astype(str)
        sync = on_host & (kinds == schema.KIND_RUNTIME).to_numpy() & names.str.contains(
            "|".join(SYNC_CALLS), regex=True).to_numpy()
        starts = events["start_ns"].to_numpy(np.int64)[sync]
        clock = BusyClock(starts, starts + events["dur_ns"].to_numpy(np.int64)[sync], ops, per_op_ns)
    else:
        comm = spans[spans["kind"].isin(list(vocabulary.UNIT_COLLECTIVES)).to_numpy()]
        other = events[((events["comm"] != "") & (events["kind"] == schema.KIND_ANNOTATION)).to_numpy()]
        starts = np.concatenate([comm["issue_ns"].to_numpy(np.int64), other["start_ns"].to_numpy(np.int64)])
        ends = np.concatenate([comm["end_ns"].to_numpy(np.int64),
                               (other["start_ns"] + other["dur_ns"]).to_numpy(np.int64)])
        compute = spans[(spans["kind"] == vocabulary.COMPUTE).to_numpy()]
        s, e = subtract_intervals(union_intervals(starts, ends),
                                  union_intervals(compute["start_ns"].to_numpy(np.int64),
                                                  compute["end_ns"].to_numpy(np.int64)))
        clock = BusyClock(s, e, ops, per_op_ns)
        # a unit collective's kind is its span's: gloo runs a reduce-scatter as ``gloo:all_reduce`` where
        # it has none of its own, so the annotation would misname it; the annotations name the others
        clock.waited_for = [
            (comm["issue_ns"].to_numpy(np.int64), comm["end_ns"].to_numpy(np.int64), as_str(comm["kind"])),
            (other["start_ns"].to_numpy(np.int64), (other["start_ns"] + other["dur_ns"]).to_numpy(np.int64),
             as_str(other["comm"]))]
    clock.host_ops = ops
    return clock


def _wait_kinds(clock: BusyClock, which: np.ndarray) -> list[str]:
    """CPU: per blocked interval ``which`` of ``clock``, the kind of the collective the host waited for:
    the one it waited on longest, of the unit collectives first (``clock.waited_for``), all-reduce where
    none names one. Asked only of the segments' intervals (:func:`_segment`), the few the replay keeps apart."""
    out = []
    for a, b in zip(clock.s[which].tolist(), clock.e[which].tolist()):
        kind = vocabulary.ALL_REDUCE
        for starts, ends, kinds in clock.waited_for:
            held = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0, None)
            if len(held) and held.max() > 0:
                kind = str(kinds[int(held.argmax())])
                break
        out.append(kind if kind in vocabulary.UNIT_COLLECTIVES else vocabulary.ALL_REDUCE)
    return out


@dataclass(slots=True)
class _Window:
    unit: str
    phase: str
    micro: int
    start: int
    end: int


def _windows(windows: pd.DataFrame, step: int, micro: int, phase: str) -> list[_Window]:
    rows = windows[((windows["step"] == step) & (windows["micro"] == micro) & (windows["phase"] == phase)).to_numpy()]
    out = [_Window(str(u), phase, micro, int(s), int(e)) for u, s, e in
           zip(rows["unit"].tolist(), rows["start_ns"].tolist(), rows["end_ns"].tolist())]
    return sorted(out, key=lambda w: (w.start, -w.end))


@dataclass(slots=True)
class _Node:
    """A unit's window and the windows of the units nested in it, in host order."""

    win: _Window
    kids: list[_Node] = field(default_factory=list)


def _window_tree(wins: list[_Window]) -> list[_Node]:
    """The windows (sorted by start, longest first) as a forest: each window under the innermost one
    holding it -- a unit sharded inside another's module (FSDP2's ``fully_shard`` on
    ``blocks.4.moe.experts`` before ``blocks.4``) runs its pre- and post-hooks inside its parent's."""
    tops: list[_Node] = []
    open_: list[_Node] = []  # the windows holding the current one, innermost last
    for w in wins:
        while open_ and not (w.start >= open_[-1].win.start and w.end <= open_[-1].win.end):
            open_.pop()
        if not open_:
            if tops and w.start < tops[-1].win.end:
                # a window opened before the one before it closed, not inside it (ZeRO-3's embeddings'
                # backward hooks fire inside the root's): from where that one ends, as siblings above
                w = _Window(w.unit, w.phase, w.micro, tops[-1].win.end, w.end)
            node = _Node(w)
            tops.append(node)
            open_.append(node)
            continue
        kids = open_[-1].kids
        if kids and w.start < kids[-1].win.end:
            # overlapping siblings (FSDP1's backward prefetch opens the next unit's window inside
            # this one's): one after the other on the host, the later from where the earlier ends
            w = _Window(w.unit, w.phase, w.micro, kids[-1].win.end, w.end)
        node = _Node(w)
        kids.append(node)
        open_.append(node)
    return tops


def _pass_frames(wins: list[_Window]) -> Iterator[tuple[str, str, int, int, int]]:
    """(unit, part, frame start, frame end, gap start) of each pass in host order: a window without
    nested ones is one pass; a window holding others (the root, or a block holding its experts' unit)
    is parts a and b around them, and the nested ones are read the same way, at any depth."""
    prev_end: int | None = None
    for top in _window_tree(wins):
        yield from _node_frames(top, top.win.start if prev_end is None else prev_end)
        prev_end = top.win.end


def _node_frames(node: _Node, gap_from: int) -> Iterator[tuple[str, str, int, int, int]]:
    w, kids = node.win, node.kids
    if not kids:
        yield w.unit, "", w.start, w.end, gap_from
        return
    yield w.unit, "a", w.start, kids[0].win.start, gap_from
    for i, kid in enumerate(kids):
        yield from _node_frames(kid, kid.win.start if i == 0 else kids[i - 1].win.end)
    yield w.unit, "b", kids[-1].win.end, w.end, kids[-1].win.end


@dataclass(slots=True)
class _Intervals:
    """Start and end columns of some rows, as arrays (with the rows' unit, phase and micro-batch
    where they have them)."""

    start: np.ndarray
    end: np.ndarray
    unit: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=object))

    @classmethod
    def of(cls, rows: pd.DataFrame) -> _Intervals:
        unit = as_str(rows["unit"]) if "unit" in rows.columns else np.zeros(len(rows), dtype=object)
        return cls(rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64), unit)


@dataclass(slots=True)
class _StepTables:
    """One step's spans and labels, split by what the reader asks of them, as arrays read once (the
    loop over passes builds no DataFrame)."""

    spans: pd.DataFrame  # schema.SPANS of the step (CPU: with each collective's wait start)
    windows: pd.DataFrame
    compute: pd.DataFrame
    c_unit: np.ndarray
    c_phase: np.ndarray
    c_micro: np.ndarray
    c_issue: np.ndarray
    c_start: np.ndarray
    c_end: np.ndarray
    reshards: _Intervals  # phase in ``reshard_phase``
    reshard_phase: np.ndarray
    reshard_starts: np.ndarray  # sorted
    gather_labels: pd.DataFrame
    copy_out_labels: pd.DataFrame
    gather_spans: _Intervals  # the gather labels'
    copy_out_spans: _Intervals
    reduce_labels: _Intervals
    framework: _Intervals  # FSDP's own ranges (the bound's: structure/fsdp_work.py), their union over the host's lanes
    reductions: pd.DataFrame  # reduce-scatter and all-reduce spans
    r_unit: np.ndarray
    r_kind: np.ndarray
    r_micro: np.ndarray
    r_cols: dict[str, np.ndarray]
    r_from: np.ndarray  # where each reduction's time counts from (GPU: its start; CPU: its wait start)

    @classmethod
    def read(cls, parts: dict[str, pd.DataFrame], step: int, gpu: bool) -> _StepTables:
        spans = parts["spans"][(parts["spans"]["step"] == step).to_numpy()]
        if not gpu:
            spans = _with_wait_start(spans)
        labels = parts["labels"][(parts["labels"]["step"] == step).to_numpy()]
        gather_labels = labels[rules.gather(labels)]
        copy_out_labels = labels[rules.copy_out(labels)]
        reduce_labels = labels[rules.reduce(labels)]
        own = own_label_ranges(labels)
        framework = union_intervals(own["start_ns"].to_numpy(np.int64), own["end_ns"].to_numpy(np.int64))
        compute = spans[(spans["kind"] == vocabulary.COMPUTE).to_numpy()]
        reshards = spans[(spans["kind"] == vocabulary.RESHARD).to_numpy()]
        reductions = spans[spans["kind"].isin([vocabulary.REDUCE_SCATTER, vocabulary.ALL_REDUCE]).to_numpy()]
        c_unit, c_phase, c_micro = _pass_columns(compute)
        c_cols = _columns(compute, ("issue_ns", "start_ns", "end_ns"))
        r_unit, r_kind, r_micro = _pass_columns(reductions, "kind")
        r_cols = _columns(reductions, ("issue_ns", "start_ns", "end_ns", "bytes"))
        return cls(
            spans=spans, windows=parts["windows"][(parts["windows"]["step"] == step).to_numpy()], compute=compute,
            c_unit=c_unit, c_phase=c_phase, c_micro=c_micro, c_issue=c_cols["issue_ns"], c_start=c_cols["start_ns"],
            c_end=c_cols["end_ns"], reshards=_Intervals.of(reshards), reshard_phase=as_str(reshards["phase"]),
            reshard_starts=np.sort(reshards["start_ns"].to_numpy(np.int64)), gather_labels=gather_labels,
            copy_out_labels=copy_out_labels, gather_spans=_Intervals.of(gather_labels),
            copy_out_spans=_Intervals.of(copy_out_labels), reduce_labels=_Intervals.of(reduce_labels),
            framework=_Intervals(*framework),
            reductions=reductions, r_unit=r_unit, r_kind=r_kind, r_micro=r_micro, r_cols=r_cols,
            r_from=r_cols["start_ns"] if gpu else _wait_from(reductions))


@dataclass(slots=True)
class _Kernels:
    """A rank's compute kernels (no collectives), sorted by launch time, as arrays."""

    launch: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, work: pd.DataFrame) -> _Kernels:
        w = work[(work["is_compute"] & ~work["is_comm"]).to_numpy()].sort_values("launch_ns", kind="stable")
        return cls(w["launch_ns"].to_numpy(np.int64), w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64))


@dataclass(slots=True)
class _FsdpKernels:
    """A rank's GPU work launched by FSDP's own ranges, as the bound reads FSDP's kernels
    (:func:`fsdpviz.structure.fsdp_work.launching_units`, collectives' own work aside), by launch time:
    each with the unit its range names ("" for none) and whether it ran on the rank's compute stream
    (the stream that ran the most GPU time of the rank's other work)."""

    launch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    lane: np.ndarray
    unit: np.ndarray
    main: np.ndarray

    @classmethod
    def of(cls, events: pd.DataFrame) -> _FsdpKernels:
        gpu = events[events["kind"].isin(list(GPU_WORK_KINDS)).to_numpy()]
        gpu = gpu[~collective_work(events, gpu)]
        own = launching_units(events, gpu).sort_values("launch_ns", kind="stable")
        rows = gpu.loc[own.index]
        lane = as_str(rows["lane"])
        rest = gpu.drop(index=own.index)
        by_lane = rest.groupby(as_str(rest["lane"]), sort=False)["dur_ns"].sum() if len(rest) else pd.Series(dtype=float)
        main_lane = str(by_lane.idxmax()) if len(by_lane) else ""
        start = rows["start_ns"].to_numpy(np.int64)
        return cls(launch=own["launch_ns"].to_numpy(np.int64), start=start,
                   end=start + rows["dur_ns"].to_numpy(np.int64), lane=lane,
                   unit=own["unit"].to_numpy(dtype=object), main=lane == main_lane)


@dataclass(slots=True)
class _PassReader:
    """Reads one pass (a unit's window in one phase and micro-batch, or a root's part) off a step's
    tables on the host's busy clock: its host time around the compute, the compute, and the
    reduction it issued."""

    tables: _StepTables
    clock: BusyClock
    work: pd.DataFrame | None  # GPU: kernels with their launch times
    gpu: bool
    kernels: _Kernels | None  # GPU: the rank's compute kernels by launch time
    prep_from: list[tuple[float, float]] = field(default_factory=list)  # launch windows of the reductions' prep
    # (unit, phase, micro-batch) of the units read in parts: a window of theirs nested in their own (a
    # unit of a module list, `fully_shard([blocks.0, blocks.1])`, opens one per module inside its own)
    # holds only the compute issued in it; the parts hold the rest
    split: set[tuple[str, str, int]] = field(default_factory=set)

    def labelled(self, a: float, b: float) -> float:
        """Busy time of the gather and copy-out labels that start in ``[a, b)`` (the gathers' own
        host time, costed with the gathers, not the pass)."""
        return self._busy_in(self.tables.gather_spans, a, b) + self._busy_in(self.tables.copy_out_spans, a, b)

    def framework(self, a: float, b: float, labelled: float) -> float:
        """Busy time in ``[a, b)`` inside FSDP's own ranges, less ``labelled``: :meth:`labelled` of
        ``[a, b)``, the gather and copy-out labels that start there (FSDP's ranges too, costed with the
        gathers)."""
        iv = self.tables.framework
        lo, hi = int(np.searchsorted(iv.end, a, "right")), int(np.searchsorted(iv.start, b, "left"))
        busy = sum(self.clock.between(max(float(s), a), min(float(e), b))
                   for s, e in zip(iv.start[lo:hi].tolist(), iv.end[lo:hi].tolist()))
        return max(0.0, busy - labelled)

    def _busy_in(self, iv: _Intervals, a: float, b: float) -> float:
        inside = (iv.start >= a) & (iv.start < b)
        return float(sum(self.clock.between(s, e) for s, e in zip(iv.start[inside], iv.end[inside])))

    def read(self, unit: str, part: str, phase: str, micro: int, a: int, b: int, gap_from: int,
             claimed: np.ndarray | None = None) -> tuple[Pass, Reduce | None]:
        """The pass of ``unit`` (``part``) in its frame ``[a, b)``. ``claimed``: the compute spans some
        pass of the phase counts as its compute (CPU only: those in this frame, this pass's own or another's,
        are compute, not this pass's host work around it)."""
        t, clock = self.tables, self.clock
        mine = self._compute_of(unit, part, phase, micro, a, b)
        # CPU, FSDP1's backward: a unit's window opens inside the one before it (its pre-backward hook
        # prefetches from there) and its post-backward hook fires late, inside the next unit's; the
        # windows, cut to follow one another, then hold other units' compute, which their own passes
        # already count: read as this pass's host time too, it would run twice in the replay. (The
        # pass's own spans start at or after ``first`` and end by ``compute_end``: before ``first`` and
        # after ``compute_end`` the claimed spans are others'.)
        m_start, m_end = t.c_start[mine], t.c_end[mine]
        in_labels = self.labelled(a, b)
        total = clock.between(a, b) - in_labels
        launches: list[tuple[float, float]] = []
        if len(m_start):
            first = float(t.c_issue[mine].min())
            labels_before = self.labelled(a, first)
            pre = clock.between(a, first) - labels_before - self._spans_busy(claimed, a, first)
            if self.gpu:
                compute, launches = self._kernels(a, b, first, m_start, m_end)
                # the host's part after the compute starts at the reshard (GPU: launches run ahead)
                k = int(np.searchsorted(t.reshard_starts, first, side="left"))
                compute_end = float(t.reshard_starts[k]) if k < len(t.reshard_starts) and t.reshard_starts[k] < b \
                    else float(b)
            else:
                compute = float(sum(clock.between(s, e) for s, e in zip(m_start.tolist(), m_end.tolist())))
                compute_end = float(m_end.max())
        else:
            # a frame without compute of its own can still hold another pass's (the root's part b, where a
            # unit's backward window opens before the root's closes and ends after it: ZeRO-3's first block)
            pre, compute = total - self._spans_busy(claimed, a, b), 0.0
            compute_end = float(b)
            first, labels_before = float(b), in_labels
        # CPU: the host's time in the frame less the compute spans in it, the pass's own and the others'
        # (the pass's own outside its frame are another frame's time)
        post = max(0.0, total - pre - (0.0 if self.gpu else compute if claimed is None else
                                       self._spans_busy(claimed, a, b)))
        rs = t.reshards
        at = (rs.unit == unit) & (t.reshard_phase == phase) & (rs.start >= a) & (rs.start < b)
        reshard_ns = float(sum(clock.between(x, y) for x, y in zip(rs.start[at].tolist(), rs.end[at].tolist())))
        rl = t.reduce_labels
        at = (rl.unit == unit) & (rl.start >= compute_end) & (rl.start < b)
        reduce_busy = float(sum(clock.between(x, y) for x, y in zip(rl.start[at].tolist(), rl.end[at].tolist())))
        after = max(compute_end, float(a))  # the pass's own compute may lie before its frame (above)
        # FSDP's post hooks close a unit's window; a part a ends where a child's window opens, so only
        # FSDP's own ranges in it are FSDP's
        p = Pass(unit=unit, phase=phase, micro=micro, part=part, gap_ns=clock.between(gap_from, a),
                 pre_ns=max(0.0, pre), compute_ns=compute, post_ns=post, reshard_ns=min(post, reshard_ns),
                 post_framework_ns=min(post, self.framework(after, b, self.labelled(after, b)) if part == "a" else
                                       max(0.0, clock.between(after, b) - self.labelled(after, b) - reduce_busy
                                           - self._spans_busy(claimed, after, b))),
                 reduce_host_ns=min(post, reduce_busy),
                 pre_framework_ns=min(max(0.0, pre), self.framework(a, first, labels_before)),
                 post_ranges_ns=min(post, self.framework(first, b, in_labels - labels_before)), launches=launches)
        return p, (self._reduce(p, a, b) if phase == vocabulary.BACKWARD else None)

    def _spans_busy(self, mask: np.ndarray | None, a: float, b: float) -> float:
        """Busy time of the compute spans in ``mask`` inside ``[a, b)``."""
        if mask is None or b <= a:
            return 0.0
        t = self.tables
        at = mask & (t.c_end > a) & (t.c_start < b)
        return float(sum(self.clock.between(max(float(s), a), min(float(e), b))
                         for s, e in zip(t.c_start[at].tolist(), t.c_end[at].tolist())))

    def claimed(self, frames: list[tuple[str, str, int, int, int]], phase: str, micro: int) -> np.ndarray:
        """The compute spans that the passes of ``frames`` (one phase and micro-batch) count as theirs."""
        out = np.zeros(len(self.tables.c_unit), dtype=bool)
        for unit, part, a, b, _ in frames:
            out |= self._compute_of(unit, part, phase, micro, a, b)
        return out

    def _compute_of(self, unit: str, part: str, phase: str, micro: int, a: int, b: int) -> np.ndarray:
        """Which of the step's compute spans are the pass's (its frame ``[a, b)``)."""
        t = self.tables
        mine = (t.c_unit == unit) & (t.c_phase == phase) & (t.c_micro == micro)
        if part or (unit, phase, micro) in self.split:
            # the root's compute before (a) and after (b) its children; a unit's is all its own
            mine &= (t.c_issue >= a) & (t.c_issue < b)
        return mine

    def first_issue(self, p: Pass, a: int, b: int) -> float | None:
        """When pass ``p`` (its frame ``[a, b)``) issued its first compute; None where it computed nothing."""
        mine = self._compute_of(p.unit, p.part, p.phase, p.micro, a, b)
        return float(self.tables.c_issue[mine].min()) if mine.any() else None

    def _kernels(self, a: int, b: int, first: float, starts: np.ndarray,
                 ends: np.ndarray) -> tuple[float, list[tuple[float, float]]]:
        """GPU: the time the pass's kernels (launched in ``[a, b)``) kept the device busy inside its
        compute spans ``starts``/``ends``, and those kernels in at most ``LAUNCH_GROUPS`` groups of
        consecutive launches (:attr:`Pass.launches`): each group's first launch (the host's busy time
        from ``first``, the pass's first launch) and its share of the busy time (in proportion to its
        kernels' own time, so that the groups add up to it). A span runs from its first kernel to its
        last, so where the host launched slower than the device ran, it also holds the device's idle
        waits for the launches, which the program already counts as the host's time."""
        if self.kernels is None:
            return float((ends - starts).sum()), []
        k = self.kernels
        lo, hi = np.searchsorted(k.launch, a, "left"), np.searchsorted(k.launch, b, "left")
        ks, ke, kl = k.start[lo:hi], k.end[lo:hi], k.launch[lo:hi]
        busy = 0.0
        held = np.zeros(len(ks), dtype=bool)
        for s, e in zip(starts.tolist(), ends.tolist()):
            inside = (ks >= s) & (ke <= e)
            busy += float(total_ns(union_intervals(ks[inside], ke[inside])))
            held |= inside
        if busy <= 0 or not held.any():
            return busy, []
        dur = (ke[held] - ks[held]).astype(np.float64)
        total = float(dur.sum())
        at = [max(0.0, self.clock.between(first, float(t))) for t in kl[held].tolist()]
        # each group's share of the busy time in proportion to its kernels' own time
        share = (dur / total if total > 0 else np.full(len(dur), 1.0 / len(dur))) * busy
        return busy, launch_groups(list(zip(at, share.tolist(), strict=True)))

    def _reduce(self, p: Pass, a: int, b: int) -> Reduce | None:
        """The unit's reduction issued in its backward pass ``[a, b)`` (and ``p.reduce_after_ns``)."""
        t = self.tables
        red = (t.r_unit == p.unit) & (t.r_micro == p.micro) & (t.r_cols["issue_ns"] >= a) & (t.r_cols["issue_ns"] < b)
        rs = red & (t.r_kind == vocabulary.REDUCE_SCATTER)
        if not rs.any():
            return None
        ar = red & (t.r_kind == vocabulary.ALL_REDUCE)
        issue_t = float(t.r_cols["issue_ns"][rs].min())
        p.reduce_after_ns = min(p.post_ns, self.clock.between(issue_t, b))
        return Reduce(unit=p.unit, micro=p.micro, bytes=int(np.clip(t.r_cols["bytes"][rs], 0, None).sum()),
                      comm_ns=_comm_ns(t.r_from[rs], t.r_cols["end_ns"][rs], self.gpu),
                      ar_bytes=int(np.clip(t.r_cols["bytes"][ar], 0, None).sum()),
                      ar_ns=_comm_ns(t.r_from[ar], t.r_cols["end_ns"][ar], self.gpu) if ar.any() else 0.0,
                      host_ns=p.reduce_host_ns, prep_ns=self._prep(p.unit, issue_t))

    def _prep(self, unit: str, issue_t: float) -> float:
        """GPU: the kernels its reduction label launched before the reduce-scatter (FSDP2's chunk_cat)."""
        if self.work is None:
            return 0.0
        rl = self.tables.reduce_labels
        at = (rl.unit == unit) & (rl.start <= issue_t) & (rl.end >= issue_t)
        if not at.any():
            return 0.0
        launch = self.work["launch_ns"].to_numpy(np.int64)
        self.prep_from.append((float(rl.start[at].min()), issue_t))
        k = (launch >= int(rl.start[at].min())) & (launch < issue_t) & ~self.work["is_comm"].to_numpy(bool)
        return float((self.work["end_ns"].to_numpy(np.int64)[k] - self.work["start_ns"].to_numpy(np.int64)[k]).sum())


def launch_groups(kernels: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Kernels in launch order, each (its launch, its time), in at most ``LAUNCH_GROUPS`` groups of
    consecutive launches: each group's first launch and its kernels' time."""
    if not kernels:
        return []
    return [(float(kernels[part[0]][0]), float(sum(kernels[i][1] for i in part)))
            for part in np.array_split(np.arange(len(kernels)), min(LAUNCH_GROUPS, len(kernels)))]


def _read_step(rank: int, step: int, t0: int, t1: int, parts: dict[str, pd.DataFrame], clock: BusyClock,
               work: pd.DataFrame | None, gpu: bool, unit_bytes: dict[str, int],
               kernels: _Kernels | None, own: _FsdpKernels | None = None,
               lane_work: _LaneWork | None = None) -> StepProgram:
    """One rank's step as a :class:`StepProgram` (see the module docstring)."""
    tables = _StepTables.read(parts, step, gpu)
    reader = _PassReader(tables, clock, work, gpu, kernels)
    frames: list[tuple[int, str, str, str, int, int]] = []  # (micro, unit, phase, part, start, end), host order
    read: list[Pass] = []  # the pass of each frame
    reduces: list[Reduce] = []
    batches: list[MicroBatch] = []
    cursor = float(t0)
    for micro in sorted(set(tables.windows["micro"].tolist())) or [0]:
        passes: dict[str, list[Pass]] = {vocabulary.FORWARD: [], vocabulary.BACKWARD: []}
        bounds: dict[str, tuple[float, float]] = {}
        for phase in (vocabulary.FORWARD, vocabulary.BACKWARD):
            wins = _windows(tables.windows, step, micro, phase)
            if not wins:
                continue
            bounds[phase] = (min(w.start for w in wins), max(w.end for w in wins))
            framed = list(_pass_frames(wins))
            reader.split.update((unit, phase, micro) for unit, part, *_ in framed if part)
            claimed = None if gpu else reader.claimed(framed, phase, micro)
            for unit, part, a, b, gap_from in framed:
                frames.append((micro, unit, phase, part, a, b))
                p, reduce = reader.read(unit, part, phase, micro, a, b, gap_from, claimed)
                passes[phase].append(p)
                read.append(p)
                if reduce is not None:
                    reduces.append(reduce)
        pre_end = bounds[vocabulary.FORWARD][0] if vocabulary.FORWARD in bounds else cursor
        mid_from = bounds[vocabulary.FORWARD][1] if vocabulary.FORWARD in bounds else pre_end
        mid_to = bounds[vocabulary.BACKWARD][0] if vocabulary.BACKWARD in bounds else mid_from
        batches.append(MicroBatch(pre=_segment(cursor, pre_end, clock, work, gpu), forward=passes[vocabulary.FORWARD],
                                  mid=_segment(mid_from, mid_to, clock, work, gpu), backward=passes[vocabulary.BACKWARD],
                                  micro=int(micro)))
        cursor = bounds[vocabulary.BACKWARD][1] if vocabulary.BACKWARD in bounds else mid_to
    gathers = _gathers(tables, frames, clock, gpu, unit_bytes, lane_work)
    if own is not None and frames:
        _own_kernels(own, t0, t1, tables, frames, read, reader, gathers)
    post = _segment(cursor, t1, clock, work, gpu)
    if not gpu:
        post.lead_ns = _optimizer_lead(tables.spans, cursor, t1, clock)
    return StepProgram(rank=rank, step=step, step_ns=t1 - t0, micro=batches, post=post, gathers=gathers,
                       reduces=reduces)


def _own_kernels(own: _FsdpKernels, t0: int, t1: int, tables: _StepTables,
                 frames: list[tuple[int, str, str, str, int, int]], read: list[Pass], reader: _PassReader,
                 gathers: list[Gather]) -> None:
    """Give each gather and pass FSDP's own kernels launched in the step ``[t0, t1)`` beyond what the
    program already holds: the gathers' copy-in and copy-out spans and the reductions' prep. One
    launched inside a gather label is that gather's (in the phase of the pass that launched it: under a
    fake process group, its copies of the shard into each rank's chunk), before its copy-in (FSDP2's cast
    of the parameters: ``Gather.lead_ns``) or after it, with where in the label the first of each was
    launched (``lead_at``, ``kernels_at``). Any other belongs to the unit
    its range names (a prefetched gather's to the unit gathered, in the phase and micro-batch of the
    pass that launched it; FSDP1's ranges that name none, to that pass), before that unit's compute
    (``fsdp_pre``) or after it (``fsdp_post``). One launched between two passes of a phase is the next
    pass's (its gap's). One launched before the first pass or between phases is its segment's device
    work already where it is a kernel (:func:`_segment`); a copy there is in no part of the program
    (none on the shared recordings)."""
    lo, hi = np.searchsorted(own.launch, t0, "left"), np.searchsorted(own.launch, t1, "left")
    if hi <= lo:
        return
    launch, dur = own.launch[lo:hi], (own.end[lo:hi] - own.start[lo:hi]).astype(np.float64)
    start, lane, unit, main = own.start[lo:hi], own.lane[lo:hi], own.unit[lo:hi], own.main[lo:hi]
    held = np.zeros(len(launch), dtype=bool)
    spans = tables.spans[tables.spans["kind"].isin([vocabulary.COPY_IN, vocabulary.COPY_OUT]).to_numpy()]
    for name, g in spans.groupby(as_str(spans["lane"]), sort=False):
        mine = lane == name
        held[mine] |= inside(start[mine], union_intervals(g["start_ns"].to_numpy(np.int64),
                                                          g["end_ns"].to_numpy(np.int64)))
    for a, b in reader.prep_from:
        held |= (launch >= a) & (launch < b)
    f_start = np.array([f[4] for f in frames], dtype=np.int64)
    order = np.argsort(f_start, kind="stable")
    by_key: dict[tuple[int, str, str], list[int]] = {}
    for i, (micro, u, phase, _part, _a, _b) in enumerate(frames):
        by_key.setdefault((micro, u, phase), []).append(i)
    firsts: dict[int, float | None] = {}
    labels = tables.gather_labels
    g_unit, g_micro = as_str(labels["unit"]), labels["micro"].to_numpy()
    g_cols = _columns(labels, ("start_ns", "end_ns"))
    by_gather = {(g.unit, g.phase, g.micro): g for g in gathers}
    seen: set[tuple[int, bool]] = set()  # (gather, before its copy-in) whose first kernel is read
    for k in np.flatnonzero(~held):
        t = int(launch[k])
        j = int(np.searchsorted(f_start[order], t, side="right")) - 1
        f = int(order[max(j, 0)])
        if j < 0:  # before the first pass: the step's first segment holds it
            continue
        if t >= frames[f][5]:
            nxt = int(order[j + 1]) if j + 1 < len(order) else -1
            if nxt < 0 or frames[nxt][:3:2] != frames[f][:3:2]:  # after a phase: a segment holds it
                continue
            f = nxt  # between two passes of a phase: the next one's, whose gap it is
        micro, u, phase = frames[f][0], frames[f][1], frames[f][2]
        at = np.flatnonzero((g_cols["start_ns"] <= t) & (g_cols["end_ns"] > t))
        found = next(((by_gather[key], int(i)) for i in at
                      if (key := (str(g_unit[i]), phase, int(g_micro[i]))) in by_gather), None)
        if found is not None:
            gather, i = found
            here = reader.clock.between(float(g_cols["start_ns"][i]), t)
            _label_kernel(gather, here, float(dur[k]), seen)
            continue
        target = by_key.get((micro, str(unit[k]), phase)) if unit[k] and unit[k] != u else None
        if target:  # another unit's (a prefetch): its pass that had not ended by the launch
            f = next((i for i in target if frames[i][5] > t), target[-1])
        p = read[f]
        if f not in firsts:
            firsts[f] = reader.first_issue(p, frames[f][4], frames[f][5])
        # a pass without compute has no before: its kernels run after it, and no setting drops them
        first = firsts[f]
        before = (first is not None and t < first) or (target is not None and frames[f][4] > t)
        if before and main[k]:
            p.fsdp_pre_ns += dur[k]
            a = frames[f][4]
            p.fsdp_pre_launches.append((max(0.0, reader.clock.between(a, t) - reader.labelled(a, t)), float(dur[k])))
        elif before:
            p.fsdp_pre_side_ns += dur[k]
        elif main[k]:
            p.fsdp_post_ns += dur[k]
        else:
            p.fsdp_post_side_ns += dur[k]
    # one by one above, in launch order; grouped as a pass's compute is
    for p in read:
        p.fsdp_pre_launches = launch_groups(p.fsdp_pre_launches)
    for gather in gathers:
        gather.kernel_launches = launch_groups(gather.kernel_launches)


def _label_kernel(gather: Gather, busy_ns: float, dur: float, seen: set[tuple[int, bool]]) -> None:
    """Give ``gather`` a kernel its label launched ``busy_ns`` of host time after it began: before the
    copy-in (FSDP2's cast of the parameters, on the copy-in's stream ahead of it) or after it (a fake
    group's copies), with where in the label the first of each was launched (``seen``: the gathers and
    sides already given one; launches come in order, so the first is the earliest)."""
    here = min(1.0, busy_ns / gather.host_ns) if gather.host_ns > 0 else 1.0
    lead = bool(gather.copy_in_ns) and here < gather.copy_in_at
    if (id(gather), lead) not in seen:
        seen.add((id(gather), lead))
        if lead:
            gather.lead_at = here
        else:
            gather.kernels_at = here
    if lead:
        gather.lead_ns += dur
    else:
        gather.kernel_launches.append((here, dur))
    gather.kernels_ns += dur


def _optimizer_lead(spans: pd.DataFrame, a: float, b: float, clock: BusyClock) -> float:
    """CPU: the host time of the end segment ``a`` to ``b`` before the optimizer's own step (its
    ``Optimizer.step#`` range, a compute span of no unit): that stretch read as a segment, its busy time
    and its waits, as the simulator plays the segment (:attr:`Segment.lead_ns`); 0 where the segment holds
    no such range (also where the range began before the backward's end: the whole segment is then the
    optimizer's). No wait crosses the range's start: the busy clock's waits leave compute spans out."""
    opt = spans[(spans["phase"] == vocabulary.OPTIMIZER).to_numpy() & (spans["unit"] == "").to_numpy()
                & (spans["kind"] == vocabulary.COMPUTE).to_numpy()]
    starts = opt["start_ns"].to_numpy(np.float64)
    starts = starts[(starts >= a) & (starts < b)]
    if not len(starts):
        return 0.0
    lead = _segment(a, float(starts.min()), clock, None, False)
    return lead.busy_ns + sum(lead.comm_ns)


def _comm_ns(start: np.ndarray, end: np.ndarray, gpu: bool, busy: Intervals | None = None) -> float:
    """A collective's time: on its stream (GPU: ``start`` is its start), or what the host waited for it
    (CPU: ``start`` is where the wait began, see :func:`_wait_from`), less the host's compute meanwhile
    (``busy``: ZeRO-3 issues its prefetches asynchronously, and the busy clock already counts that
    compute as the host's own time)."""
    if gpu:
        return float((end - start).sum())
    total = float(np.clip(end - start, 0, None).sum())
    if busy is None or not len(busy[0]) or not len(start):
        return total
    waits = union_intervals(start, end)
    return float(total - total_ns(intersect_intervals(waits, busy)))


def _with_wait_start(spans: pd.DataFrame) -> pd.DataFrame:
    """CPU: when each collective's own wait begins -- its issue, or the end of the collective before
    it when that ran later. ZeRO-3 issues several prefetches at once: each one's issue-to-end would
    hold the ones queued before it. The gloo threads of a rank (two per process group) share its
    connections to the peers, so a collective queues behind the one before it on any of them: the
    wait is read over all of a rank's collectives, not thread by thread (how much closer that brings
    ZeRO-3's replay: benchmarks/bench_whatif_replay.py, docs/whatif.md)."""
    comm = spans["kind"].isin(list(vocabulary.UNIT_COLLECTIVES)).to_numpy()
    wait_from = spans["issue_ns"].to_numpy(np.int64).copy()
    if comm.any():
        rows = spans[comm].sort_values("start_ns", kind="stable")
        starts, ends = rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64)
        prev = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]])
        # rows of one collective that carried several units share its times: same wait start
        same = np.concatenate([[False], (starts[1:] == starts[:-1]) & (ends[1:] == ends[:-1])])
        for i in np.flatnonzero(same):  # in order, so that a run of rows takes its first row's value
            prev[i] = prev[i - 1]
        positions = spans.index.get_indexer(rows.index)
        wait_from[positions] = np.maximum(rows["issue_ns"].to_numpy(np.int64), prev)
    return spans.assign(wait_from_ns=wait_from)


def _segment(a: float, b: float, clock: BusyClock, work: pd.DataFrame | None, gpu: bool) -> Segment:
    """Host work from ``a`` to ``b`` outside every unit (see :class:`Segment`)."""
    seg = Segment(busy_ns=clock.between(a, b))
    if b <= a:
        return seg
    if gpu and work is not None:
        launched = work[((work["launch_ns"] >= a) & (work["launch_ns"] < b) & work["is_compute"]
                         & ~work["is_comm"]).to_numpy()]
        seg.device_ns = float((launched["end_ns"] - launched["start_ns"]).sum())
        inside = (clock.s >= a) & (clock.s < b)
        seg.sync_at = [clock.between(a, s) for s in clock.s[inside]]
    elif not gpu:
        blocked_s, blocked_e = clock.s, clock.e
        inside = (blocked_s >= a) & (blocked_s < b)
        seg.comm_ns = [float(e - s) for s, e in zip(blocked_s[inside], blocked_e[inside])]
        seg.comm_kinds = _wait_kinds(clock, np.flatnonzero(inside))
    return seg


@dataclass(slots=True)
class _LaneWork:
    """A rank's GPU work per lane (stream), sorted by start: how long it kept a stream busy between two
    instants."""

    lanes: dict[str, tuple[np.ndarray, np.ndarray]]

    @classmethod
    def of(cls, work: pd.DataFrame) -> _LaneWork:
        out = {}
        for lane, g in work.groupby(work["lane"].astype(str), sort=False):
            g = g.sort_values("start_ns", kind="stable")
            out[str(lane)] = (g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
        return cls(out)

    def busy(self, lanes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Per span (``lanes``, ``starts``, ``ends``): the time the GPU work that ran wholly inside it on
        its lane took."""
        out = np.zeros(len(starts), dtype=np.float64)
        for i, (lane, a, b) in enumerate(zip(lanes.tolist(), starts.tolist(), ends.tolist())):
            if str(lane) not in self.lanes:
                out[i] = float(b - a)  # no GPU work of the lane known: the span as it is
                continue
            s, e = self.lanes[str(lane)]
            lo, hi = int(np.searchsorted(s, a, "left")), int(np.searchsorted(s, b, "right"))
            ks, ke = s[lo:hi], e[lo:hi]
            keep = ke <= b
            out[i] = float(total_ns(union_intervals(ks[keep], ke[keep])))
        return out


@dataclass(slots=True)
class _Copies:
    """A step's gather copies, for one gather at a time: its copy-in and copy-out kernels (the
    spans of its unit's pass) and the host time of the copy-out label that followed its issue."""

    clock: BusyClock
    gpu: bool
    ci_pass: tuple[np.ndarray, np.ndarray, np.ndarray]
    ci: dict[str, np.ndarray]
    co_pass: tuple[np.ndarray, np.ndarray, np.ndarray]
    co: dict[str, np.ndarray]
    col_unit: np.ndarray
    col_micro: np.ndarray
    col: dict[str, np.ndarray]

    @classmethod
    def of(cls, tables: _StepTables, clock: BusyClock, gpu: bool, lanes: _LaneWork | None = None) -> _Copies:
        """``lanes``: the rank's GPU work, which a copy span's kernels are read from (a span runs from the
        first kernel its label launched to the last, and holds the stream's idle waits between them: for
        the gather it copies out, on a fake group for the group's copies)."""
        spans = tables.spans
        copy_in = spans[(spans["kind"] == vocabulary.COPY_IN).to_numpy()]
        copy_out = spans[(spans["kind"] == vocabulary.COPY_OUT).to_numpy()]
        labels = tables.copy_out_labels
        ci, co = _columns(copy_in, ("issue_ns", "start_ns", "end_ns")), _columns(copy_out, ("start_ns", "end_ns"))
        for cols, rows in ((ci, copy_in), (co, copy_out)):
            cols["busy"] = (lanes.busy(as_str(rows["lane"]), cols["start_ns"], cols["end_ns"]) if lanes is not None
                            else (cols["end_ns"] - cols["start_ns"]).astype(np.float64))
        return cls(clock=clock, gpu=gpu, ci_pass=_pass_columns(copy_in), ci=ci,
                   co_pass=_pass_columns(copy_out), co=co,
                   col_unit=as_str(labels["unit"]), col_micro=labels["micro"].to_numpy(),
                   col=_columns(labels, ("start_ns", "end_ns")))

    def gather(self, unit: str, phase: str, micro: int, issue: float, nbytes: int, host_ns: float,
               comm_ns: float, issued_in: tuple[str, str, str] | None, label_start: float | None = None) -> Gather:
        """The gather of ``unit`` consumed in ``phase``, issued at ``issue`` (its label from ``label_start``),
        with its copies."""
        ci_pass, ci, co_pass, co = self.ci_pass, self.ci, self.co_pass, self.co
        in_pass = (ci_pass[0] == unit) & (ci_pass[1] == phase) & (ci_pass[2] == micro)
        copy_in_at = 1.0
        if self.gpu and label_start is not None and host_ns > 0 and in_pass.any():
            copy_in_at = min(1.0, self.clock.between(label_start, float(ci["issue_ns"][in_pass].min())) / host_ns)
        out_pass = (co_pass[0] == unit) & (co_pass[1] == phase) & (co_pass[2] == micro)
        later = np.flatnonzero((self.col_unit == unit) & (self.col_micro == micro) & (self.col["start_ns"] >= issue))
        first = later[np.argsort(self.col["start_ns"][later])[:1]]
        co_spans = zip(self.col["start_ns"][first].tolist(), self.col["end_ns"][first].tolist())
        return Gather(
            unit=unit, phase=phase, micro=micro, bytes=nbytes, host_ns=host_ns,
            copy_in_ns=float(ci["busy"][in_pass].sum()) if self.gpu else 0.0,
            comm_ns=comm_ns, copy_out_host_ns=float(sum(self.clock.between(a, b) for a, b in co_spans)),
            copy_out_ns=float(co["busy"][out_pass].sum()) if self.gpu else 0.0,
            issued_in=issued_in, copy_in_at=copy_in_at)


def _gathers(tables: _StepTables, frames: list[tuple[int, str, str, str, int, int]], clock: BusyClock,
             gpu: bool, unit_bytes: dict[str, int], lanes: _LaneWork | None = None) -> list[Gather]:
    """Every all-gather of the step with its costs and the pass that issued it."""
    spans, compute = tables.spans, tables.compute
    gather_labels = tables.gather_labels
    copies = _Copies.of(tables, clock, gpu, lanes)
    ag = spans[(spans["kind"] == vocabulary.ALL_GATHER).to_numpy()]
    if ag.empty:
        return _label_gathers(tables, frames, clock, copies, unit_bytes)
    # A collective that carried several units (ZeRO-3's prefetch buckets: one row per unit) is
    # issued once: it costs its first unit, in issue order; the others come with it.
    ag = ag.sort_values(["issue_ns", "start_ns"], kind="stable")
    owner = ~ag.duplicated(["lane", "start_ns", "end_ns"], keep="first").to_numpy()
    # Columns once, as arrays: the loop below runs per gather and must not build DataFrames.
    ag_cols = _columns(ag, ("issue_ns", "start_ns", "end_ns", "bytes"))
    ag_wait = _wait_from(ag)
    keys = list(zip(as_str(ag["unit"]), as_str(ag["phase"]), ag["micro"].tolist()))
    rows_of: dict[tuple[str, str, int], list[int]] = {}
    for i, key in enumerate(keys):  # groups in order of first appearance, rows in issue order
        rows_of.setdefault(key, []).append(i)
    lab = _columns(gather_labels, ("start_ns", "end_ns"))
    # a label names every unit its collective carried (ZeRO-3's bucket: "blocks.0, blocks.1"); a unit of
    # a module list is named as one ("[blocks.0, blocks.1]")
    lab_units = [frozenset((u, *listed_units(u))) for u in as_str(gather_labels["unit"]).tolist()]
    busy = None if gpu else union_intervals(compute["start_ns"].to_numpy(np.int64),
                                            compute["end_ns"].to_numpy(np.int64))
    out = []
    for (unit, phase, micro), members in rows_of.items():
        rows = np.array([i for i in members if owner[i]], dtype=np.int64)
        if not len(rows):  # gathered by a collective of an earlier unit: nothing to issue
            out.append(Gather(unit=unit, phase=phase, micro=micro, bytes=0, host_ns=0.0, copy_in_ns=0.0,
                              comm_ns=0.0, copy_out_host_ns=0.0, copy_out_ns=0.0, issued_in=None))
            continue
        issue = float(ag_cols["issue_ns"][rows].min())
        at = np.fromiter((unit in us for us in lab_units), dtype=bool, count=len(lab_units)) \
            & (lab["start_ns"] <= issue) & (lab["end_ns"] >= issue)
        out.append(copies.gather(
            unit, phase, micro, issue, nbytes=int(np.clip(ag_cols["bytes"][rows], 0, None).sum()),
            host_ns=float(sum(clock.between(s, e) for s, e in zip(lab["start_ns"][at].tolist(),
                                                                   lab["end_ns"][at].tolist()))),
            comm_ns=_comm_ns(ag_cols["start_ns"][rows] if gpu else ag_wait[rows], ag_cols["end_ns"][rows], gpu,
                             busy),
            issued_in=_issuer(frames, micro, issue),
            label_start=float(lab["start_ns"][at].min()) if at.any() else None))
    return out


def _label_gathers(tables: _StepTables, frames: list[tuple[int, str, str, str, int, int]], clock: BusyClock,
                   copies: _Copies, unit_bytes: dict[str, int]) -> list[Gather]:
    """The all-gathers FSDP's labels show where no collective ran (torch's fake process group): the
    labels' host work (the copy-in, the call, the copy-out) and the copies' kernels, with no
    communication. Without them that host work would be in no part of the step's program."""
    labels = tables.gather_labels
    if labels.empty:
        return []
    # one rank's step (the windows are read per rank and step): its passes by micro-batch
    first = first_backward_ns(tables.windows).groupby(level="micro").min()
    first_backward = dict(zip(first.index.astype(int).tolist(), first.astype("int64").tolist()))
    out = []
    rows = labels.sort_values("start_ns", kind="stable")
    for unit, micro, start, end in zip(as_str(rows["unit"]), rows["micro"].tolist(), rows["start_ns"].tolist(),
                                       rows["end_ns"].tolist()):
        micro = 0 if pd.isna(micro) else int(micro)
        phase = vocabulary.BACKWARD if start >= first_backward.get(micro, np.iinfo(np.int64).max) \
            else vocabulary.FORWARD
        out.append(copies.gather(unit, phase, micro, start, nbytes=max(0, unit_bytes.get(unit, 0)),
                                 host_ns=clock.between(start, end), comm_ns=0.0,
                                 issued_in=_issuer(frames, micro, start), label_start=start))
    return out


def _columns(frame: pd.DataFrame, names: Sequence[str]) -> dict[str, np.ndarray]:
    return {name: frame[name].to_numpy(np.int64) for name in names}


def _pass_columns(rows: pd.DataFrame, second: str = "phase") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unit, phase (or another text column) and micro-batch of each row, as arrays."""
    return as_str(rows["unit"]), as_str(rows[second]), rows["micro"].to_numpy(np.int64)


def _wait_from(rows: pd.DataFrame) -> np.ndarray:
    """CPU: where the host's wait for each collective began (:func:`_with_wait_start`; its issue
    when not known)."""
    return (rows["wait_from_ns"] if "wait_from_ns" in rows.columns else rows["issue_ns"]).to_numpy(np.int64)


def _issuer(frames: list[tuple[int, str, str, str, int, int]], micro: int,
            issue: float) -> tuple[str, str, str] | None:
    """The pass whose window the gather was issued in (FSDP2: a unit's own gather in its own
    pre-forward / pre-backward, a prefetch in an earlier unit's); between windows, the next pass."""
    mine = [f for f in frames if f[0] == micro]
    for _, unit, phase, part, a, b in mine:
        if a <= issue < b:
            return unit, phase, part
    later = [f for f in mine if f[4] > issue]
    if later:
        _, unit, phase, part, _, _ = min(later, key=lambda f: f[4])
        return unit, phase, part
    return None
