"""``build_report``: loaded traces (+ analysis) -> one offline HTML file, with progress and timing.

The entry point of the report layer, used by ``fsdpviz report`` and at the end of
``fsdpviz record``. It runs the analysis the page needs when the caller has not already
(``summarize`` for the headline, whole-step overlap, per-unit ``analyze_run``), prepares the page
data, renders it and writes the file atomically.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdpviz.errors import RunFolderError
from fsdpviz.trace.tables import TraceSet

if TYPE_CHECKING:
    from fsdpviz.analysis.run import RunAnalysis

REPORT_NAME = "report.html"  # inside a run folder (the run-folder contract)
LOOSE_REPORT_NAME = "fsdpviz-report.html"  # in the working directory, for traces outside a run folder

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class ReportResult:
    """What was written."""

    path: Path
    size_bytes: int
    seconds: float  # analysis + page data + rendering + writing (not loading)
    segments: int  # Gantt rectangles on the page
    sections: tuple[str, ...]


def default_output(traces: TraceSet, cwd: Path | None = None) -> Path:
    """``RUN/report.html`` for a run folder, else ``./fsdpviz-report.html``.

    Traces outside a run folder often sit in folders the user does not own (downloads, shared
    read-only data), so their report goes to the working directory instead of beside them.
    """
    if traces.run_dir:
        return Path(traces.run_dir) / REPORT_NAME
    return (cwd or Path.cwd()) / LOOSE_REPORT_NAME


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def build_report(
    traces: TraceSet,
    output: str | Path | None = None,
    *,
    steps: Sequence[int] | None = None,
    ranks: Sequence[int] | None = None,
    summary: dict[str, Any] | None = None,
    analysis: RunAnalysis | None = None,
    progress: Progress | None = None,
) -> ReportResult:
    """Analyse ``traces`` and write the report page to ``output`` (default: :func:`default_output`).

    Args:
        traces: the loaded run (``fsdpviz.trace.load_traces``).
        output: the HTML file to write; its folder must exist.
        steps: ProfilerStep numbers to analyse (default: the analysis' default window).
        ranks: ranks the time-line Gantt draws (default: all, or 16 chosen ones beyond 16 ranks).
        summary: the ``summarize`` dict when the caller already has it.
        analysis: the ``analyze_run`` result when the caller already has it.
        progress: called with one short line per stage (e.g. ``print`` to stderr).

    Raises:
        RunFolderError: the output cannot be written.
        UsageError: ``ranks`` names ranks that are not in ``traces``.
        NoDataError: nothing to analyse in the window.
    """
    from fsdpviz.analysis import summarize
    from fsdpviz.analysis.run import analyze_run
    from fsdpviz.report.data import check_gantt_ranks, prepare_report

    out = Path(output) if output is not None else default_output(traces)
    if not out.parent.is_dir():
        raise RunFolderError(f"{out}: cannot write the report: folder {out.parent} does not exist")
    if ranks is not None:  # before the analysis, which takes a while on big runs
        check_gantt_ranks(traces, ranks)
    started = time.perf_counter()
    if analysis is None:
        _say(progress, "analysing FSDP units")
        analysis = analyze_run(traces, steps=steps)
    if summary is None:
        _say(progress, "analysing communication overlap")
        summary = summarize(traces, steps=steps, analysis=analysis)
    _say(progress, "preparing the page")
    data = prepare_report(traces, summary=summary, analysis=analysis, gantt_ranks=ranks)
    _say(progress, f"rendering {data.segment_count:,} spans")
    from fsdpviz.report.html import write_page
    from fsdpviz.report.page import build_page

    page = build_page(data)
    try:
        size = write_page(page, out)
    except OSError as exc:
        raise RunFolderError(f"{out}: cannot write the report: {exc.strerror or exc}") from exc
    return ReportResult(path=out, size_bytes=size, seconds=time.perf_counter() - started,
                        segments=data.segment_count, sections=tuple(s.key for s in page.sections))
