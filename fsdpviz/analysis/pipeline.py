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
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpviz.analysis.framework import decide_framework
from fsdpviz.analysis.overlap import compute_overlap
from fsdpviz.analysis.steps import StepSelection, select_steps
from fsdpviz.trace.tables import TraceSet

if TYPE_CHECKING:
    import pandas as pd

    from fsdpviz.analysis.run import RunAnalysis
    from fsdpviz.analysis.summary import Summary

FRAMEWORKS_WITH_UNITS = ("fsdp2", "fsdp1", "zero3")


class RunResult:
    """A loaded run and everything the analysis says about it (see the module docstring).

    Attributes:
        traces: the loaded tables.
        selection: the analysed steps of every rank (:func:`fsdpviz.analysis.steps.select_steps`).
        overlap: whole-step overlap per rank (schema.OVERLAP).
        framework: ``fsdp2`` / ``fsdp1`` / ``zero3`` / ``ddp`` / ``unknown``, decided once.
    """

    def __init__(self, traces: TraceSet, selection: StepSelection, overlap: pd.DataFrame, framework: str,
                 analysis: RunAnalysis | None = None) -> None:
        self.traces = traces
        self.selection = selection
        self.overlap = overlap
        self.framework = framework
        if analysis is not None:
            self.__dict__["analysis"] = analysis

    @property
    def has_units(self) -> bool:
        """Whether the framework has FSDP units worth a per-unit analysis."""
        return self.framework in FRAMEWORKS_WITH_UNITS

    @cached_property
    def analysis(self) -> RunAnalysis:
        """The per-unit analysis (:func:`fsdpviz.analysis.run.analyze_run`), computed on first use."""
        from fsdpviz.analysis.run import analyze_run

        return analyze_run(self.traces, selection=self.selection, framework=self.framework)

    @cached_property
    def summary(self) -> Summary:
        """The run's summary (:func:`fsdpviz.analysis.summary.summary_of`); ``.to_json()`` is
        ``fsdpviz summary --json``."""
        from fsdpviz.analysis.summary import summary_of

        return summary_of(self)

    def analysed_if_done(self) -> RunAnalysis | None:
        """The per-unit analysis when it has been computed (or the run has units), else None."""
        if "analysis" in self.__dict__ or self.has_units:
            return self.analysis
        return None


def analyse_traces(traces: TraceSet, *, steps: Sequence[int] | None = None,
                   include_last_step: bool = False) -> RunResult:
    """The pipeline on already loaded traces. Raises NoDataError when a rank has nothing to analyse."""
    selection = select_steps(traces, steps=steps, include_last_step=include_last_step)
    overlap = compute_overlap(traces, selection=selection)
    return RunResult(traces, selection, overlap, decide_framework(traces))


def analyse(paths: Sequence[str | Path], *, steps: Sequence[int] | None = None, include_last_step: bool = False,
            cache: bool = True, progress: bool | None = None,
            say: Callable[[str], None] | None = None, scheduler: str | None = None) -> RunResult:
    """Load ``paths`` (a run folder, a folder of traces, trace files) and analyse them.

    ``progress``: the loader's progress display (None: only on a terminal, for slow loads);
    ``say``: called with one short line when loading is done (the commands' ``fsdpviz: ...`` lines);
    ``scheduler``: parse on a Dask cluster (:func:`fsdpviz.trace.load_traces`).
    Raises the loader's and the analysis' :class:`fsdpviz.errors.FsdpvizError` subclasses.
    """
    import time

    from fsdpviz.trace import load_traces

    started = time.perf_counter()
    traces = load_traces(paths, cache=cache, progress=progress, scheduler=scheduler)
    if say is not None:
        say(f"loaded {len(traces.rank_ids)} rank(s), {len(traces.events):,} events "
            f"in {time.perf_counter() - started:.1f} s")
    return analyse_traces(traces, steps=steps, include_last_step=include_last_step)
