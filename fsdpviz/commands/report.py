"""``fsdpviz report PATH... [-o FILE]``: load traces, analyse, write one offline HTML page."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from fsdpviz.commands.common import (
    INCLUDE_LAST_HELP,
    PATHS_HELP,
    QUIET_HELP,
    SCHEDULER_HELP,
    STEPS_HELP,
    check_output_folder,
    progress_printer,
    warn_gaps,
)
from fsdpviz.commands.summary import parse_steps
from fsdpviz.errors import UsageError

EXAMPLE = """
fsdpviz report runs/base -o base.html
"""


def parse_ranks(text: str | None) -> list[int] | None:
    """``"0,3"`` / ``"0-7"`` -> rank numbers for the Gantt; None (automatic) when not given."""
    try:
        return parse_steps(text)
    except UsageError:
        raise UsageError(f"--ranks: cannot read {text!r}; use numbers and ranges like 0,3 or 0-7") from None


def report(
    paths: list[Path] = typer.Argument(  # noqa: B008 - typer reads its options from the defaults
        ..., metavar="PATH...", help=PATHS_HELP, show_default=False),
    output: Path | None = typer.Option(  # noqa: B008
        None, "-o", "--output", "--out", metavar="FILE", help="HTML file to write. Default: report.html in the run folder, "
                                     "else ./fsdpviz-report.html.", show_default=False),
    steps: str | None = typer.Option(
        None, "--steps", metavar="STEPS", help=STEPS_HELP, show_default=False),
    ranks: str | None = typer.Option(
        None, "--ranks", metavar="RANKS", help="Ranks the timeline Gantt draws, e.g. 0-7 or 0,5,9. Default: all ranks, "
                              "or 16 chosen ones (rank 0, slowest, fastest, spread) beyond 16.",
        show_default=False),
    include_last_step: bool = typer.Option(False, "--include-last-step", help=INCLUDE_LAST_HELP),
    cache: bool = typer.Option(True, "--cache/--no-cache", help="Reuse parsed traces and the summary cached beside them."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help=QUIET_HELP),
    scheduler: str | None = typer.Option(None, "--scheduler", metavar="ADDRESS", help=SCHEDULER_HELP,
                                         show_default=False),
) -> None:
    """Write a run's offline HTML report.

    Per-unit Gantt, memory, overlap, step times and findings, in one file that opens in a browser
    without a network."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.cache import keep, seed, store_for
    from fsdpviz.report.build import build_report, import_report_modules
    from fsdpviz.trace.sources import check_inputs

    step_list = parse_steps(steps)
    rank_list = parse_ranks(ranks)
    check_output_folder(output, "the report")  # fail before minutes of loading
    check_inputs(paths)  # a missing input is its one error line, not "loading" and then the error
    say = progress_printer(quiet)
    started = time.perf_counter()
    if say:
        say(f"loading {', '.join(str(p) for p in paths)}")
    run = analyse(paths, steps=step_list, include_last_step=include_last_step, cache=cache,
                  progress=False if quiet else None, say=say, scheduler=scheduler, meanwhile=import_report_modules)
    # the page's summary is `fsdpviz summary`'s: read from the cache when that ran before (no replay,
    # no priced actions), kept there when not (fsdpviz/cache.py)
    store = store_for(paths, steps=step_list, include_last_step=include_last_step, cache=cache)
    seed(run, store)
    written = build_report(run, output, ranks=rank_list, progress=say)
    keep(run, store)
    warn_gaps(run.traces)  # after the analysis: bad input stays one error line
    if say:
        say(f"wrote {written.path} ({written.size_bytes / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s")
    typer.echo(str(written.path))
