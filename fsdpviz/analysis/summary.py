"""The summary of a run: :class:`Summary`, typed, and its JSON form, the ``fsdpviz summary --json`` dict.

The JSON is a contract (docs/concepts.md, "The summary": framework, world size, ranks, steps, step
time, overlap, memory peaks, units, findings); scripts compare runs with it, so keys are only ever added. Values
are plain JSON types: ints, floats rounded for reading (ms to the µs, percentages to 0.01),
``None`` where a number does not exist (no communication, no memory samples). In the process the
summary travels as the :class:`Summary` struct (``Summary.to_json()`` gives the dict), built as a
view of one pipeline result (:func:`summary_of`): it computes nothing the analysis has not.

Conventions (docs/concepts.md): ``steps`` are the analysed ProfilerSteps (by default every step the
trace holds complete, see :mod:`fsdpviz.structure.steps`); ``step_time_ms`` is the run's step (the
timers' clean unprofiled steps where they lead, else ``traced_step_time_ms``: each rank's mean
analysed step as traced, median over ranks); the overlap's ``comm_ms`` / ``compute_ms`` /
``fsdp_overhead_ms`` / ``exposed_comm_ms`` / ``idle_ms`` are per step on the same clock (the bound's
parts, :mod:`fsdpviz.structure.deprofile`), its ``as_traced`` block the trace's own (HTA's
definitions), and its ``overlap_pct`` is Σ|comm ∩ compute| / Σ|comm| over ranks; memory peaks
are the largest samples in the analysed steps (GPU devices when the trace has any, else the CPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec
import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.analysis.actions import (
    Action,
    build_actions,
    full_bucket,
    knob_blocked,
    waits_out_collectives,
)
from fsdpviz.analysis.bound import (
    BoundSummary,
    RankBound,
    clock_scale,
    comm_clock_scale,
    device_memory_bytes,
    traced_step_ms,
    with_memory,
)
from fsdpviz.analysis.completeness import gap_notes
from fsdpviz.analysis.findings import (
    CAUSE_OUTLASTS_AFTER,
    CAUSE_OUTSIDE_UNITS,
    CAUSE_STRAGGLER,
    CAUSE_WAITED_OUT,
    OUTLASTS_AFTER_WORDS,
    WAITED_OUT_WORDS,
)
from fsdpviz.analysis.memory_categories import (
    LEVEL_ALLOCATOR,
    LEVEL_MEASURED_BASELINE,
    LEVEL_SINCE_TRACE_START,
    PeakCategories,
    peak_categories,
    unit_peak_categories,
)
from fsdpviz.analysis.units import UnitSummary, summary_records
from fsdpviz.analysis.unseen_frees import ADDRESS_REUSE, COLLECTIVE_END
from fsdpviz.formatting import ms
from fsdpviz.structure.framework import framework_notes
from fsdpviz.structure.parallelism import Parallelism, RunParallelism
from fsdpviz.structure.profiler_cost import (
    ProfilerCost,
    crowded_host_names,
    no_cost_note,
    unit_pass_ms,
    units_timed_in_clean_steps,
)
from fsdpviz.structure.purposes import per_step_ns
from fsdpviz.structure.records import (
    BY_PURPOSE_UNKNOWN,
    CLEAN_STEPS_UNIT_TIMED,
    NO_COMMUNICATION,
    NO_FSDP_LABELS,
    NO_MEMORY,
    NO_UNITS_FOUND,
    PROFILED_WINDOW_PACE,
    PROFILER_COST_UNUSED,
    SKIPPED_FILES,
    UNITS_WITHOUT_WORK,
    Finding,
    Note,
    texts,
)
from fsdpviz.structure.steps import AnalysedSteps, StepSelection
from fsdpviz.trace.frames import measured_baseline
from fsdpviz.trace.schema import OVERLAP_CPU, OVERLAP_GPU
from fsdpviz.trace.tables import TraceSet

if TYPE_CHECKING:
    from fsdpviz.analysis.run import RunAnalysis
    from fsdpviz.runfolder import RunInfo

STEP_TIME_TIMERS: Final = "timers"
STEP_TIME_TRACE: Final = "trace"


class RankOverlap(msgspec.Struct, kw_only=True):
    """One rank's whole-step overlap, per step, on the run's clock: its bound's parts (``compute_ms``
    the model's, ``fsdp_overhead_ms`` FSDP's per-unit work, ``idle_ms`` host wait plus other idle) and
    its communication moved as its exposed communication was (``RankBound.comm_scale``)."""

    overlap_pct: float | None
    comm_ms: float | None
    compute_ms: float | None
    exposed_comm_ms: float | None
    idle_ms: float | None
    device: str
    fsdp_overhead_ms: float | None = None


class OverlapFigures(msgspec.Struct, kw_only=True):
    """Whole-step overlap per step, on one clock (the subclasses say which), and per rank."""

    comm_ms: float | None
    compute_ms: float | None
    exposed_comm_ms: float | None
    overlap_pct: float | None
    idle_ms: float | None
    per_rank: dict[str, RankOverlap]


class TracedOverlap(OverlapFigures, kw_only=True):
    """The overlap as traced (HTA's definitions, on the profiler's clock): ``compute_ms`` is every busy
    time outside exposed communication (the model's and FSDP's), ``idle_ms`` the rest of the step."""


class OverlapSummary(OverlapFigures, kw_only=True):
    """Whole-step overlap per step on the run's clock (the bound's parts: ``exposed_comm_ms``,
    ``compute_ms``, ``fsdp_overhead_ms`` and ``idle_ms`` are the bound's, median over ranks);
    ``overlap_pct`` over all ranks' time; ``as_traced`` the same figures on the trace's clock."""

    by_purpose: dict[str, PurposeOverlap] | None = None
    """Per purpose (vocabulary.PURPOSES: FSDP's all-gathers and reduce-scatters, HSDP's all-reduces,
    tensor parallelism, other), its communication and exposed time per step, the median over ranks;
    None where the traces have no FSDP labels to tell FSDP's collectives by (a note says so)."""
    fsdp_overhead_ms: float | None = None
    as_traced: TracedOverlap | None = None


class PurposeOverlap(msgspec.Struct, kw_only=True):
    """One purpose's communication per step: the union of its collectives and what no compute hid."""

    comm_ms: float | None
    exposed_ms: float | None


class RankMemory(msgspec.Struct, kw_only=True):
    peak_allocated_bytes: int


class NotSeenFreed(msgspec.Struct, kw_only=True):
    """Blocks the profiler saw allocated and never saw freed (a gloo thread freed them), over the
    whole trace and every rank: fsdpviz takes each out of the level where it died
    (:mod:`fsdpviz.analysis.unseen_frees`), so no peak counts them."""

    blocks: int
    bytes: int
    at_collective_end: int  # blocks freed when the collective that used them completed
    at_address_reuse: int  # blocks freed, at the latest, when their address was handed out again


class MemorySummary(msgspec.Struct, kw_only=True):
    """Allocator peaks in the analysed steps (GPU devices when there are any, else the CPU)."""

    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    device: str | None
    per_rank: dict[str, RankMemory]
    categories: dict[str, int | None] | None = None
    """At the highest peak of the analysed steps (``categories_at``), the bytes of each category
    (memory_categories.CATEGORIES; they add up to the peak when all are known); a category that
    cannot be known is None (``categories_at.unknown`` says why); None without unit labels or samples."""
    categories_at: PeakCategories | None = None
    level: str | None = None
    """What the allocated level counts (memory_categories.LEVEL_*): ``allocator`` (the GPU allocator's
    own level); on CPU ``since_trace_start`` (the profiler counts only what was allocated since the
    trace began) or ``since_trace_start_plus_measured`` (plus what fsdpviz record measured alive then:
    ``baseline_bytes``)."""
    baseline_bytes: int | None = None
    """On CPU, what the recorder measured alive when the trace began and added to the level (the
    highest over ranks); None when nothing was added."""
    model: dict[str, Any] | None = None
    """The ZeRO arithmetic beside the measured categories (memory.MemoryModel)."""
    not_seen_freed: NotSeenFreed | None = None
    """On CPU, the blocks whose free the profiler did not see, outside every peak and level (None:
    none found, or no per-unit analysis)."""


CALIBRATION_FACTOR: Final = "factor"
CALIBRATION_HOST_COST: Final = "host_cost"


class ClockSummary(msgspec.Struct, kw_only=True):
    """Which clock the run's figures are on (``summary --json`` ``clock``; docs/concepts.md, "One clock")."""

    basis: str
    """``replayed``: the recording replayed without the profiler, its host work calibrated on the
    timers' clean unprofiled steps; whatif predicts on that replay. ``traced``: no such replay (``note``
    says why); the predictions are the traced timeline's."""
    profiler_share_ms: float | None = None
    """How much longer a profiled step ran than a clean unprofiled one (timers); None without them."""
    replay_error_pct: float | None = None
    """How far the replay without the profiler misses the timers' clean step, in %; None when traced."""
    clean_steps: int | None = None
    """The fewest clean unprofiled steps a replayed rank timed (what the calibration rests on)."""
    phase_error_pct: float | None = None
    """Out of sample: the largest of ``phase_miss_pct``, in %; None where no unprofiled step timed its
    phases (``fsdpviz.replay.phases``)."""
    phase_miss_pct: dict[str, float] | None = None
    """Per phase (forward, backward, optimizer): the profiler's share the replay took out of it less the
    share the timers saw leave it, in % of the unprofiled step (median over ranks)."""
    phase_steps: int | None = None
    """The fewest unprofiled steps that timed their phases, over the ranks checked."""
    ranks: list[int] | None = None
    """The ranks replayed (None: every rank)."""
    calibration: Literal["factor", "host_cost"] | None = None
    """How the replay took the profiler out: :data:`CALIBRATION_FACTOR` (a CPU replay, each rank's traced
    step scaled onto its clean one by one factor: its step miss then reads 0.0 % by construction),
    :data:`CALIBRATION_HOST_COST` (a GPU replay, the profiler's measured excess taken out of every traced
    host event: the step it loses is the replay's own), or None (no replay without the profiler)."""
    note: str = ""


class Summary(msgspec.Struct, kw_only=True):
    """The headline numbers of a run (see the module docstring); ``to_json()`` is the contract."""

    framework: str
    world_size: int
    ranks: list[int]
    steps: list[int]
    step_time_ms: float | None
    """The run's step time: the timers' unprofiled steps where they can be trusted
    (``profiler.headline``), else the analysed steps as traced (``profiler.note`` says why)."""
    step_time_source: str = "trace"
    """``timers`` (unprofiled steps) or ``trace`` (the analysed steps)."""
    traced_step_time_ms: float | None = None
    """The analysed steps' mean duration as traced (slower than the run by ``profiler.slowdown``)."""
    profiler: ProfilerCost | None = None
    overlap: OverlapSummary
    memory: MemorySummary
    units: list[UnitSummary]
    parallelism: Parallelism = msgspec.field(default_factory=Parallelism)
    """The FSDP mesh and TP degree (structure/parallelism.py); a null size is unknown (a note says why)."""
    units_source: str | None = None
    """Where the units' sizes come from: ``run.json``, ``trace`` (their all-gathers' arguments, for
    a run.json without a unit table or traces recorded without fsdpviz), ``run.json+trace``; None
    where no unit has a known size."""
    device: str
    sources: list[str]
    run_dir: str | None
    notes: list[Note]
    missing_ranks: list[int]
    skipped_events: int
    findings: list[Finding]
    bound: BoundSummary | None = None
    """What bounds the step: compute, exposed communication, host wait, other idle
    (analysis/bound.py); None where no step has a span."""
    actions: list[Action] = msgspec.field(default_factory=list)
    """The bound's action, then alike findings as one line each, the first few shown and the rest
    ``folded`` (analysis/actions.py); predicted gains where a command filled them (whatif/gains.py)."""
    clock: ClockSummary | None = None
    """The clock the figures are on, where a command filled it (replay/clock.py, with the actions' gains)."""

    def to_json(self) -> dict[str, Any]:
        """The ``fsdpviz summary --json`` dict (notes as their words)."""
        out: dict[str, Any] = msgspec.to_builtins(self, enc_hook=str)  # a Note is its words
        out["notes"] = texts(self.notes)
        return out

    @property
    def exposed_comm_ms(self) -> float | None:
        """The run's exposed communication per step on its clock (``overlap.exposed_comm_ms``, the
        bound's part of the headline step)."""
        return self.overlap.exposed_comm_ms

    def has_note(self, code: str) -> bool:
        """Whether one of the notes has ``code`` (:mod:`fsdpviz.structure.records`)."""
        return any(n.code == code for n in self.notes)


def summary_of(traces: TraceSet, selection: StepSelection, overlap: pd.DataFrame, framework: str, *,
               profiler: ProfilerCost | None, analysis: RunAnalysis | None, parallel: RunParallelism,
               bound: BoundSummary | None) -> Summary:
    """The summary of one pipeline result (``RunResult.summary``): its steps, overlap, framework,
    what the profiler cost, its mesh (``parallel``) and, for a framework with units, the per-unit
    analysis' units and findings (``analysis``: None for a run without units, which never needs it);
    ``bound``: the run's bound (:func:`~fsdpviz.analysis.bound.summarize_bound`, read once by the
    pipeline for the findings' clock too), its memory added here."""
    analysed = selection.per_rank
    notes = _notes(traces, overlap, selection, framework)
    units: list[UnitSummary] = []
    findings: list[Finding] = []
    cost = profiler
    why = cost.note if cost is not None else no_cost_note(traces.timers, traces.run)
    if why is not None:
        notes.append(Note(PROFILER_COST_UNUSED, why))
    if cost is not None and cost.pace_note is not None:
        notes.append(Note(PROFILED_WINDOW_PACE, cost.pace_note))
    if cost is not None and units_timed_in_clean_steps(traces.timers, traces.run):
        notes.append(Note(CLEAN_STEPS_UNIT_TIMED, _unit_timed_clean_steps_words(_device(overlap))))
    traced_ms = traced_step_ms(overlap) if not overlap.empty else None
    if traced_ms is None:
        traced_ms = _step_time_ms(traces, analysed)
    lead = cost is not None and cost.headline
    memory = _with_categories(_memory_summary(traces, analysed), analysis, traces)
    if memory.peak_allocated_bytes is None:
        notes.append(Note(NO_MEMORY, _no_memory_words(traces.run, framework)))
    bound = with_memory(bound, memory.peak_allocated_bytes, device_memory_bytes(traces.ranks))
    if analysis is not None:
        timed = unit_pass_ms(traces.timers, traces.run)
        # the units' times on the run's clock, as the bound's (its factors: the one de-profiler's): their
        # collectives' as its communication, their host wait as its host wait
        scales = (clock_scale(bound), bound.host_scale if bound is not None else 1.0, comm_clock_scale(bound))
        units = [msgspec.structs.replace(u, forward_timer_ms=timed.get((u.name, "forward")),
                                         backward_timer_ms=timed.get((u.name, "backward")))
                 for u in summary_records(analysis.unit_stats, analysis.units, *scales)]
        findings = finding_entries(run_findings(analysis.findings, traces, overlap, framework))
        unit_peaks = unit_peak_categories(analysis.category_peaks, analysis.memory_unknown)
        units = [msgspec.structs.replace(u, peak_categories=unit_peaks.get(u.name)) for u in units]
        if not units:
            notes.append(Note(NO_UNITS_FOUND, "no FSDP unit was found in the analysed steps, so units is empty"))
        elif (idle := _units_without_work(analysis.units, {u.name for u in units})) is not None:
            notes.append(Note(UNITS_WITHOUT_WORK, idle))
    notes.extend(parallel.notes)
    units = _with_scope(units, traces, parallel.parallelism)
    over = _overlap_summary(overlap, bound)
    if analysis is not None and analysis.has_units:
        over.by_purpose = _by_purpose(analysis.purposes, overlap, comm_clock_scale(bound))
    elif framework in vocabulary.FRAMEWORKS_WITH_UNITS or framework == vocabulary.UNKNOWN:
        notes.append(Note(BY_PURPOSE_UNKNOWN, "overlap.by_purpose is null: without FSDP unit labels the traces do "
                          "not say which collectives are FSDP's"))
    size_sources = sorted({u.size_source for u in units if u.size_source})
    return Summary(
        framework=framework, world_size=traces.world_size, ranks=traces.rank_ids, steps=selection.steps,
        step_time_ms=cost.unprofiled_step_ms if lead and cost is not None else traced_ms,
        step_time_source=STEP_TIME_TIMERS if lead else STEP_TIME_TRACE, traced_step_time_ms=traced_ms,
        profiler=cost, overlap=over, parallelism=parallel.parallelism,
        memory=memory, units=units,
        units_source="+".join(size_sources) if size_sources else None, device=_device(overlap),
        sources=list(traces.sources), run_dir=traces.run_dir, notes=notes, missing_ranks=traces.missing_ranks,
        skipped_events=sum(traces.skipped_events.values()), findings=findings,
        bound=bound, actions=actions_of(findings, bound, units, traces, overlap, framework),
    )


def actions_of(findings: Sequence[Finding], bound: BoundSummary | None, units: Sequence[UnitSummary],
               traces: TraceSet, overlap: pd.DataFrame, framework: str = "") -> list[Action]:
    """What to try, from ``findings`` and the bound (:func:`fsdpviz.analysis.actions.build_actions`):
    the summary's actions, and the page's of a run without units, whose summary lists no findings
    but whose per-unit analysis still finds stragglers and the profiler's cost."""
    return build_actions(findings, bound, host_backend_on_gpu=host_backend_on_gpu(traces, overlap), units=units,
                         framework=framework)


def finding_entries(findings: pd.DataFrame) -> list[Finding]:
    """The summary's ``findings`` (schema.FINDINGS rows), most time lost per step first.

    Per entry: ``rank`` (-1: medians over all ranks), ``unit``, ``phase``, ``kind``,
    ``lost_ms_per_step``, ``message``, ``evidence`` (the numbers behind it), ``knob`` (what to
    try; empty when the trace shows no clear cause), ``why_not`` where :func:`run_findings` gave one.
    """
    return [
        Finding(rank=int(row["rank"]), unit=str(row["unit"]), phase=str(row["phase"]), kind=str(row["kind"]),
                lost_ms_per_step=ms(float(row["lost_ns"])), message=str(row["message"]),
                evidence=str(row["evidence"]), knob=str(row["knob"]), cause=str(row["cause"]),
                why_not=str(row.get("why_not", "")))
        for row in findings.to_dict(orient="records")
    ]


# A straggler on a host whose ranks outnumber or match its cores: the lateness may be a wait for a core.
STRAGGLER_CROWDED: Final = ("its host ran at least as many ranks as it has cores, so a rank that waited for a core "
                            "starts its collectives late: record again, or with fewer ranks per core, to see whether "
                            "the same rank straggles")


def run_findings(findings: pd.DataFrame, traces: TraceSet, overlap: pd.DataFrame, framework: str) -> pd.DataFrame:
    """The FINDINGS table (``RunAnalysis.findings``) as the summary lists it: a knob that cannot help on the
    run (:func:`fsdpviz.analysis.actions.knob_blocked`) taken out, and its ``why_not`` saying why (else the
    finding's own: why its cause leaves nothing to try; "" elsewhere); the summary's findings, the
    notebook's ``Run.findings`` and ``fsdpviz export`` read it."""
    backend, waits = host_backend_on_gpu(traces, overlap), waits_out_collectives(_device(overlap), framework)
    why = [knob_blocked(str(k), backend, waits) if k else str(w)
           for k, w in zip(findings["knob"], findings["why_not"], strict=True)]
    full = full_bucket(traces.run)  # a larger ZeRO-3 bucket: nothing to fetch earlier
    if full:
        why = [full if "stage3_prefetch_bucket_size" in str(k) and not w else w
               for k, w in zip(findings["knob"], why, strict=True)]
    run = traces.run
    crowded = crowded_host_names(run)[0] if run is not None else set()
    if run is not None and crowded:  # a straggler whose own host had no core to spare
        hosts = {r.rank: r.host for r in run.ranks}
        why = [STRAGGLER_CROWDED if c == CAUSE_STRAGGLER and not w and hosts.get(int(r)) in crowded else w
               for c, r, w in zip(findings["cause"], findings["rank"], why, strict=True)]
    out = findings.assign(knob=[("" if w else str(k)) for k, w in zip(findings["knob"], why, strict=True)],
                          why_not=why)
    # what whatif's replay does with communication no unit issued: a CPU replay keeps the collectives the
    # thread waited for outside every unit, a GPU one replays FSDP's collectives alone (replay/recording.py)
    outside = (out["cause"] == CAUSE_OUTSIDE_UNITS).to_numpy()
    replayed = {OVERLAP_CPU: OUTSIDE_UNITS_CPU_REPLAY, OVERLAP_GPU: OUTSIDE_UNITS_GPU_REPLAY}.get(_device(overlap))
    if outside.any() and replayed:
        out.loc[outside, "why_not"] = [f"{w}; {replayed}" for w in out.loc[outside, "why_not"]]
    if waits:  # no compute runs beside a reduction the thread waits out: it outlasts nothing, it is waited
        after = (out["cause"] == CAUSE_OUTLASTS_AFTER).to_numpy()
        out.loc[after, "cause"] = CAUSE_WAITED_OUT
        out.loc[after, "message"] = [str(m).replace(OUTLASTS_AFTER_WORDS, WAITED_OUT_WORDS)
                                     for m in out.loc[after, "message"]]
    return out


OUTSIDE_UNITS_CPU_REPLAY: Final = "fsdpviz whatif replays it as recorded"
OUTSIDE_UNITS_GPU_REPLAY: Final = ("fsdpviz whatif's replay of a GPU run leaves it out: the step it predicts holds "
                                   "FSDP's collectives alone")


def host_backend_on_gpu(traces: TraceSet, overlap: pd.DataFrame) -> bool:
    """Whether a GPU run communicates through a host backend (gloo): its collectives then run
    synchronously through host memory, and prefetch cannot hide them."""
    backends = {str(b) for b in traces.ranks["backend"]}
    return _device(overlap) == "gpu" and "gloo" in backends


def _unit_timed_clean_steps_words(device: str) -> str:
    """The note of a recording whose clean steps timed every unit (``CLEAN_STEPS_UNIT_TIMED``)."""
    cost = ("on a launch-bound GPU step 25-50 % above a bare run" if device == OVERLAP_GPU else
            "small on a CPU step, where each unit costs microseconds against milliseconds of work")
    return ("the clean steps of this recording timed every unit too (it was recorded before fsdpviz kept per-unit "
            f"timers to steps of their own), so its step time holds the timers' cost: {cost}; record it again "
            "for a bare clock")


def _device(overlap: pd.DataFrame) -> str:
    devices = sorted(set(overlap["device"].astype(str)))
    return devices[0] if len(devices) == 1 else "mixed"


def _pct(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(float(value), 2)


def _step_time_ms(traces: TraceSet, analysed: dict[int, AnalysedSteps | None]) -> float | None:
    """The analysed steps as traced where no overlap row has them: each rank's mean, the median over
    ranks (as :func:`fsdpviz.analysis.bound.traced_step_ms` takes it)."""
    means: list[float] = []
    for rank, steps_of_rank in analysed.items():
        if steps_of_rank is None or not steps_of_rank.steps:
            continue
        rs = traces.steps[(traces.steps["rank"] == rank) & traces.steps["step"].isin(list(steps_of_rank.steps))]
        if len(rs):
            means.append(float(np.mean((rs["end_ns"] - rs["start_ns"]).to_numpy())))
    return ms(float(np.median(means))) if means else None


def _traced_overlap(overlap: pd.DataFrame) -> TracedOverlap:
    per_step = overlap["n_steps"].clip(lower=1).to_numpy(dtype=float)  # whole trace = one "step"
    comm_ns, both_ns = overlap["comm_ns"].sum(), overlap["overlap_ns"].sum()
    per_rank = {
        str(int(r["rank"])): RankOverlap(
            overlap_pct=_pct(r["overlap_pct"]),
            comm_ms=ms(r["comm_ns"] / max(r["n_steps"], 1)),
            compute_ms=ms(r["compute_ns"] / max(r["n_steps"], 1)),
            exposed_comm_ms=ms(r["exposed_comm_ns"] / max(r["n_steps"], 1)),
            idle_ms=ms(r["idle_ns"] / max(r["n_steps"], 1)),
            device=str(r["device"]),
        )
        for r in overlap.to_dict(orient="records")
    }
    # per step, the median over ranks, as every run-level figure beside them (the bound's parts): a
    # view that shows both shows the profiler's share between them, not a mean beside a median
    return TracedOverlap(
        comm_ms=ms(float(np.median(overlap["comm_ns"] / per_step))),
        compute_ms=ms(float(np.median(overlap["compute_ns"] / per_step))),
        exposed_comm_ms=ms(float(np.median(overlap["exposed_comm_ns"] / per_step))),
        overlap_pct=_pct(100.0 * both_ns / comm_ns) if comm_ns else None,
        idle_ms=ms(float(np.median(overlap["idle_ns"] / per_step))),
        per_rank=per_rank,
    )


def _idle(bound: BoundSummary | RankBound) -> float:
    return round((bound.host_wait_ms or 0.0) + bound.other_idle_ms, 3)


def _overlap_summary(overlap: pd.DataFrame, bound: BoundSummary | None) -> OverlapSummary:
    """The overlap on the run's clock (:class:`OverlapSummary`): the bound's parts, per rank and run;
    ranks without a bound (no step span) and runs without one keep the traced figures."""
    traced = _traced_overlap(overlap)
    if bound is None:
        return OverlapSummary(comm_ms=traced.comm_ms, compute_ms=traced.compute_ms,
                              exposed_comm_ms=traced.exposed_comm_ms,
                              overlap_pct=_hidden_pct(traced.comm_ms, traced.exposed_comm_ms),
                              idle_ms=traced.idle_ms, per_rank=dict(traced.per_rank), as_traced=traced)
    per_rank: dict[str, RankOverlap] = {}
    for rank, row in traced.per_rank.items():
        b = bound.per_rank.get(rank)
        if b is None:
            per_rank[rank] = row
            continue
        rank_comm = b.comm_ms if b.comm_ms is not None else row.comm_ms
        per_rank[rank] = RankOverlap(
            overlap_pct=_hidden_pct(rank_comm, b.exposed_comm_ms), comm_ms=rank_comm,
            compute_ms=b.compute_ms, exposed_comm_ms=b.exposed_comm_ms, idle_ms=_idle(b), device=row.device,
            fsdp_overhead_ms=b.fsdp_overhead_ms)
    comm = bound.comm_ms if bound.comm_ms is not None else traced.comm_ms
    return OverlapSummary(comm_ms=comm, compute_ms=bound.compute_ms, exposed_comm_ms=bound.exposed_comm_ms,
                          overlap_pct=_hidden_pct(comm, bound.exposed_comm_ms), idle_ms=_idle(bound),
                          per_rank=per_rank, fsdp_overhead_ms=bound.fsdp_overhead_ms, as_traced=traced)


def _hidden_pct(comm_ms: float | None, exposed_ms: float | None) -> float | None:
    """The share of ``comm_ms`` that compute hid, of the figures shown beside it (one figure: the run's
    is of its medians, not HTA's pooled share, which ``as_traced`` keeps); None without communication."""
    if comm_ms is None or comm_ms <= 0 or exposed_ms is None:
        return None
    return _pct(100.0 * max(comm_ms - exposed_ms, 0.0) / comm_ms)


def _by_purpose(purposes: pd.DataFrame, overlap: pd.DataFrame, scale: float) -> dict[str, PurposeOverlap]:
    """Each purpose's comm and exposed time per step, the median over the ranks analysed (as the run's
    own communication and exposed communication, so that no purpose's figure exceeds the run's), moved
    to the run's clock by ``scale`` (the bound's ``comm_scale``)."""
    n_steps = dict(zip(overlap["rank"].astype(int), overlap["n_steps"].clip(lower=1).astype(int)))
    out = {}
    for purpose in vocabulary.PURPOSES:
        comm = per_step_ns(purposes, purpose, "comm_ns", n_steps)
        exposed = per_step_ns(purposes, purpose, "exposed_ns", n_steps)
        out[purpose] = PurposeOverlap(comm_ms=None if comm is None else ms(scale * comm),
                                      exposed_ms=None if exposed is None else ms(scale * exposed))
    return out


def _with_scope(units: list[UnitSummary], traces: TraceSet, parallelism: Parallelism) -> list[UnitSummary]:
    """Each unit's ``param_scope``: run.json's (the recorder saw DTensor parameters or none), else
    from the TP degree: sizes read from the all-gathers are what FSDP gathers, TP's part of them."""
    recorded = {u.unit: u.param_scope for u in traces.run.units} if traces.run is not None else {}
    fallback = None if parallelism.tp is None else (
        vocabulary.PARAM_SCOPE_LOCAL if parallelism.tp > 1 else vocabulary.PARAM_SCOPE_GLOBAL)
    return [msgspec.structs.replace(u, param_scope=recorded.get(u.name) or (fallback if u.param_numel is not None
                                                                              else None)) for u in units]


def no_memory_cause(run: RunInfo | None) -> str:
    """Why a run's analysed steps hold no memory sample: run.json's ``--no-memory``, else the traces'
    own lack of samples."""
    return ("it was recorded with --no-memory (run.json)" if run is not None and run.options.get("memory") is False
            else "the traces hold no memory samples there (torch.profiler's profile_memory off, or none recorded)")


def _no_memory_words(run: RunInfo | None, framework: str) -> str:
    """Why the peak memory is null (:func:`no_memory_cause`), and what that leaves whatif, for the
    frameworks it reads."""
    how = no_memory_cause(run)
    then = (", and whatif predicts no peak (--explore ranks by step time alone)"
            if framework in vocabulary.FRAMEWORKS_WITH_UNITS else "")
    return f"no memory in the analysed steps: {how}, so the peak memory is null{then}"


def _memory_summary(traces: TraceSet, analysed: dict[int, AnalysedSteps | None]) -> MemorySummary:
    mem = traces.memory
    parts = []
    for rank, steps_of_rank in analysed.items():
        rows = mem[mem["rank"] == rank]
        if steps_of_rank is not None and steps_of_rank.steps:
            rows = rows[(rows["t_ns"] >= steps_of_rank.start_ns) & (rows["t_ns"] < steps_of_rank.end_ns)]
        parts.append(rows)
    mem = pd.concat(parts) if parts else mem
    on_gpu = mem["device"].astype(str) != "cpu"
    if on_gpu.any():
        mem = mem[on_gpu]
    if mem.empty:
        return MemorySummary(peak_allocated_bytes=None, peak_reserved_bytes=None, device=None, per_rank={})
    reserved = mem["reserved_bytes"][mem["reserved_bytes"] >= 0]
    peaks = mem.groupby("rank")["allocated_bytes"].max()
    per_rank = {str(int(rank)): RankMemory(peak_allocated_bytes=int(peak))
                for rank, peak in zip(peaks.index.to_numpy(), peaks.to_numpy())}
    # The CPU allocator caches nothing: its events carry reserved = 0, which means "not tracked".
    tracked = len(reserved) and (on_gpu.any() or reserved.max() > 0)
    return MemorySummary(peak_allocated_bytes=int(mem["allocated_bytes"].max()),
                         peak_reserved_bytes=int(reserved.max()) if tracked else None,
                         device="gpu" if on_gpu.any() else "cpu", per_rank=per_rank)


def _with_categories(mem: MemorySummary, analysis: RunAnalysis | None, traces: TraceSet) -> MemorySummary:
    """``mem`` with the categories at the run's highest step peak, what the level counts and the
    memory model, where the per-unit analysis has them."""
    if analysis is None:
        return mem
    levels = set(analysis.memory_level.values())
    # one word for the run: the least the ranks' levels count
    level = next((lv for lv in (LEVEL_SINCE_TRACE_START, LEVEL_MEASURED_BASELINE, LEVEL_ALLOCATOR) if lv in levels),
                 None)
    baselines = measured_baseline(traces.run)
    mem = msgspec.structs.replace(mem, level=level, baseline_bytes=max(baselines.values()) if baselines else None,
                                  not_seen_freed=not_seen_freed(analysis.unseen_frees))
    model = analysis.memory_model.to_json() if analysis.memory_model is not None else None
    steps = analysis.category_peaks[(analysis.category_peaks["unit"].astype(str) == "").to_numpy()]
    if steps.empty:
        return msgspec.structs.replace(mem, model=model)
    row = steps.sort_values("allocated_bytes", ascending=False, kind="stable").iloc[0].to_dict()
    top = peak_categories(row, analysis.memory_unknown.get(int(row["rank"])))
    # the unit pass whose window holds that instant, as the step's peak names it
    peaks = analysis.memory_peaks
    at = peaks[((peaks["rank"] == top.rank) & (peaks["step"] == top.step)).to_numpy()]
    if len(at):
        top = msgspec.structs.replace(top, unit=str(at["unit"].iat[0]), phase=str(at["phase"].iat[0]))
    return msgspec.structs.replace(mem, categories=dict(top.categories), categories_at=top, model=model)


def not_seen_freed(frees: pd.DataFrame) -> NotSeenFreed | None:
    """:class:`NotSeenFreed` of a run's unseen_frees.UNSEEN_FREES (None when there is none)."""
    if frees.empty:
        return None
    basis = frees["basis"].astype(str)
    return NotSeenFreed(blocks=len(frees), bytes=int(frees["bytes"].sum()),
                        at_collective_end=int((basis == COLLECTIVE_END).sum()),
                        at_address_reuse=int((basis == ADDRESS_REUSE).sum()))


def _units_without_work(table: pd.DataFrame | None, listed: set[str]) -> str | None:
    """Words for the units the run has (the analysis' unit table) that ``units`` leaves out: the analysed
    steps hold nothing of theirs (ZeRO-3's root around its submodules: no parameters of its own, no work
    outside them). None when every unit has its entry."""
    if table is None or table.empty:
        return None
    left = table[~table["unit"].astype(str).isin(listed).to_numpy()]
    if left.empty:
        return None
    size = left["param_bytes"].astype("float64").fillna(-1).to_numpy()  # NaN: unknown, as -1
    names = left["unit"].astype(str).to_numpy()
    why = {"none": "no parameters of {own} own to gather, no work outside the units inside",
           "some": "although {holds} parameters", "unknown": "{own} size is not known"}
    said = []
    for kind, rows in (("none", size == 0), ("some", size > 0), ("unknown", size < 0)):
        if rows.any():
            one = int(rows.sum()) == 1
            own, holds = ("its", "it holds") if one else ("their", "they hold")
            said.append(f"{', '.join(names[rows])} ran nothing of {own} own in the analysed steps ("
                        + why[kind].format(own=own, holds=holds) + ")")
    return "; ".join(said) + ": no entry in units"


def _notes(traces: TraceSet, overlap: pd.DataFrame, selection: StepSelection, framework: str) -> list[Note]:
    notes: list[Note] = list(selection.notes)
    if traces.skipped:
        notes.append(Note(SKIPPED_FILES, f"skipped {len(traces.skipped)} JSON file(s) that are not Kineto traces: "
                          + ", ".join(traces.skipped[:5])))
    notes.extend(gap_notes(traces))  # ranks without a trace, events the loader skipped
    notes.extend(framework_notes(framework))
    if framework == "unknown":
        notes.append(Note(NO_FSDP_LABELS, "no FSDP labels (FSDP::, FullyShardedDataParallel., fsdpviz::) in the "
                          "traces, so units is empty; whole-step numbers are still valid"))
    if (overlap["comm_ns"] == 0).all():
        notes.append(Note(NO_COMMUNICATION, "no communication found in the analysed steps, so overlap_pct is null"))
    return notes
