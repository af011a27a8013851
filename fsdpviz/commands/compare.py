"""``fsdpviz compare RUN RUN... [-o FILE] [--label NAME ...] [--json]``: runs side by side."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from fsdpviz.commands.common import (
    QUIET_HELP,
    SCHEDULER_HELP,
    check_output_folder,
    progress_printer,
    warn_gaps,
)
from fsdpviz.errors import UsageError

EXAMPLE = """
fsdpviz compare runs/per-layer runs/per-pair -o compare.html
"""


def compare(
    runs: Annotated[list[Path], typer.Argument(
        metavar="RUN...", help="Two or more runs: run folders (from fsdpviz record), folders of traces, or trace files. "
             "The first is the baseline of the deltas.", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", "--out", metavar="FILE", help="HTML page to write. Default: ./fsdpviz-compare.html (with --json: no page "
                               "unless -o is given).", show_default=False)] = None,
    labels: Annotated[list[str] | None, typer.Option(
        "--label", metavar="NAME", help="Name of a run, once per run in the same order. Default: run.json's label, else "
                        "the folder name; runs of one name are told apart by their parent folders.",
        show_default=False)] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help='Print {"runs": [summary of each run], "deltas": {...}, ...} on stdout.')] = False,
    cache: Annotated[bool, typer.Option("--cache/--no-cache", help="Reuse parsed traces and the summaries cached beside them.")] = True,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help=QUIET_HELP)] = False,
    scheduler: Annotated[str | None, typer.Option("--scheduler", metavar="ADDRESS", help=SCHEDULER_HELP,
                                                  show_default=False)] = None,
) -> None:
    """Compare runs side by side.

    Step time, overlap, exposed communication, memory and units of each run, with the differences
    and findings: the tables in the terminal (or JSON with --json) and one HTML page."""
    from fsdpviz.analysis.compare.runs import compare_runs, comparison_json
    from fsdpviz.cache import keep, seed, store_for
    from fsdpviz.commands.compare_table import print_comparison
    from fsdpviz.report.compare.build import COMPARE_NAME, build_compare, load_runs
    from fsdpviz.whatif.gains import on_replay_split

    if len(runs) < 2:
        raise UsageError(f"compare needs at least two runs, got {len(runs)}")
    if labels and len(labels) != len(runs):
        raise UsageError(f"got {len(labels)} --label value(s) for {len(runs)} runs: give one label per run, "
                         "in the order of the runs, or none")
    target = output if output is not None or as_json else Path.cwd() / COMPARE_NAME
    check_output_folder(target, "the page")  # fail before loading anything
    started = time.perf_counter()
    say = progress_printer(quiet) or (lambda message: None)

    loaded = load_runs(runs, labels, cache=cache, progress=say, scheduler=scheduler)
    # each run's summary as `fsdpviz summary RUN` keeps it: read when cached, kept when computed here
    stores = [store_for([Path(run.source)], cache=cache) for run in loaded]
    for run, store in zip(loaded, stores):
        seed(run.result, store)
    for run in loaded:
        warn_gaps(run.traces)
        on_replay_split(run.result)  # each run's figures on its clock, as its summary gives them
    comparison = compare_runs(loaded)
    if as_json:
        import msgspec

        from fsdpviz.whatif.gains import completed_summary

        out = comparison_json(comparison)
        for run_json, run in zip(out["runs"], comparison.runs):  # each run as its summary --json gives it
            completed = completed_summary(run.result)
            run_json["actions"] = msgspec.to_builtins(completed.actions)
            run_json["clock"] = msgspec.to_builtins(completed.clock)
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        from fsdpviz.whatif.saved import load_predictions

        print_comparison(comparison, [(run.label, p) for run in loaded for p in load_predictions(run.traces.run_dir)])
    if target is not None:
        result = build_compare(loaded, target, comparison=comparison, progress=say)
        say(f"wrote {result.path} ({result.size_bytes / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s")
        if not as_json:
            typer.echo(f"compare page: {result.path}")
    for run, store in zip(loaded, stores):
        keep(run.result, store)
