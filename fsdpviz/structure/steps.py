"""Which ProfilerSteps are analysed: every step the trace holds complete.

A profiler that stops inside a step leaves it cut short: its CPU range ends where recording ended,
and on a GPU the kernels it launched last never reach the trace. HTA therefore drops the last
profiled step of every trace. That is safe but wasteful: ``fsdpviz record`` steps the profiler at the
end of each optimizer step and writes the trace only after the last recorded step has ended, so in
its traces every profiled step is complete -- dropping one throws away a third of a default recording.

The rule, per rank:

- the user named steps (``--steps``): those;
- ``include_last_step``: every captured step;
- the trace was recorded by ``fsdpviz record`` with the optimizer-step schedule (run.json says so,
  and lists the steps the rank's profiler recorded, the step a failing rank was inside and how many
  steps it completed): every listed step the rank completed, and on a GPU rank the last step only when every kernel,
  copy and memset launched in it is in the trace;
- otherwise (traces recorded without fsdpviz, the time-window fallback) completeness cannot be
  shown: every step but the last, as HTA does. A trace of one step keeps it.

Steps left out are said in :attr:`StepSelection.notes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.errors import UsageError
from fsdpviz.runfolder import SCHEDULE_OPTIMIZER_STEPS, RunInfo, number_ranges
from fsdpviz.structure.records import NO_PROFILER_STEP, STEPS_DROPPED, Note
from fsdpviz.trace import schema
from fsdpviz.trace.tables import TraceSet

# CUDA / HIP runtime and driver calls that put work on a GPU stream (each has its GPU event).
_LAUNCH_WORDS: Final = ("LaunchKernel", "LaunchCooperativeKernel", "MemcpyAsync", "MemsetAsync")


@dataclass(frozen=True, slots=True)
class AnalysedSteps:
    """The ProfilerSteps analysed on one rank and their time span (steps empty = none chosen).

    (Not to be confused with a unit's *window*, the span of its labels in one pass:
    :mod:`fsdpviz.structure.windows`.)"""

    steps: tuple[int, ...]
    start_ns: int
    end_ns: int


@dataclass(kw_only=True, slots=True)
class StepSelection:
    """The analysed steps of every rank (None: the rank's trace has no ProfilerStep at all)."""

    per_rank: dict[int, AnalysedSteps | None]
    requested: tuple[int, ...] | None = None  # the steps the user named, if any
    dropped: dict[int, tuple[int, ...]] = field(default_factory=dict)  # rank -> steps left out as cut
    notes: list[Note] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        """The analysed steps, over all ranks."""
        return sorted({s for a in self.per_rank.values() if a is not None for s in a.steps})

    def of(self, rank: int) -> AnalysedSteps | None:
        """The analysed steps of ``rank`` (None: its trace has no ProfilerStep)."""
        return self.per_rank.get(rank)


def analysed_steps_of(rank_steps: pd.DataFrame, chosen: Sequence[int] | None) -> AnalysedSteps | None:
    """The AnalysedSteps of one rank's steps (all of them when ``chosen`` is None); None without steps."""
    if rank_steps.empty:
        return None
    ordered = rank_steps.sort_values("start_ns", kind="stable")
    if chosen is not None:
        ordered = ordered[ordered["step"].isin(list(chosen))]
    if ordered.empty:
        return AnalysedSteps((), 0, 0)
    return AnalysedSteps(tuple(int(s) for s in ordered["step"]), int(ordered["start_ns"].min()),
                      int(ordered["end_ns"].max()))


def exported_complete(ranks: pd.DataFrame, rank: int) -> set[int] | None:
    """Steps an fsdpviz export lists as complete for ``rank`` (it holds only analysed steps), or None."""
    if "complete_steps" not in ranks.columns:
        return None
    row = ranks.loc[ranks["rank"] == rank, "complete_steps"]
    text = str(row.iloc[0]) if len(row) and not pd.isna(row.iloc[0]) else ""
    return {int(s) for s in text.split(",") if s.strip()} or None


def recorded_complete(run: RunInfo | None, rank: int) -> set[int] | None:
    """Steps run.json shows complete on ``rank`` (fsdpviz's own schedule), None when it cannot tell."""
    if run is None or run.profile.schedule != SCHEDULE_OPTIMIZER_STEPS:
        return None
    info = run.rank_info(rank)
    listed = info.profiled_steps if info is not None and info.profiled_steps is not None else run.profile.steps
    if not listed:
        return None
    partial = info.partial_step if info is not None else None
    # a step at or past the count of steps the rank completed never ended there: a recorder before
    # partial_step covered a rank that failed at the top of a step listed that step as profiled
    seen = info.steps_seen if info is not None and info.status not in (None, "", "running") else None
    return {s for s in listed if s != partial and (seen is None or s < seen)}


def missing_gpu_work(events: pd.DataFrame, step: int) -> int:
    """Launches in ``step`` (one rank's events) whose GPU kernel, copy or memset is not in the trace."""
    if not (events["kind"] == schema.KIND_KERNEL).any():
        return 0
    runtime = events[((events["kind"] == schema.KIND_RUNTIME) & (events["step"] == step)
                      & (events["correlation"] >= 0)).to_numpy()]
    if runtime.empty:
        return 0
    names = runtime["name"].astype(str)
    launches = runtime[names.str.contains("|".join(_LAUNCH_WORDS), regex=True).to_numpy()]
    gpu = events[events["kind"].isin([schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET]).to_numpy()]
    found = np.isin(launches["correlation"].to_numpy(), gpu["correlation"].to_numpy())
    return int((~found).sum())


@dataclass(frozen=True, slots=True)
class RankChoice:
    """One rank's part of a :class:`StepSelection`: its analysed steps, the steps left out as cut
    short and why (computed where the rank's events are, then combined by :func:`combine_choices`)."""

    rank: int
    analysed: AnalysedSteps | None
    dropped: tuple[int, ...] = ()
    why: str = ""


def choose_steps(traces: TraceSet, rank: int, events: pd.DataFrame | None, *,
                 steps: Sequence[int] | None = None, include_last_step: bool = False) -> RankChoice:
    """The analysed steps of ``rank`` (see the module docstring); ``events`` are the rank's own
    (None: not at hand, and then a GPU rank's last step is not checked for missing kernels)."""
    rank_steps = traces.steps[traces.steps["rank"] == rank]
    if rank_steps.empty:
        return RankChoice(rank, None)
    ordered = [int(s) for s in rank_steps.sort_values("start_ns", kind="stable")["step"]]
    if steps is not None:
        absent = sorted(set(steps) - set(ordered))
        if absent:  # the user's --steps: name the steps there are, not the empty window it leaves
            what = "step" if len(absent) == 1 else "steps"
            raise UsageError(f"{traces.source_of(rank)}: --steps: {what} {number_ranges(absent)} not in this "
                             f"trace, which holds {'step' if len(ordered) == 1 else 'steps'} {number_ranges(ordered)}")
        return RankChoice(rank, analysed_steps_of(rank_steps, steps))
    if include_last_step or len(ordered) == 1:
        return RankChoice(rank, analysed_steps_of(rank_steps, ordered))
    why = ""
    complete = recorded_complete(traces.run, rank)
    if complete is None:
        complete = exported_complete(traces.ranks, rank)
    if complete is None:
        keep = ordered[:-1]
        why = "the trace cannot show that the profiler recorded it to its end"
    else:
        keep = [s for s in ordered if s in complete]
        last = ordered[-1]
        if last in keep and events is not None and len(events):
            missing = missing_gpu_work(events, last)
            if missing:
                keep.remove(last)
                why = f"{missing} GPU kernels or copies launched in it are not in the trace"
        if ordered[-1] not in keep and not why:
            why = "the rank stopped inside it"
    left_out = tuple(s for s in ordered if s not in keep)
    return RankChoice(rank, analysed_steps_of(rank_steps, keep), left_out, why if left_out else "")


def combine_choices(choices: Sequence[RankChoice], requested: Sequence[int] | None) -> StepSelection:
    """The StepSelection of a run from its ranks' choices (in rank order)."""
    per_rank = {c.rank: c.analysed for c in choices}
    dropped = {c.rank: c.dropped for c in choices if c.dropped}
    why = {c.rank: c.why for c in choices if c.why}
    return StepSelection(per_rank=per_rank, requested=tuple(requested) if requested is not None else None,
                         dropped=dropped, notes=_notes(per_rank, dropped, why))


def select_steps(traces: TraceSet, *, steps: Sequence[int] | None = None,
                 include_last_step: bool = False) -> StepSelection:
    """The analysed steps of every rank of ``traces`` (see the module docstring)."""
    by_rank = traces.events.groupby("rank", sort=False).indices if len(traces.events) else {}
    choices = [choose_steps(traces, rank, traces.events.iloc[by_rank[rank]] if rank in by_rank else None,
                            steps=steps, include_last_step=include_last_step) for rank in traces.rank_ids]
    return combine_choices(choices, steps)


def _notes(per_rank: dict[int, AnalysedSteps | None], dropped: dict[int, tuple[int, ...]],
           why: dict[int, str]) -> list[Note]:
    notes = [Note(NO_PROFILER_STEP, f"rank {rank}: no ProfilerStep#N in the trace, the whole trace was analysed")
             for rank, w in per_rank.items() if w is None]
    by_text: dict[str, list[int]] = {}
    for rank, left_out in dropped.items():
        steps_text = ", ".join(map(str, left_out))
        what = f"step {steps_text}" if len(left_out) == 1 else f"steps {steps_text}"
        by_text.setdefault(f"{what} (cut short) is not analysed: {why.get(rank, 'incomplete')}", []).append(rank)
    for text, ranks in by_text.items():
        where = "" if len(ranks) == len(per_rank) else f" on rank(s) {', '.join(map(str, ranks))}"
        notes.append(Note(STEPS_DROPPED, text.replace(" is not analysed", f" is not analysed{where}", 1)))
    return notes
