"""The per-rank half of the pipeline, run where a rank is parsed: the *map* of a large run.

A run of many ranks is not brought into one process. Each rank's trace is parsed by a worker (a
local process or a Dask worker), which runs everything the analysis does on one rank -- the steps it
analyses, its whole-step overlap, the evidence of the framework, its per-unit tables, memory peaks
and step times (:func:`fsdpviz.analysis.run.analyse_ranks`) -- and sends back only that
(:class:`RankDigest`: O(units x steps) rows, never the events). The pipeline then combines the
digests (:func:`fsdpviz.structure.steps.combine_choices`, :func:`fsdpviz.analysis.run.combine_parts`):
clock alignment, stragglers, medians and findings need nothing else.

The functions are the same ones a small run, loaded whole, calls rank by rank in the parent, so both
ways give the same numbers (tests/unit/test_rank_map.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import pandas as pd

from fsdpviz.analysis.overlap import rank_overlap
from fsdpviz.analysis.run import RankPart, analyse_ranks
from fsdpviz.errors import NoDataError
from fsdpviz.runfolder import RunInfo
from fsdpviz.structure.framework import framework_evidence
from fsdpviz.structure.steps import RankChoice, choose_steps, combine_choices
from fsdpviz.trace import frames
from fsdpviz.trace.kineto import RankColumns
from fsdpviz.trace.sources import units_from_run
from fsdpviz.trace.tables import TraceSet
from fsdpviz.trace.unit_names import traced_names


@dataclass(kw_only=True, slots=True)
class RankDigest:
    """What the pipeline needs of one rank it does not hold the events of."""

    rank: int
    choice: RankChoice
    overlap: dict[str, object] | None  # schema.OVERLAP row; None when the rank has nothing in its steps
    error: str = ""  # that NoDataError's message
    evidence: list[str]  # framework.framework_evidence
    part: RankPart | None  # None after an error


def digest(traces: TraceSet, rank: int, events: pd.DataFrame, *, steps: Sequence[int] | None,
           include_last_step: bool) -> RankDigest:
    """The digest of ``rank`` of ``traces`` (``events``: the rank's own)."""
    choice = choose_steps(traces, rank, events, steps=steps, include_last_step=include_last_step)
    evidence = framework_evidence(events)
    try:
        row = rank_overlap(traces, rank, events, choice.analysed, steps)
    except NoDataError as exc:
        return RankDigest(rank=rank, choice=choice, overlap=None, error=str(exc),
                          evidence=evidence, part=None)
    return RankDigest(rank=rank, choice=choice, overlap=row, evidence=evidence,
                      part=analyse_ranks(traces, [rank], combine_choices([choice], steps), events))


def digest_columns(columns: RankColumns, *, run: RunInfo | None, steps: Sequence[int] | None,
                   include_last_step: bool) -> RankDigest:
    """:func:`digest` of one rank's parsed tables (consumed), as a worker runs it."""
    run, _ = traced_names(run, columns.categories.get("name", []))  # as the whole run's load names its units
    one = [columns]
    traces = TraceSet(events=frames.events_frame(one), lanes=frames.lanes_frame(one), steps=frames.steps_frame(one),
                      memory=frames.memory_frame(one, run), ranks=frames.ranks_frame(one), units=units_from_run(run),
                      run=run)
    out = digest(traces, columns.rank_id, traces.events, steps=steps, include_last_step=include_last_step)
    if out.part is not None:
        out.part.compact(keep_labels=False)
    return out


def rank_mapper(steps: Sequence[int] | None, include_last_step: bool,
                run: RunInfo | None) -> Callable[[RankColumns], RankDigest]:
    """The function each worker runs on a rank of the run of ``run`` (its run.json): a
    ``functools.partial`` of a module function, so that it pickles by reference."""
    chosen = tuple(steps) if steps is not None else None
    return partial(digest_columns, run=run, steps=chosen, include_last_step=include_last_step)
