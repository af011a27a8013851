"""Everything the page shows, as tables and numbers: built first, rendered second.

:func:`prepare_report` turns the loader's :class:`~fsdpviz.trace.TraceSet` and the analysis
results into a :class:`ReportData`; :mod:`fsdpviz.report.page` only formats and plots it. Tests
assert on this data (rows per lane, colours per unit, exposed pieces, memory peaks), not on HTML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from fsdpviz.report import memory, steptimes
from fsdpviz.report.stepview import StepView, lanes_view
from fsdpviz.report.timeline import MAX_PAGE_SEGMENTS, choose_steps
from fsdpviz.trace.tables import TraceSet


@dataclass(kw_only=True, slots=True)
class ReportData:
    """The content of one report page."""

    title: str
    subtitle: str
    meta: list[tuple[str, str]]  # (label, value) shown under the title
    summary: dict[str, Any]  # the ``fsdpviz summary --json`` dict of the same inputs
    overlap: pd.DataFrame  # schema.OVERLAP, one row per rank
    views: list[StepView]  # time-line tabs
    step_times: pd.DataFrame  # steptimes.step_times()
    step_spread: pd.DataFrame  # steptimes.per_step_spread()
    rank_steps: pd.DataFrame  # steptimes.per_rank_summary()
    has_units: bool = False
    unit_colors: dict[str, str] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    segment_count: int = 0  # Gantt rectangles on the page, all tabs


def describe_inputs(traces: TraceSet) -> tuple[str, str, list[tuple[str, str]]]:
    """Title, subtitle and meta lines from run.json (when recorded by fsdpviz) or the trace files."""
    run = traces.run or {}
    meta: list[tuple[str, str]] = []
    if run:
        label = str(run.get("label") or "")
        title = f"fsdpviz report: {label}" if label else "fsdpviz report"
        command = run.get("command") or []
        subtitle = " ".join(str(c) for c in command) if isinstance(command, list) else str(command)
        for key, name in (("status", "status"), ("start_time", "started"), ("end_time", "ended")):
            if run.get(key):
                meta.append((name, str(run[key])))
        if run.get("hosts"):
            meta.append(("hosts", ", ".join(str(h) for h in run["hosts"])))
        versions = run.get("versions") or {}
        if isinstance(versions, dict) and versions:
            meta.append(("versions", ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))))
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


def prepare_report(traces: TraceSet, *, summary: dict[str, Any], overlap: pd.DataFrame,
                   max_segments: int = MAX_PAGE_SEGMENTS) -> ReportData:
    """The page's data from the loaded traces and the whole-step analysis results."""
    title, subtitle, meta = describe_inputs(traces)
    choices = choose_steps(traces.steps, summary.get("steps") or None)
    memory_ranks = memory.choose_memory_ranks(traces.memory)
    per_view = max(1_000, max_segments // max(len(choices), 1))
    views = [lanes_view(traces, overlap, choice, max_segments=per_view, memory_ranks=memory_ranks)
             for choice in choices]
    times = steptimes.step_times(traces)
    notes = []
    if len(memory_ranks) < traces.memory["rank"].nunique():
        notes.append(f"Memory curves show {len(memory_ranks)} of {traces.memory['rank'].nunique()} ranks: "
                     "rank 0 and the ranks with the highest peaks.")
    return ReportData(
        title=title, subtitle=subtitle, meta=meta, summary=summary, overlap=overlap, views=views,
        step_times=times, step_spread=steptimes.per_step_spread(times),
        rank_steps=steptimes.per_rank_summary(times), notes=notes,
        segment_count=sum(len(v.segments) + len(v.exposed) for v in views),
    )
