"""``build_report``: one pipeline result -> one offline HTML file, with progress and timing.

The entry point of the report layer, used by ``fsdpviz report`` and at the end of
``fsdpviz record``. The page reads the pipeline's summary, overlap and per-unit analysis
(:mod:`fsdpviz.analysis.pipeline`: computed once, whoever asks first), prepares the page data,
renders it and writes the file atomically.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpviz.errors import RunFolderError
from fsdpviz.runfolder import REPORT_HTML
from fsdpviz.trace.tables import TraceSet

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult

REPORT_NAME = REPORT_HTML  # inside a run folder (the run-folder contract)
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


def import_report_modules() -> None:
    """Import what :func:`build_report` needs (holoviews and bokeh: ~0.4 s): commands pass it to
    ``analyse(meanwhile=...)`` so that it runs while the traces are parsed. A missing or broken
    plotting library is left for :func:`build_report` to meet: the analysis (and ``record``'s
    summary) must not fail for it."""
    try:
        import fsdpviz.report.data
        import fsdpviz.report.page  # noqa: F401
    except ImportError:
        pass


def build_report(
    result: RunResult,
    output: str | Path | None = None,
    *,
    ranks: Sequence[int] | None = None,
    progress: Progress | None = None,
) -> ReportResult:
    """Write the report page of one pipeline result to ``output`` (default: :func:`default_output`).

    Args:
        result: the analysed run (``fsdpviz.analysis.pipeline.analyse``).
        output: the HTML file to write; its folder must exist.
        ranks: ranks the time-line Gantt draws (default: all, or 16 chosen ones beyond 16 ranks).
        progress: called with one short line per stage (e.g. ``print`` to stderr).

    Raises:
        RunFolderError: the output cannot be written.
        UsageError: ``ranks`` names ranks that are not in the run.
    """
    from fsdpviz.report.data import check_gantt_ranks, prepare_report

    traces = result.traces
    out = Path(output) if output is not None else default_output(traces)
    if not out.parent.is_dir():
        raise RunFolderError(f"{out}: cannot write the report: folder {out.parent} does not exist")
    if ranks is not None:  # before the analysis, which takes a while on big runs
        check_gantt_ranks(traces, ranks)
    started = time.perf_counter()
    if not result.analysed:
        _say(progress, "analysing FSDP units")
        result.analysis  # noqa: B018 - computed here, so that the progress line is said before it
    _say(progress, "preparing the page")
    data = prepare_report(result, gantt_ranks=ranks)
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
