"""Everything the page shows, as tables and numbers: built first, rendered second.

:func:`prepare_report` turns one pipeline result (:class:`fsdpviz.analysis.pipeline.RunResult`:
the loaded traces and the analysis) into a :class:`ReportData`; :mod:`fsdpviz.report.page` only formats and plots it. Tests
assert on this data (rows per lane, colours per unit, exposed pieces, memory peaks), not on HTML.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import pandas as pd

from fsdpviz.analysis import memory as analysis_memory
from fsdpviz.analysis.actions import Action, action_texts
from fsdpviz.analysis.bound import clock_scale, comm_clock_scale
from fsdpviz.analysis.memory import MemoryModel
from fsdpviz.analysis.memory_categories import TITLES
from fsdpviz.analysis.summary import actions_of, finding_entries, run_findings
from fsdpviz.errors import UsageError
from fsdpviz.report.steps import data as steps_data
from fsdpviz.report.style import OTHER_COLOR, sentence, unit_colors
from fsdpviz.report.timeline import memory
from fsdpviz.report.timeline.steps import MAX_PAGE_SEGMENTS, choose_steps, whole_trace_choice
from fsdpviz.report.timeline.units import NO_UNIT, place_unit_peaks, unit_order, units_view
from fsdpviz.report.timeline.view import StepView, events_view, exposed_intervals, unit_peak_markers
from fsdpviz.report.units.table import UnitTables, unit_tables
from fsdpviz.structure.profiler_cost import unit_pass_steps
from fsdpviz.structure.records import NO_UNIT_LABELS
from fsdpviz.trace.tables import TraceSet
from fsdpviz.whatif.gains import completed_summary
from fsdpviz.whatif.saved import SavedPrediction, load_predictions

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult
    from fsdpviz.analysis.summary import Summary

MAX_GANTT_RANKS = 16  # more rows than this make a Gantt unreadable (and the page heavy)
# Time-line tabs: the median and the slowest step, and the all-events tab of the first one
# when the run has units (without units every step tab is an all-events tab).
VIEW_MEDIAN, VIEW_SLOWEST, VIEW_EVENTS = "median", "slowest", "events"
ALL_VIEWS = (VIEW_MEDIAN, VIEW_SLOWEST, VIEW_EVENTS)


@dataclass(kw_only=True, slots=True)
class ReportData:
    """The content of one report page."""

    title: str
    subtitle: str
    meta: list[tuple[str, str]]  # (label, value) shown under the title
    summary: Summary  # the run's summary (the pipeline's)
    overlap: pd.DataFrame  # schema.OVERLAP
    views: list[StepView]  # time-line tabs
    step_times: pd.DataFrame  # steps_data.step_times()
    step_spread: pd.DataFrame  # steps_data.per_step_spread()
    rank_steps: pd.DataFrame  # steps_data.per_rank_summary()
    has_units: bool = False
    unit_colors: dict[str, str] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    action_code: list[tuple[str, str]] = field(default_factory=list)  # (what it gains, the advised setting as code)
    notes: list[str] = field(default_factory=list)
    unit_tables: UnitTables | None = None  # per-unit section (unittable.unit_tables)
    memory_model: MemoryModel | None = None  # RunAnalysis.memory_model
    skew: pd.DataFrame | None = None  # schema.SKEW
    rank_step_times: pd.DataFrame | None = None  # schema.STEP_TIMES (where each rank's step went)
    timers: pd.DataFrame = field(default_factory=pd.DataFrame)  # schema.TIMERS (every step)
    unit_passes: pd.DataFrame = field(default_factory=pd.DataFrame)  # profiler_cost.unit_pass_steps
    segment_count: int = 0  # Gantt rectangles on the page, all tabs
    predictions: list[SavedPrediction] = field(default_factory=list)  # `fsdpviz whatif --save`


def describe_inputs(traces: TraceSet) -> tuple[str, str, list[tuple[str, str]]]:
    """Title, subtitle and meta lines from run.json (when recorded by fsdpviz) or the trace files."""
    run = traces.run
    meta: list[tuple[str, str]] = []
    if run is not None:
        title = f"fsdpviz report: {run.label}" if run.label else "fsdpviz report"
        subtitle = " ".join(run.command)
        for value, name in ((run.status, "status"), (run.start_time, "started"), (run.end_time, "ended")):
            if value:
                meta.append((name, value))
        if run.hosts:
            meta.append(("hosts", ", ".join(run.hosts)))
        shown = [f"{k} {v}" for k, v in sorted(run.versions.items()) if v not in (None, "", "None")]
        if shown:
            meta.append(("versions", ", ".join(shown)))
    else:
        title = "fsdpviz report"
        subtitle = ""
    sources = [str(p) for p in traces.ranks.sort_values("rank")["path"]]
    if not subtitle:
        subtitle = sources[0] if len(sources) == 1 else f"{len(sources)} trace files"
    if traces.run_dir is not None:
        meta.insert(0, ("run folder", str(traces.run_dir)))
    devices = sorted({str(d) for d in traces.ranks["device_name"] if str(d)})
    if devices:
        meta.append(("device", ", ".join(devices)))
    backends = sorted({str(b) for b in traces.ranks["backend"] if str(b)})
    if backends:
        meta.append(("backend", ", ".join(backends)))
    return title, subtitle, meta


def actions_text(actions: Sequence[Action]) -> list[str]:
    """The headline's list: one sentence per action shown (the bound first), then one line naming the
    folded ones."""
    out = action_texts([a for a in actions if not a.folded])
    folded = [a for a in actions if a.folded]
    if folded:
        out.append(f"{len(folded)} more, each losing less: " + "; ".join(
            f"{a.message.rstrip('.')}" for a in folded) + ".")
    return out


def check_gantt_ranks(traces: TraceSet, ranks: Sequence[int]) -> list[int]:
    """``ranks`` (``--ranks``) sorted and without repeats; UsageError if one has no trace."""
    unknown = sorted(set(ranks) - set(traces.rank_ids))
    if unknown:
        raise UsageError(f"--ranks: no trace for rank(s) {', '.join(map(str, unknown))} "
                         f"(ranks loaded: {', '.join(map(str, traces.rank_ids))})")
    return sorted(set(ranks))


def prepare_report(run: RunResult, *, max_segments: int = MAX_PAGE_SEGMENTS,
                   gantt_ranks: Sequence[int] | None = None, max_gantt_ranks: int = MAX_GANTT_RANKS,
                   views: Sequence[str] = ALL_VIEWS) -> ReportData:
    """The page's data from one pipeline result (its traces, summary, overlap and per-unit analysis).

    Without unit spans the page has the whole-step views only. ``gantt_ranks`` picks the ranks the
    time-line draws (default: all up to ``max_gantt_ranks``, else a readable selection, see
    ``steps_data.choose_gantt_ranks``). ``views`` picks the time-line tabs to build (``ALL_VIEWS``):
    ``("median",)`` builds only the median step's tab, the per-unit one when the run has units (what
    ``fsdpviz compare`` draws).
    """
    completed = completed_summary(run)  # the one read of the run: the actions' gains, the clock, the bound's split
    traces, overlap, analysis = run.traces, run.overlap, run.analysis  # on that split (replay/split.py)
    # a run without units: its summary lists no findings, the page its analysis' (stragglers, the profiler)
    actions = completed.actions if run.has_units else actions_of(
        finding_entries(run_findings(analysis.findings, traces, overlap, run.summary.framework)), run.summary.bound,
        run.summary.units, traces, overlap, run.summary.framework)
    summary = msgspec.structs.replace(run.summary, clock=completed.clock)
    title, subtitle, meta = describe_inputs(traces)
    aligned = run.aligned  # the lanes and memory views line up with the analysis' spans
    unknown_views = sorted(set(views) - set(ALL_VIEWS))
    if unknown_views:
        raise ValueError(f"unknown report views {unknown_views}: choose from {ALL_VIEWS}")
    choices = choose_steps(aligned.steps, summary.steps or None)
    if not choices and aligned.steps.empty:
        aligned = run.aligned_detail()  # no ProfilerStep: the whole trace's span, from the events
        whole = whole_trace_choice(aligned.events)
        choices = [whole] if whole is not None else []
    # choose_steps gives the median step first, then the slowest (when it differs)
    choices = [c for c, kind in zip(choices, (VIEW_MEDIAN, VIEW_SLOWEST)) if kind in views]
    times = steps_data.step_times(traces)
    notes: list[str] = []
    if gantt_ranks is None:
        gantt_ranks, why = steps_data.choose_gantt_ranks(traces.rank_ids, times, max_gantt_ranks)
        if why:
            notes.append(why)
    else:
        gantt_ranks = check_gantt_ranks(traces, gantt_ranks)
    aligned = run.aligned_detail(gantt_ranks)  # held rank by rank: the drawn ranks' events read again
    curve = analysis.memory  # thinned, exact peaks, on the reference clock
    memory_ranks = memory.choose_memory_ranks(curve[curve["rank"].isin(gantt_ranks)])
    spans = analysis.spans
    has_units = analysis.has_units and not spans.empty
    order = [u for u in unit_order(analysis.units, spans if has_units else pd.DataFrame()) if u != NO_UNIT]
    colors = unit_colors(order, {u: i for i, u in enumerate(order)})
    if has_units and (spans["unit"] == NO_UNIT).any():
        colors[NO_UNIT] = OTHER_COLOR  # work outside every unit (the optimizer step)
    unit_steps = analysis.unit_steps
    # Tabs: per-unit Gantt of each chosen step + all events of the median step when the run has
    # units (the per-unit view is the one to read; one all-events tab shows what else ran), else all
    # events of each chosen step.
    with_events = has_units and VIEW_EVENTS in views
    per_view = max(1_000, max_segments // max(len(choices) + int(with_events), 1))
    tabs: list[StepView] = []
    peak_samples = _main_device_samples(aligned.memory) if has_units else aligned.memory
    category_rank = _category_rank(curve, memory_ranks)
    for i, choice in enumerate(choices):
        exposed = exposed_intervals(aligned, overlap, choice.step, gantt_ranks)
        if has_units:
            view = units_view(spans, traces.lanes, choice, colors=colors, exposed=exposed,
                              memory_curve=memory.memory_curves(curve, choice, memory_ranks),
                              unit_steps=unit_steps, max_segments=per_view, ranks=gantt_ranks,
                              events=aligned.events)
            peaks = place_unit_peaks(unit_steps, spans, peak_samples, choice, memory_ranks)
            view.peaks = unit_peak_markers(peaks[peaks["unit"] != NO_UNIT], choice, colors)
            tabs.append(view)
        if not has_units or (i == 0 and with_events):
            tabs.append(events_view(aligned, overlap, choice, max_segments=per_view, memory_ranks=memory_ranks,
                                   ranks=gantt_ranks, exposed=exposed, memory_curve=curve))
    if category_rank >= 0:
        for view in tabs:
            view.categories = memory.category_curve(analysis.memory_categories, view.choice, category_rank)
            view.category_rank = category_rank
            view.category_unknown = dict(analysis.memory_unknown.get(category_rank, {}))
        for category, why in analysis.memory_unknown.get(category_rank, {}).items():
            notes.append(f"Memory by category, rank {category_rank}: {TITLES[category]} unknown ({why}); "
                         "drawn flat, not as 0 bytes.")
    if len(memory_ranks) < curve["rank"].nunique():
        notes.append(f"Memory curves show {len(memory_ranks)} of {curve['rank'].nunique()} ranks: "
                     "rank 0 and the ranks with the highest peaks.")
    notes.extend(sentence(n.text) for n in analysis.notes if n.code != NO_UNIT_LABELS)  # said by the headline
    stats = analysis.unit_stats
    return ReportData(
        title=title, subtitle=subtitle, meta=meta, summary=summary, overlap=overlap, views=tabs,
        has_units=has_units, unit_colors=colors if has_units else {},
        step_times=times, step_spread=steps_data.per_step_spread(times),
        rank_steps=steps_data.per_rank_summary(times), notes=notes,
        findings=actions_text(actions),
        action_code=[(f"The change as code (fsdpviz whatif ... --code), {a.predicted_gain}", a.apply_code)
                     for a in actions if a.apply_code and not a.folded],
        unit_tables=unit_tables(stats, colors, {u.name: (u.forward_timer_ms, u.backward_timer_ms)
                                                for u in summary.units},
                                {u.name: u.param_scope for u in summary.units},
                                {u.name: u for u in summary.units},
                                clock_scale(summary.bound), comm_clock_scale(summary.bound))
        if has_units and not stats.empty else None,
        memory_model=analysis.memory_model,
        skew=analysis.skew, rank_step_times=analysis.step_times, timers=traces.timers,
        unit_passes=unit_pass_steps(traces.timers, traces.run),
        segment_count=sum(len(v.segments) + len(v.exposed) for v in tabs),
        predictions=load_predictions(traces.run_dir),
    )


def _main_device_samples(samples: pd.DataFrame) -> pd.DataFrame:
    """Allocator samples of each rank's drawn device only (``fsdpviz.analysis.memory.main_devices``)."""
    if samples.empty:
        return samples
    devices = analysis_memory.main_devices(samples)
    return samples[samples["device"].astype(str).to_numpy()
                   == samples["rank"].map(devices).astype(str).to_numpy()]


def _category_rank(curve: pd.DataFrame, memory_ranks: Sequence[int]) -> int:
    """Of the ranks whose memory is drawn, the one with the highest peak (-1: none)."""
    drawn = curve[curve["rank"].isin(list(memory_ranks)).to_numpy()]
    if drawn.empty:
        return -1
    return int(drawn["rank"].to_numpy()[int(drawn["allocated_bytes"].to_numpy().argmax())])
