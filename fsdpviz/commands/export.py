"""``fsdpviz export PATH... --format parquet|csv -o DIR``: the analysis tables as files.

For users who want the numbers in their own notebooks or dashboards: the per-unit timeline
(``spans``), per-unit results (``units`` = medians per unit, ``unit_steps`` = one row per rank,
step, unit and pass), allocator samples (``memory``), per-rank step times (``steps``), ``findings``,
and the cross-rank tables (``memory_peaks``, ``clock``, ``skew``). Columns are those of
``fsdpviz.trace.schema`` (docs/concepts.md defines them); times are nanoseconds on the reference
rank's clock, as traced, but for ``findings`` and the ``*_clock_ns`` columns (a unit pass, on a GPU its
gaps moved), whose times are on the run's clock as the summary's are (``export.json``'s ``device_scale``
moves a traced time there, its ``comm_scale`` a collective's; its ``host_scale`` and ``idle_scale`` a GPU
pass's gaps). ``export.json`` lists
the files with the run's framework, ranks, steps, memory model and notes, and says per file which clock
its times are on (``times``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fsdpviz.commands.common import (
    INCLUDE_LAST_HELP,
    PATHS_HELP,
    QUIET_HELP,
    SCHEDULER_HELP,
    STEPS_HELP,
    check_output_tree,
    warn_gaps,
)
from fsdpviz.errors import UsageError

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult

FORMATS = ("parquet", "csv", "perfetto")
# Which clock each table's times are on, as export.json's ``times`` says (a figure the summary shows on the
# run's clock is exported under the schema's name, as traced: the file says which it is). Every table
# export_tables writes is named here (tests/unit/test_export.py holds the two lists to one another).
TRACED = "traced"
TABLE_TIMES = {
    "spans": TRACED,
    "units": "traced, but forward_clock_ns and backward_clock_ns: the run's clock (their kernels moved by "
             "device_scale, their gaps by host_scale and idle_scale); the summary's units move the collectives' "
             "times by comm_scale, host_wait_ns by host_scale and the prefetch leads by device_scale",
    "unit_steps": "traced, but compute_clock_ns: the run's clock",
    "memory": TRACED,
    "memory_peaks": TRACED,
    "steps": TRACED,
    "findings": "the run's clock, as the summary's findings",
    "clock": "each rank's offset onto the reference rank's clock, as traced",
    "skew": TRACED,
}
EXAMPLE = """
fsdpviz export runs/base -o base-tables/
fsdpviz export runs/base --format perfetto -o base.json.gz
"""


def export(
    paths: Annotated[list[Path], typer.Argument(metavar="PATH...", help=PATHS_HELP, show_default=False)],
    out: Annotated[Path, typer.Option("-o", "--out", "--output", metavar="DIR|FILE", help="Folder to write the tables into (created if needed); "
                                      "with --format perfetto the trace file to write (.json or .json.gz).",
                                      show_default=False)],
    fmt: Annotated[str, typer.Option("--format", metavar="parquet|csv|perfetto", help="parquet or csv (tables), or perfetto: one trace file for "
                                                      "Perfetto / chrome://tracing with a track per FSDP unit "
                                                      "phase.")] = "parquet",
    steps: Annotated[str | None, typer.Option(
        "--steps", metavar="STEPS", help=STEPS_HELP, show_default=False)] = None,
    include_last_step: Annotated[bool, typer.Option("--include-last-step", help=INCLUDE_LAST_HELP)] = False,
    cache: Annotated[bool, typer.Option(
        "--cache/--no-cache", help="Reuse parsed traces cached beside them.")] = True,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help=QUIET_HELP)] = False,
    ranks: Annotated[str | None, typer.Option(
        "--ranks", metavar="RANKS", help="perfetto: ranks to keep, e.g. 0,1 or 0-3 (default: all).", show_default=False)] = None,
    raw: Annotated[bool, typer.Option(
        "--raw/--no-raw", help="perfetto: also keep the ranks' original events (--no-raw: unit tracks, "
                               "memory and nothing else; much smaller).")] = True,
    scheduler: Annotated[str | None, typer.Option("--scheduler", metavar="ADDRESS", help=SCHEDULER_HELP,
                                                  show_default=False)] = None,
) -> None:
    """Write a run's tables, or the run as one Perfetto trace.

    Parquet or CSV: spans, units, unit_steps, memory, steps, findings and the cross-rank tables, one
    file each, with export.json listing them; times are nanoseconds on one clock for all ranks, as
    traced (the findings' on the run's clock: export.json's device_scale moves a traced time there,
    its comm_scale a collective's).
    Perfetto: one trace file for ui.perfetto.dev or chrome://tracing, with a track per FSDP unit
    phase."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.cache import seed, store_for
    from fsdpviz.commands.summary import parse_steps
    from fsdpviz.whatif.gains import on_replay_split

    if fmt not in FORMATS:
        raise UsageError(f"--format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt == "perfetto":
        _export_perfetto(paths, out, steps, ranks, raw, cache, scheduler, include_last_step, quiet)
        return
    if ranks is not None or not raw:
        raise UsageError("--ranks and --no-raw apply to --format perfetto")
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: exists and is not a folder")
    check_output_tree(out, "the export")  # before minutes of loading
    run = analyse(paths, steps=parse_steps(steps), include_last_step=include_last_step, cache=cache,
                  progress=False if quiet else None, scheduler=scheduler)
    # on the clock the summary gives (the bound's split: the cached summary's, else the model's)
    seed(run, store_for(paths, steps=parse_steps(steps), include_last_step=include_last_step, cache=cache))
    on_replay_split(run)
    traces, analysis = run.traces, run.analysis
    warn_gaps(traces)  # after the analysis: bad input stays one error line
    tables = export_tables(run)
    manifest = {
        "framework": analysis.framework, "world_size": analysis.world_size, "ranks": analysis.ranks,
        "steps": analysis.steps, "format": fmt, "memory_model": analysis.memory_model.to_json() if analysis.memory_model else {},
        "notes": [n.text for n in analysis.notes], "sources": list(traces.sources),
        "device_scale": run.device_scale, "comm_scale": run.comm_scale,
        "host_scale": run.gap_scales[0], "idle_scale": run.gap_scales[1],
        "times": {name: TABLE_TIMES[name] for name in tables},
    }
    try:
        out.mkdir(parents=True, exist_ok=True)
        written = write_tables(tables, out, fmt, manifest)
    except OSError as exc:
        raise UsageError(f"-o {out}: cannot write ({exc.strerror or exc})") from None
    for name, info in written.items():
        typer.echo(f"{out / info['file']}  {info['rows']:,} rows  ({name})")


def export_tables(run: RunResult) -> dict[str, Any]:
    """The tables to write, by file stem. Memory is every allocator sample of the analysed
    window (not the thinned curve), on the reference clock: a run held rank by rank keeps thinned
    memory only, so its ranks are read again for them."""
    from fsdpviz.analysis.summary import run_findings

    analysis = run.analysis
    memory = run.aligned_detail().memory
    if len(analysis.step_times):
        lo, hi = analysis.step_times["start_ns"].min(), analysis.step_times["end_ns"].max()
        memory = memory[(memory["t_ns"] >= lo) & (memory["t_ns"] <= hi)]
    units = analysis.unit_stats.merge(analysis.units[["unit", "framework", "parent"]], on="unit", how="left") \
        if len(analysis.units) else analysis.unit_stats
    return {
        "spans": analysis.spans, "units": units, "unit_steps": analysis.unit_steps, "memory": memory,
        "memory_peaks": analysis.memory_peaks, "steps": analysis.step_times,
        "findings": run_findings(analysis.findings, run.traces, run.overlap, run.framework),
        "clock": analysis.clock, "skew": analysis.skew,
    }


def write_tables(tables: dict[str, Any], out: Path, fmt: str,
                 manifest: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Write each table as ``out/<name>.<fmt>`` (and ``export.json`` from ``manifest`` plus the file
    list); returns name -> {file, rows}.

    All files are written under temporary names first and renamed only once every one of them is
    complete: a full disk or a failing table leaves an earlier export in ``out`` as it was.
    """
    written: dict[str, dict[str, Any]] = {}
    staged: list[tuple[Path, Path]] = []
    try:
        for name, frame in tables.items():
            path = out / f"{name}.{fmt}"
            tmp = out / f".{path.name}.tmp"
            staged.append((tmp, path))
            frame = frame.reset_index(drop=True)
            if fmt == "parquet":
                frame.to_parquet(tmp, index=False)
            else:
                frame.to_csv(tmp, index=False)
            written[name] = {"file": path.name, "rows": len(frame)}
        if manifest is not None:
            tmp = out / ".export.json.tmp"
            staged.append((tmp, out / "export.json"))
            tmp.write_text(json.dumps({**manifest, "files": written}, indent=2) + "\n")
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
    return written


def _export_perfetto(paths: list[Path], out: Path, steps: str | None, ranks: str | None, raw: bool,
                     cache: bool, scheduler: str | None, include_last_step: bool, quiet: bool) -> None:
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.commands.common import check_output_folder
    from fsdpviz.commands.summary import parse_numbers, parse_steps
    from fsdpviz.report.perfetto import export_perfetto

    if out.is_dir():
        raise UsageError(f"-o {out}: a folder; --format perfetto writes one file, e.g. -o run.json.gz")
    if not out.name.endswith((".json", ".json.gz")):
        raise UsageError(f"-o {out}: name the file .json or .json.gz (Perfetto and chrome://tracing read both)")
    check_output_folder(out, "the export")
    wanted = parse_numbers(ranks, "--ranks")
    run = analyse(paths, include_last_step=include_last_step, cache=cache, progress=False if quiet else None,
                  scheduler=scheduler)
    warn_gaps(run.traces)
    result = export_perfetto(run, out, steps=parse_steps(steps), ranks=wanted, raw=raw)
    typer.echo(f"{result.path}  {result.events:,} events, {result.ranks} rank(s), "
               f"{result.size_bytes / 1e6:.1f} MB")

