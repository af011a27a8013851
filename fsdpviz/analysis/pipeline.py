"""The one pipeline every command runs: load -> choose steps -> whole-step overlap -> per-unit analysis
-> summary.

``fsdpviz summary``, ``report``, ``export``, ``compare`` and ``record`` (its summary and report after a
run) all go through :func:`analyse`, so they agree on the analysed steps, the framework and every
number, and a command that needs both a summary and a page (``record``) loads and analyses once.

A :class:`RunResult` computes what is asked of it, once: the whole-step overlap when it is built (it
is cheap and names an empty analysis window as an error), the per-unit analysis and the summary on
first use. A summary of a run without FSDP units (DDP, or traces without labels) never needs the
per-unit analysis; a report always does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpviz.trace.schema import OVERLAP_CPU
from fsdpviz.trace.tables import TraceSet
from fsdpviz.vocabulary import FRAMEWORKS_WITH_UNITS

if TYPE_CHECKING:
    import pandas as pd

    from fsdpviz.analysis.bound import BoundSummary
    from fsdpviz.analysis.rankmap import RankDigest
    from fsdpviz.analysis.run import RankPart, RunAnalysis
    from fsdpviz.analysis.summary import Summary
    from fsdpviz.runfolder import RunInfo
    from fsdpviz.structure.parallelism import RunParallelism
    from fsdpviz.structure.profiler_cost import ProfilerCost
    from fsdpviz.structure.steps import StepSelection
    from fsdpviz.trace.kineto import RankColumns



class RunResult:
    """A loaded run and everything the analysis says about it (see the module docstring).

    Attributes:
        traces: the loaded tables, each rank on its own clock (``aligned``: on the reference clock).
        selection: the analysed steps of every rank (:func:`fsdpviz.structure.steps.select_steps`).
        overlap: whole-step overlap per rank (schema.OVERLAP).
        framework: ``fsdp2`` / ``fsdp1`` / ``zero3`` / ``ddp`` / ``unknown``, decided once.
    """

    def __init__(self, traces: TraceSet, selection: StepSelection, overlap: pd.DataFrame, framework: str,
                 analysis: RunAnalysis | None = None, parts: list[RankPart] | None = None,
                 cache: bool = True) -> None:
        self.traces = traces
        self.selection = selection
        self.overlap = overlap
        self.framework = framework
        self._parts = parts
        self._cache = cache
        # What the layers above compute once from this result, so that every view of it reads the
        # same (whatif.gains keeps the summary's model read and the completed summary here).
        self.memo: dict[str, object] = {}
        if analysis is not None:
            self.__dict__["analysis"] = analysis

    @property
    def events_kept(self) -> bool:
        """Whether ``traces`` holds every rank's events (a run loaded whole), or none (a run reduced
        rank by rank where each was parsed: ``detail`` reads ranks again)."""
        return self._parts is None

    def detail(self, ranks: Sequence[int] | None = None) -> TraceSet:
        """Every table, events included, of ``ranks`` (all when None): ``traces`` itself when the
        events were kept, else those ranks read again from their traces or the cache beside them
        (what a page draws of a run too large to hold whole)."""
        if self.events_kept:
            return self.traces
        from fsdpviz.trace.loader import load_ranks

        again = load_ranks(self.traces, self.traces.rank_ids if ranks is None else ranks, cache=self._cache)
        again.memory = _settled(again, self.analysis)
        return again

    @property
    def clock_offsets(self) -> dict[int, int]:
        """rank -> ns its times were moved by to put them on the reference rank's clock (0: kept),
        as the per-unit analysis decided (``RunAnalysis.clock``)."""
        from fsdpviz.structure.crossrank import applied_offsets

        return applied_offsets(self.analysis.clock)

    @cached_property
    def aligned(self) -> TraceSet:
        """``traces`` on the reference clock: every rank's events, steps and memory samples moved as
        the analysis' tables are, so that anything drawn or simulated from them lines up with the
        analysis (events only where ``events_kept``; see :meth:`aligned_detail`)."""
        from fsdpviz.structure.crossrank import aligned_traces

        return aligned_traces(self.traces, self.clock_offsets)

    def aligned_detail(self, ranks: Sequence[int] | None = None) -> TraceSet:
        """:meth:`detail` on the reference clock: every table of ``ranks``, events included."""
        if self.events_kept:
            return self.aligned
        from fsdpviz.structure.crossrank import aligned_traces

        return aligned_traces(self.detail(ranks), self.clock_offsets)

    @property
    def analysed(self) -> bool:
        """Whether the per-unit analysis has been computed (``analysis`` then costs nothing)."""
        return "analysis" in self.__dict__  # where cached_property keeps it

    @property
    def has_units(self) -> bool:
        """Whether the framework has FSDP units worth a per-unit analysis."""
        return self.framework in FRAMEWORKS_WITH_UNITS

    @cached_property
    def analysis(self) -> RunAnalysis:
        """The per-unit analysis (:func:`fsdpviz.analysis.run.analyse_run`), computed on first use."""
        from fsdpviz.analysis.run import analyse_run, combine_parts

        idle_ns, scale, step_ns, gaps, comm = self._clock_args()
        if self._parts is not None:
            analysis = combine_parts(self._parts, self.traces, self.selection, self.framework,
                                     profiler=self.profiler, idle_ns=idle_ns, scale=scale, step_ns=step_ns,
                                     gap_scales=gaps, comm_scale=comm)
        else:
            analysis = analyse_run(self.traces, selection=self.selection, framework=self.framework,
                                   profiler=self.profiler, idle_ns=idle_ns, scale=scale, step_ns=step_ns,
                                   gap_scales=gaps, comm_scale=comm)
        # the loaded samples get the frees the analysis found, so that whatever reads them after it
        # (compare's step levels, whatif's recording, the notebook) reads the same levels
        self.traces.memory = _settled(self.traces, analysis)
        return analysis

    def _clock_args(self) -> tuple[float | None, float, float | None, tuple[float, float], float]:
        """What the per-unit analysis moves to the run's clock by, from the bound: the GPU's idle time for
        the profiler's finding, the device's scale, the run's step (ns), the scales of a GPU pass's idle and
        the communication's scale."""
        from fsdpviz.analysis.bound import BASIS_UNPROFILED, comm_clock_scale

        # for the profiler's finding: on a GPU the profiler's share comes out of the time the GPU waited
        # (the bound's split): for the host, FSDP's hooks' share included, then other idle. As traced that
        # is what the bound kept of them plus the share it took (where it took the whole share from them:
        # device_scale 1, its communication unmoved), so the finding and the bound are one set of figures. On
        # a CPU rank the profiler slows every part of the step: the finding puts it in no one part.
        b = self._bound
        idle_ns = None
        if b is not None and b.device != OVERLAP_CPU and b.device_scale == 1.0 and comm_clock_scale(b) == 1.0:
            kept = (b.host_wait_ms or 0.0) + b.other_idle_ms + b.fsdp_overhead_ms - (b.fsdp_kernels_ms or 0.0)
            took = b.profiler_share_ms if b.basis == BASIS_UNPROFILED and b.profiler_share_ms else 0.0
            idle_ns = (kept + took) * 1e6
        return idle_ns, self.device_scale, self._run_step_ns, self.gap_scales, comm_clock_scale(b)

    def adopt_bound(self, bound: BoundSummary) -> None:
        """Make ``bound`` the run's split (the replay's, :mod:`fsdpviz.replay.split`, which the layers above
        compute once they read the run's model): every figure read after this is on it. The per-unit
        analysis, if computed, is moved again (:func:`fsdpviz.analysis.run.rescaled`: the trace's tables are
        not read again); the summary is made again when next read."""
        args = self._clock_args()
        self.__dict__["_bound"] = bound
        if self.analysed and self._clock_args() != args:
            from fsdpviz.analysis.run import rescaled

            idle_ns, scale, step_ns, gaps, comm = self._clock_args()
            self.__dict__["analysis"] = rescaled(self.analysis, profiler=self.profiler, idle_ns=idle_ns, scale=scale,
                                                 step_ns=step_ns, gap_scales=gaps, comm_scale=comm)
        self.__dict__.pop("summary", None)

    @cached_property
    def profiler(self) -> ProfilerCost | None:
        """What the profiler cost the run, from its timers (:mod:`fsdpviz.structure.profiler_cost`), its
        profiled step the traced one (the run's ``traced_step_time_ms``: one figure in every view)."""
        from fsdpviz.analysis.bound import traced_step_ms
        from fsdpviz.structure.profiler_cost import on_traced_step, profiler_cost

        traced = traced_step_ms(self.overlap) if not self.overlap.empty else None
        return on_traced_step(profiler_cost(self.traces.timers, self.traces.run, self.traces.rank_ids), traced)

    @cached_property
    def _bound(self) -> BoundSummary | None:
        """The run's bound (:func:`fsdpviz.analysis.bound.summarize_bound`; the summary adds its memory)."""
        from fsdpviz.analysis.bound import summarize_bound
        from fsdpviz.structure.profiler_cost import clean_step_ms

        return summarize_bound(self.overlap, self.profiler, clean_step_ms(self.traces.timers, self.traces.run))

    @property
    def bound_split(self) -> BoundSummary | None:
        """The run's bound as it stands (the rule's until the layers above adopt the replay's,
        :meth:`adopt_bound`), without the memory the summary adds to it."""
        return self._bound

    @property
    def device_scale(self) -> float:
        """What moves the trace's device durations (a pass's kernels, the findings' compute and lateness) to
        the run's clock: the bound's ``device_scale`` (:mod:`fsdpviz.structure.deprofile`), 1.0 without a
        bound; the collectives' move by :attr:`comm_scale`."""
        from fsdpviz.analysis.bound import clock_scale

        return clock_scale(self._bound)

    @property
    def comm_scale(self) -> float:
        """What moves the trace's communication times (a unit's collectives, the findings') to the run's
        clock: the bound's ``comm_scale``, 1.0 without a bound."""
        from fsdpviz.analysis.bound import comm_clock_scale

        return comm_clock_scale(self._bound)

    @property
    def gap_scales(self) -> tuple[float, float]:
        """What moves the idle inside a GPU unit's pass to the run's clock: the bound's ``host_scale`` and
        ``idle_scale`` (:mod:`fsdpviz.structure.deprofile`), (1, 1) without a bound."""
        b = self._bound
        return (b.host_scale, b.idle_scale) if b is not None else (1.0, 1.0)

    @property
    def _run_step_ns(self) -> float | None:
        """The run's step (the bound's, on the headline's clock) in ns; None without a bound."""
        return self._bound.step_ms * 1e6 if self._bound is not None and self._bound.step_ms > 0 else None

    @cached_property
    def parallelism(self) -> RunParallelism:
        """The run's mesh (:func:`fsdpviz.structure.parallelism.run_parallelism`), read once for the
        summary and for whatif's world-size settings."""
        from fsdpviz.structure.parallelism import run_parallelism

        return run_parallelism(self.traces, self.framework)

    @cached_property
    def summary(self) -> Summary:
        """The run's summary (:func:`fsdpviz.analysis.summary.summary_of`); ``.to_json()`` is
        ``fsdpviz summary --json``."""
        from fsdpviz.analysis.summary import summary_of

        return summary_of(self.traces, self.selection, self.overlap, self.framework, profiler=self.profiler,
                          analysis=self.analysis if self.has_units else None, parallel=self.parallelism,
                          bound=self._bound)


def _settled(traces: TraceSet, analysis: RunAnalysis) -> pd.DataFrame:
    """``traces.memory`` (each rank on its own clock) with the frees the analysis found that the
    profiler did not see (:mod:`fsdpviz.analysis.unseen_frees`)."""
    if analysis.unseen_frees.empty:
        return traces.memory
    from fsdpviz.analysis.unseen_frees import settle_run
    from fsdpviz.structure.crossrank import applied_offsets, shift_times

    back = {r: -o for r, o in applied_offsets(analysis.clock).items()}
    own = shift_times(analysis.unseen_frees, back, ("alloc_ns", "free_ns"))
    return settle_run(traces.memory, own[own["rank"].isin(traces.rank_ids).to_numpy()], traces.memory_devices)


@dataclass(kw_only=True, slots=True)
class LabelledRun:
    """A run as the user names it: its label, the path it was given as, and the pipeline's result.

    What ``fsdpviz compare`` compares and what the notebook API's ``fsdpviz.Run`` is (it adds its
    tables and plots to this)."""

    label: str
    source: str  # the path the user gave
    result: RunResult

    @property
    def summary(self) -> Summary:
        """The run's summary (``RunResult.summary``)."""
        return self.result.summary

    @property
    def analysis(self) -> RunAnalysis:
        """The per-unit analysis (``RunResult.analysis``)."""
        return self.result.analysis

    @property
    def run(self) -> RunInfo | None:
        """run.json, when the run was recorded by fsdpviz."""
        return self.result.traces.run

    @property
    def traces(self) -> TraceSet:
        """The loaded tables (``RunResult.traces``)."""
        return self.result.traces


def analyse_traces(traces: TraceSet, *, steps: Sequence[int] | None = None,
                   include_last_step: bool = False) -> RunResult:
    """The pipeline on already loaded traces. Raises NoDataError when a rank has nothing to analyse."""
    from fsdpviz.analysis.overlap import compute_overlap
    from fsdpviz.structure.framework import decide_framework
    from fsdpviz.structure.steps import select_steps

    selection = select_steps(traces, steps=steps, include_last_step=include_last_step)
    overlap = compute_overlap(traces, selection=selection)
    return RunResult(traces, selection, overlap, decide_framework(traces))


def analyse(paths: Sequence[str | Path], *, steps: Sequence[int] | None = None, include_last_step: bool = False,
            cache: bool = True, progress: bool | None = None,
            say: Callable[[str], None] | None = None, scheduler: str | None = None,
            meanwhile: Callable[[], None] | None = None) -> RunResult:
    """Load ``paths`` (a run folder, a folder of traces, trace files) and analyse them.

    A run small enough to hold whole is loaded whole and analysed here; a larger one is analysed
    rank by rank where each rank is parsed (:mod:`fsdpviz.analysis.rankmap`), and only the ranks'
    digests come back (``trace.loader.keeps_events`` decides).
    ``progress``: the loader's progress display (None: only on a terminal, for slow loads);
    ``say``: called with one short line when loading is done (the commands' ``fsdpviz: ...`` lines);
    ``scheduler``: parse on a Dask cluster (:func:`fsdpviz.trace.load_traces`);
    ``meanwhile``: the caller's own slow start-up (importing the report's plotting libraries), run
    while the traces are parsed, as pandas is imported then (the analysis is imported only after the
    parsing has started, for that reason).
    Raises the loader's and the analysis' :class:`fsdpviz.errors.FsdpvizError` subclasses.
    """
    import time
    from functools import partial

    from fsdpviz.trace.loader import load_run

    started = time.perf_counter()
    loaded = load_run(paths, cache=cache, progress=progress, scheduler=scheduler, meanwhile=meanwhile,
                      per_rank=partial(_rank_mapper, steps, include_last_step))
    traces = loaded.traces
    if say is not None:
        say(f"loaded {len(traces.rank_ids)} rank(s), {int(traces.ranks['n_events'].sum()):,} events "
            f"in {time.perf_counter() - started:.1f} s")
    if loaded.mapped is None:
        return analyse_traces(traces, steps=steps, include_last_step=include_last_step)
    return _from_digests(traces, loaded.mapped, steps=steps, cache=cache)


def _rank_mapper(steps: Sequence[int] | None, include_last_step: bool,
                 run: RunInfo | None) -> Callable[[RankColumns], RankDigest]:
    """``load_run``'s ``per_rank``, importing the analysis only for a run reduced rank by rank."""
    from fsdpviz.analysis.rankmap import rank_mapper

    return rank_mapper(steps, include_last_step, run)


def _from_digests(traces: TraceSet, digests: list[RankDigest], *, steps: Sequence[int] | None,
                  cache: bool) -> RunResult:
    """The pipeline's reduce: the run's selection, overlap and framework from its ranks' digests."""
    from fsdpviz.analysis.overlap import overlap_frame
    from fsdpviz.errors import NoDataError
    from fsdpviz.structure.framework import decide_from_names
    from fsdpviz.structure.steps import combine_choices

    selection = combine_choices([d.choice for d in digests], steps)
    failed = [d for d in digests if d.overlap is None]
    if failed:
        raise NoDataError(failed[0].error)
    overlap = overlap_frame([d.overlap for d in digests if d.overlap is not None])
    names = sorted({n for d in digests for n in d.evidence})
    framework = decide_from_names(names, traces.run.framework if traces.run is not None else None)
    parts = [d.part for d in digests if d.part is not None]
    return RunResult(traces, selection, overlap, framework, parts=parts, cache=cache)
