"""Plot data of one drawn step: Gantt rows and segments, exposed communication, memory curve.

A :class:`StepView` is everything one tab of the time-line section needs, built from the loader's
tables (the whole-step "all events" view, which works for any trace) or from the per-unit spans of the
analysis (the "units" view). Exposed communication comes from the analysis' own definitions
(:mod:`fsdpviz.analysis.overlap`: communication time not covered by computation on the same rank);
this module only cuts it to the step and lays it onto the lanes where communication runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from fsdpviz.analysis import memory as mem
from fsdpviz.analysis import overlap as ov
from fsdpviz.formatting import NS_PER_MS, format_bytes
from fsdpviz.report.timeline import memory
from fsdpviz.report.timeline.events import CAT_COMM, event_segments, lane_rows
from fsdpviz.report.timeline.steps import StepChoice, to_ms
from fsdpviz.structure.intervals import cover_rows, subtract_intervals
from fsdpviz.structure.steps import analysed_steps_of
from fsdpviz.trace import schema
from fsdpviz.trace.tables import TraceSet

# Lanes on which communication actually runs (CPU threads that only issue or wait are left out).
COMM_LANE_KINDS = (schema.LANE_CPU_GLOO, schema.LANE_GPU_STREAM)


@dataclass(kw_only=True, slots=True)
class StepView:
    """One tab of the time-line section."""

    kind: str  # "events" (all events by category) or "units" (FSDP unit spans)
    choice: StepChoice
    rows: pd.DataFrame  # row, rank, lane, lane_kind, label
    segments: pd.DataFrame  # row, x0_ms, x1_ms, dur_ms, start_ms, color_by column, hover columns
    color_by: str  # "category" or "unit_name"
    exposed: pd.DataFrame  # row, rank, x0_ms, x1_ms, dur_ms, what
    memory: pd.DataFrame  # memory.memory_curves() of the drawn ranks
    peaks: pd.DataFrame | None = None  # unit peak markers: rank, unit, t_ms, peak_bytes, peak_text, color
    categories: pd.DataFrame | None = None  # memory.category_curve(): one rank's levels by category
    category_rank: int = -1  # the rank ``categories`` is of
    category_unknown: dict[str, str] = field(default_factory=dict)  # its categories that cannot be known, why
    merged: bool = False  # segments were joined across gaps to fit the budget
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        what = "FSDP units per lane" if self.kind == "units" else "busy time per lane"
        # which step is drawn, not its length: one step's span over the drawn ranks under the profiler
        # would be one more step time beside the run's (the headline's and the traced step), and the
        # time axis shows it
        return f"{self.choice.label}: {what}"


def exposed_intervals(traces: TraceSet, overlap: pd.DataFrame, step: int,
                      ranks: Sequence[int] | None = None) -> pd.DataFrame:
    """Exposed communication of each rank during ``step``: comm minus compute, as the analysis
    defines them for the rank's device (GPU kernels or CPU threads). Columns rank, start_ns, end_ns."""
    parts: list[pd.DataFrame] = []
    device_of = dict(zip(overlap["rank"].astype(int), overlap["device"].astype(str)))
    rows_of = traces.events.groupby("rank", sort=False, observed=True).indices  # one pass, not one per rank
    for rank in (traces.rank_ids if ranks is None else ranks):
        if rank not in rows_of:
            continue
        if step == schema.NO_STEP:  # a trace without ProfilerSteps: its whole length
            window = None
        else:
            window = analysed_steps_of(traces.steps[traces.steps["rank"] == rank], [step])
            if window is None or not window.steps:
                continue
        events = traces.events.iloc[rows_of[rank]]
        if device_of.get(rank) == schema.OVERLAP_GPU:
            comm, compute, _ = ov.gpu_sets(events, window)
        else:
            lanes = traces.lanes[traces.lanes["rank"] == rank]
            comm, compute, _ = ov.cpu_sets(events, lanes, window)
        starts, ends = subtract_intervals(comm, compute)
        parts.append(pd.DataFrame({"rank": rank, "start_ns": starts, "end_ns": ends}))
    if not parts:
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "start_ns": pd.Series(dtype="int64"),
                             "end_ns": pd.Series(dtype="int64")})
    return pd.concat(parts, ignore_index=True)


def exposed_on_segments(segments: pd.DataFrame, exposed: pd.DataFrame, choice: StepChoice,
                        describe: Sequence[str]) -> pd.DataFrame:
    """Pieces of communication ``segments`` (ns, with ``rank`` and ``row``) that are exposed.

    ``describe`` names the segment columns joined into the ``what`` hover text.
    """
    cols = ["row", "rank", "x0_ms", "x1_ms", "dur_ms", "what"]
    if segments.empty or exposed.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    pieces = cover_rows(segments.reset_index(drop=True), exposed, key="rank")
    if pieces.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    pieces = to_ms(pieces, choice.origin_ns)
    what = pieces[describe[0]].astype(str)
    for col in describe[1:]:
        what = what + " " + pieces[col].astype(str)
    pieces["what"] = what
    return pieces[cols].reset_index(drop=True)


def events_view(traces: TraceSet, overlap: pd.DataFrame, choice: StepChoice, *, max_segments: int,
               memory_ranks: Sequence[int], ranks: Sequence[int] | None = None,
               exposed: pd.DataFrame | None = None, memory_curve: pd.DataFrame | None = None) -> StepView:
    """The whole-step view: every lane of ``ranks`` (default all), busy time by category, exposed
    communication (``exposed_intervals``, computed here when not given) in red, and the memory
    curve (``memory_curve``: the analysis' thinned curve, schema.MEMORY; by default made from
    ``traces.memory`` with ``fsdpviz.analysis.memory.curves``)."""
    ranks = traces.rank_ids if ranks is None else list(ranks)
    all_rows = lane_rows(traces.lanes, ranks)
    drawn = traces.events if len(ranks) == len(traces.rank_ids) else \
        traces.events[traces.events["rank"].isin(ranks).to_numpy()]
    segments, merged = event_segments(drawn, all_rows, choice, max_segments)
    rows = lane_rows(traces.lanes, ranks, used=segments)
    segments = segments.drop(columns="row").merge(rows[["rank", "lane", "row"]], on=["rank", "lane"])
    segments["start_ms"] = segments["x0_ms"]
    segments["events"] = segments["n_merged"].astype(np.int64)
    comm_kind = rows.set_index("row")["lane_kind"]
    comm = segments[(segments["category"] == CAT_COMM)
                    & segments["row"].map(comm_kind).isin(COMM_LANE_KINDS)]
    comm = comm.assign(what=comm["name"].astype(str))
    if exposed is None:
        exposed = exposed_intervals(traces, overlap, choice.step, ranks)
    exposed = exposed_on_segments(comm, exposed, choice, ["what"])
    notes = []
    if merged:
        notes.append(f"{choice.label}: more than {max_segments:,} busy intervals; neighbouring "
                     "intervals of a lane were joined across short gaps (hover shows how many events).")
    return StepView(kind="events", choice=choice, rows=rows, segments=segments.reset_index(drop=True),
                    color_by="category", exposed=exposed,
                    memory=memory.memory_curves(mem.curves(traces.memory) if memory_curve is None else memory_curve,
                                                choice, list(memory_ranks)),
                    merged=merged, notes=notes)


def unit_peak_markers(peaks: pd.DataFrame, choice: StepChoice, colors: Mapping[str, str]) -> pd.DataFrame:
    """Peak markers of the units during ``choice``'s step: ``rank``, ``unit``, ``t_ns`` and
    ``peak_bytes`` in; ``t_ms`` (from the step origin), ``peak_text`` and ``color`` added."""
    inside = peaks[(peaks["t_ns"] >= choice.origin_ns) & (peaks["t_ns"] <= choice.end_ns)].copy()
    inside["t_ms"] = (inside["t_ns"] - choice.origin_ns) / NS_PER_MS
    inside["peak_text"] = [format_bytes(b) for b in inside["peak_bytes"]]
    inside["color"] = inside["unit"].map(lambda u: colors.get(u, "#888888"))
    inside["unit_name"] = inside["unit"]  # the optimizer's spans carry no peak marker, so no relabelling
    return inside.reset_index(drop=True)
