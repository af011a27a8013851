"""``fsdpviz summary PATH... [--json]``: headline numbers of a run, as a table or as JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fsdpviz.commands.common import (
    INCLUDE_LAST_HELP,
    PATHS_HELP,
    QUIET_HELP,
    SCHEDULER_HELP,
    STEPS_HELP,
    warn_gaps,
)
from fsdpviz.commands.terminal import print_table
from fsdpviz.errors import UsageError
from fsdpviz.formatting import bytes_text

if TYPE_CHECKING:
    from fsdpviz.analysis.summary import ClockSummary, MemorySummary, Summary

EXAMPLE = """
fsdpviz summary runs/run-20250101-120000
fsdpviz summary traces/ --steps 3-5 --json > summary.json
"""



def level_text(mem: MemorySummary) -> str:
    """What the allocated level counts, where it is not the allocator's own level (CPU)."""
    from fsdpviz.analysis.figures import level_words
    from fsdpviz.analysis.memory_categories import LEVEL_SINCE_TRACE_START

    if mem.level == LEVEL_SINCE_TRACE_START:
        return " since the trace began"
    words = level_words(mem.level, mem.baseline_bytes, bytes_text)
    return f" ({words})" if words else ""

def summary(
    paths: Annotated[list[Path], typer.Argument(metavar="PATH...", help=PATHS_HELP, show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON (a stable contract).")] = False,
    steps: Annotated[str | None, typer.Option(
        "--steps", metavar="STEPS", help=STEPS_HELP, show_default=False)] = None,
    include_last_step: Annotated[bool, typer.Option("--include-last-step", help=INCLUDE_LAST_HELP)] = False,
    cache: Annotated[bool, typer.Option(
        "--cache/--no-cache", help="Reuse parsed traces and the summary cached beside them.")] = True,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help=QUIET_HELP)] = False,
    scheduler: Annotated[str | None, typer.Option("--scheduler", metavar="ADDRESS", help=SCHEDULER_HELP,
                                                  show_default=False)] = None,
) -> None:
    """Print a run's headline numbers, as tables or as JSON.

    Step time, communication overlap, memory peaks, per-unit times and the top findings."""
    from fsdpviz.cache import store_for, summary_json_text

    wanted = parse_steps(steps)
    store = store_for(paths, steps=wanted, include_last_step=include_last_step, cache=cache)
    cached = store.read() if store is not None else None
    if cached is not None:  # the same inputs and code answered before: a read (fsdpviz/cache.py)
        for line in cached.warnings:
            print(f"warning: {line}", file=sys.stderr, flush=True)
        if as_json:
            sys.stdout.write(cached.json_text)
            return
        print_summary(cached.summary)
        return
    from fsdpviz.analysis.pipeline import analyse

    result = analyse(paths, steps=wanted, include_last_step=include_last_step, cache=cache,
                     progress=False if quiet else None, scheduler=scheduler)
    from fsdpviz.whatif.gains import completed_summary

    summary_of_run = completed_summary(result)
    warn_gaps(result.traces)  # after the analysis: bad input stays one error line
    if store is not None:
        from fsdpviz.cache import keep

        keep(result, store)
    if as_json:
        sys.stdout.write(summary_json_text(summary_of_run))
        return
    print_summary(summary_of_run)


def clock_text(clock: ClockSummary) -> str:
    """``replayed without the profiler: ...`` or ``traced: why`` (the report's headline says the same)."""
    from fsdpviz.analysis.figures import clock_words

    return clock_words(clock)


def parse_steps(text: str | None) -> list[int] | None:
    """``"3,4"`` / ``"3-5"`` / ``"3-5,8"`` -> sorted step numbers; None when not given."""
    return parse_numbers(text, "--steps")


def parse_numbers(text: str | None, option: str) -> list[int] | None:
    """``"3,4"`` / ``"3-5"`` / ``"3-5,8"`` -> sorted numbers (steps, ranks); None when not given."""
    if text is None or not text.strip():
        return None
    steps: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        try:
            first, _, last = part.partition("-")
            lo, hi = int(first), int(last or first)
            if hi < lo:
                raise ValueError(part)
        except ValueError:
            raise UsageError(f"{option}: cannot read {part!r}; use numbers and ranges like 3,4 or 3-5") from None
        steps.update(range(lo, hi + 1))
    return sorted(steps)


def _fmt(value: Any, unit: str = "", digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    return f"{value:,}{unit}"


def step_time_text(summary: Summary) -> str:
    """The headline's step time: the unprofiled steps' (timers) and what the profiler cost, or the
    traced steps' where the timers do not tell."""
    cost = summary.profiler
    if cost is None or not cost.headline:  # the notes say why, when the timers measured something
        return f"{_fmt(summary.step_time_ms, ' ms')} (as traced)" if summary.step_time_ms is not None else "-"
    return (f"{_fmt(cost.unprofiled_step_ms, ' ms')} (timers, unprofiled steps); the profiled steps ran "
            f"{cost.slowdown:.2f}x as long ({_fmt(cost.profiled_step_ms, ' ms')})")


def bound_text(summary: Summary) -> str:
    """``compute-bound, 36.4 ms (71 % of the step): compute 36.4 ms (71 %), FSDP per-unit work 8.65 ms
    (17 %), ... of the 51.3 ms unprofiled GPU step`` (the report's headline says the same)."""
    from fsdpviz.analysis.figures import bound_words

    if summary.bound is None:
        return "-"
    words = bound_words(summary.bound)
    return f"{words.verdict}" + (f"; time {words.time}-bound" if words.time else "") + f": {words.parts}"


def print_summary(summary: Summary, *, stderr: bool = False) -> None:
    """Render the summary as rich tables on stdout (``stderr``: on stderr, as ``record`` does, so that the
    recorded command's stdout stays its own)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from fsdpviz.structure.parallelism import parallelism_text
    from fsdpviz.structure.purposes import PURPOSE_TITLES

    console = Console(stderr=stderr)
    steps = summary.steps
    step_text = f"{steps[0]}-{steps[-1]}" if len(steps) > 2 else ", ".join(map(str, steps)) or "whole trace"
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    if summary.run_dir:
        head.add_row("run folder", escape(summary.run_dir))
    else:
        head.add_row("input", escape(", ".join(summary.sources)))
    head.add_row("framework", summary.framework)
    head.add_row("ranks", f"{len(summary.ranks)} loaded of world size {summary.world_size}")
    head.add_row("parallelism", parallelism_text(summary.parallelism))
    head.add_row("steps analysed", step_text)
    head.add_row("step time", step_time_text(summary))
    if summary.clock is not None:
        head.add_row("clock", escape(clock_text(summary.clock)))
    head.add_row("bound", escape(bound_text(summary)))
    ov = summary.overlap
    head.add_row("overlap", f"{_fmt(ov.overlap_pct, ' %')} of communication hidden behind compute "
                            f"({summary.device.upper()} definition)")
    traced_ov = ov.as_traced
    exposed = _fmt(summary.exposed_comm_ms, " ms")
    as_traced = _fmt(traced_ov.exposed_comm_ms if traced_ov is not None else ov.exposed_comm_ms, " ms")
    head.add_row("exposed comm", f"{exposed} per step" + ("" if exposed == as_traced else f" ({as_traced} as traced)"))
    mem = summary.memory
    reserved = (f"{bytes_text(mem.peak_reserved_bytes)} reserved" if mem.peak_reserved_bytes is not None
                else "reserved not tracked on CPU" if mem.device == "cpu" else "reserved unknown")
    head.add_row("peak memory", f"{bytes_text(mem.peak_allocated_bytes)} allocated{level_text(mem)}, {reserved}")
    if mem.categories and mem.categories_at is not None:
        from fsdpviz.analysis.figures import peak_place
        from fsdpviz.analysis.memory_categories import CATEGORIES, TITLES

        at = mem.categories_at
        where = peak_place(mem)
        cats = mem.categories
        parts = [f"{TITLES[c]} {bytes_text(cats[c])}" for c in CATEGORIES if cats[c] is None or (cats[c] or 0) > 0]
        head.add_row("at the peak", escape(f"({where}) " + ", ".join(parts)))  # `where` names a unit: `[a, b]`
        for category, why in at.unknown.items():
            head.add_row("", escape(f"{TITLES[category]} unknown: {why}"))
    if mem.not_seen_freed is not None:
        from fsdpviz.analysis.figures import not_seen_freed_text

        head.add_row("not seen freed", escape(not_seen_freed_text(mem)))
    console.print(head)

    def per_rank() -> Table:
        title = ("per rank (ms per step, on the run's clock: the bound's parts; idle = host wait + other idle)"
                 if summary.bound is not None else "per rank (ms per analysed step, as traced)")
        if len(ov.per_rank) > 1:  # not each column's median: overlap % is of the run's figures, the peak the highest
            title += "; all: the run's figures, as above"
        table = Table(title=title, title_justify="left")
        for col in ("rank", "comm", "compute", "FSDP work", "overlap %", "exposed", "idle", "peak alloc"):
            table.add_column(col, justify="right", no_wrap=True)
        return table

    rank_rows = []
    for rank, row in ov.per_rank.items():
        peak = mem.per_rank.get(rank)
        rank_rows.append([rank, _fmt(row.comm_ms), _fmt(row.compute_ms), _fmt(row.fsdp_overhead_ms),
                          _fmt(row.overlap_pct), _fmt(row.exposed_comm_ms), _fmt(row.idle_ms),
                          bytes_text(peak.peak_allocated_bytes if peak is not None else None)])
    if len(ov.per_rank) > 1:
        rank_rows.append(["all", _fmt(ov.comm_ms), _fmt(ov.compute_ms), _fmt(ov.fsdp_overhead_ms), _fmt(ov.overlap_pct),
                          _fmt(ov.exposed_comm_ms), _fmt(ov.idle_ms), bytes_text(mem.peak_allocated_bytes)])
    print_table(console, per_rank, rank_rows, name_column=None,
                row_styles=[None] * len(ov.per_rank) + ["bold"] * (len(rank_rows) - len(ov.per_rank)))
    if ov.by_purpose:
        def by_purpose() -> Table:
            purposes = Table(title="communication by purpose (ms per step: each rank's mean, median over ranks)", title_justify="left")
            for col in ("purpose", "comm", "exposed"):
                purposes.add_column(col, justify="right" if col != "purpose" else "left", no_wrap=True)
            return purposes

        print_table(console, by_purpose, [[PURPOSE_TITLES.get(name, name), _fmt(used.comm_ms), _fmt(used.exposed_ms)]
                                          for name, used in ov.by_purpose.items()])

    if summary.units:
        # the units' figures on the run's clock, as units[] in --json, the report's table, compare and
        # whatif give them; the timers' own clock of each pass is in --json and the report, named so
        title = ("per FSDP unit (ms per step, on the run's clock; each column the median of its own per-step figure, "
                 "so exposed can exceed gather + reduce where a wait lands in another collective each step)")
        if summary.device != "cpu":
            from fsdpviz.analysis.bound import BASIS_UNPROFILED

            b = summary.bound
            moved = b is not None and b.basis == BASIS_UNPROFILED and min(b.host_scale, b.idle_scale) < 1.0
            title += ("; a GPU pass from its first kernel to its last, the gaps " +
                      ("less the profiler's share" if moved else "as traced"))
        if any(u.host_wait_ms for u in summary.units):
            title += "; waited on host: the GPU waiting on the unit's host work, FSDP's hooks included"
        if any(u.param_scope == "local" for u in summary.units):
            title += "; params per rank after tensor parallelism"
        if summary.units_source and "trace" in summary.units_source:
            title += "; params from the all-gathers in the trace (padded, gathered dtype)"

        def per_unit() -> Table:
            units = Table(title=title, title_justify="left")
            # a unit's wait on the host counts FSDP's hooks, which the bound puts in FSDP's per-unit work, not in
            # its host wait: a name of its own
            for col in ("unit", "params", "gather", "forward", "backward", "reduce", "exposed", "waited on host"):
                units.add_column(col, justify="right" if col != "unit" else "left", no_wrap=True)
            return units

        unit_rows = []
        for u in summary.units:
            unit_rows.append([u.name, _fmt(u.param_numel), _fmt(u.all_gather_ms), _fmt(u.forward_ms), _fmt(u.backward_ms),
                              _fmt(u.reduce_scatter_ms), _fmt(u.exposed_comm_ms), _fmt(u.host_wait_ms)])
        print_table(console, per_unit, unit_rows)
    shown = [a for a in summary.actions if not a.folded]
    if shown:
        from fsdpviz.analysis.actions import action_texts

        # A list rather than a table: actions are sentences, and a table squeezes them into slivers.
        console.print("[italic]actions (the bound first; then the advised ones and the others, each by time lost per "
                      "step; the profiler's cost, which the run does not pay, last)[/italic]")
        for a, text in zip(shown, action_texts(shown), strict=True):
            console.print(f"  {_fmt(a.lost_ms_per_step):>8} ms  {escape(text)}", highlight=False)
        folded = len(summary.actions) - len(shown)
        if folded:
            console.print(f"[dim]{folded} more action(s) and all {len(summary.findings)} finding(s) in --json and "
                          "the report[/dim]")
    for note in summary.notes:
        console.print(f"[dim]note: {escape(note.text)}[/dim]")
