"""``load_traces``: trace files, folders or a run folder -> one ``TraceSet`` on one clock.

Each rank's file is parsed independently (in parallel processes when there are several and
more than one core), or read back from the Parquet cache beside it when unchanged; the per-rank
tables are then concatenated in rank order (``frames``). Two files claiming the same rank are an
error that names both, because merging them would silently double every number.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from fsdpviz.errors import DuplicateRankError, TraceError
from fsdpviz.runfolder import RunInfo
from fsdpviz.trace import frames, schema
from fsdpviz.trace.dask_engine import ENV_SCHEDULER
from fsdpviz.trace.kineto import RankColumns
from fsdpviz.trace.onerun import (
    check_export_has_events,
    check_one_run,
    exported_run,
    exports_only_error,
    is_export,
)
from fsdpviz.trace.parse_task import PerRank
from fsdpviz.trace.sources import (
    below_hint,
    estimated_events,
    read_timers,
    resolve_sources,
    timers_frame,
    units_from_run,
)
from fsdpviz.trace.tables import TraceSet
from fsdpviz.trace.unit_names import renamed_timers, traced_names
from fsdpviz.trace.workers import parse_all

if TYPE_CHECKING:
    import pandas as pd

KEEP_EVENTS_ENV: Final = "FSDPVIZ_KEEP_EVENTS"
KEEP_EVENTS_MAX: Final = 4_000_000  # trace events a run loaded whole may have (docs/scale.md)


def keeps_events(files: Sequence[Path]) -> bool:
    """Whether a run of these trace files is loaded whole into this process (its events kept) rather
    than reduced rank by rank where each is parsed: when it has more than one file and about
    ``KEEP_EVENTS_MAX`` events or fewer. Loaded whole, the per-rank analysis runs once over all ranks,
    which costs less CPU (per-rank pandas calls add up); rank by rank, the memory of this process no
    longer grows with the events (both measured in docs/scale.md).
    ``FSDPVIZ_KEEP_EVENTS=1`` / ``0`` decides instead."""
    forced = os.environ.get(KEEP_EVENTS_ENV, "").strip().lower()
    if forced in ("1", "true", "yes"):
        return True
    if forced in ("0", "false", "no"):
        return False
    return len(files) <= 1 or estimated_events(files) <= KEEP_EVENTS_MAX


@dataclass(kw_only=True, slots=True)
class LoadedRun:
    """``load_run``'s answer. ``mapped`` is None when the events were kept (``traces`` is whole);
    else ``traces`` holds every table but the events (and thinned memory, see ``trace.digest``) and
    ``mapped`` what the per-rank function returned for each rank, in rank order."""

    traces: TraceSet
    mapped: list[Any] | None = None


def load_traces(
    paths: Sequence[str | Path],
    *,
    cache: bool = True,
    progress: bool | None = None,
    jobs: int | None = None,
    scheduler: str | None = None,
) -> TraceSet:
    """Load Kineto traces into typed tables.

    Args:
        paths: trace files (``.json``/``.json.gz``), folders of them, or one run folder
            (``run.json`` + ``traces/`` + ``timers/``).
        cache: reuse/write the Parquet cache beside the traces (``.fsdpviz-cache/``); the
            environment variable ``FSDPVIZ_NO_CACHE=1`` turns it off whatever this says.
        progress: show a progress bar on stderr; None = only when stderr is a terminal and
            loading takes more than a moment.
        jobs: parallel parser processes; None = one per file up to the number of CPUs, but none (parsed
            here) for a small run where this process has nothing to do meanwhile
            (``fsdpviz.trace.workers.SMALL_PARSE_EVENTS``).
        scheduler: a Dask scheduler address (``tcp://host:8786``): parse on that cluster's workers
            instead (they must see the same paths); None = ``FSDPVIZ_SCHEDULER`` if set, else local.

    Raises:
        TraceError, DuplicateRankError, RunFolderError, UsageError (all FsdpvizError).
    """
    return load_run(paths, cache=cache, progress=progress, jobs=jobs, scheduler=scheduler).traces


def load_run(
    paths: Sequence[str | Path],
    *,
    cache: bool = True,
    progress: bool | None = None,
    jobs: int | None = None,
    scheduler: str | None = None,
    per_rank: Callable[[RunInfo | None], PerRank] | None = None,
    meanwhile: Callable[[], None] | None = None,
) -> LoadedRun:
    """:func:`load_traces`, or, given ``per_rank`` and a run too large to keep whole
    (:func:`keeps_events`), each rank reduced by ``per_rank(run.json)`` where it is parsed.
    ``meanwhile``: the caller's slow start-up work, run while the traces are parsed (after pandas is
    imported, which is done then too); not run when every trace comes from the cache."""
    sources = resolve_sources(paths)
    use_cache = _use_cache(cache)
    address = scheduler or os.environ.get(ENV_SCHEDULER, "").strip() or None
    mapping = per_rank is not None and not keeps_events(sources.files)
    mapper = per_rank(sources.run) if mapping and per_rank is not None else None
    parsed = parse_all(
        sources.files, cache=use_cache, progress=progress, jobs=jobs, skippable=sources.scanned,
        meanwhile=_start_up(meanwhile), scheduler=address, per_rank=mapper,
    )
    # a folder's fsdpviz exports hold the ranks of a run again: skipped, and said (trace.onerun)
    exports = [str(f) for rs, f in zip(parsed, sources.files)
               if rs is not None and f in sources.scanned and is_export([r.columns for r in rs])]
    kept = [(r, f) for rs, f in zip(parsed, sources.files) if rs is not None and str(f) not in exports for r in rs]
    skipped = [str(f) for rs, f in zip(parsed, sources.files) if rs is None]
    if not kept:
        folder = sources.files[0].parent
        if exports:
            raise exports_only_error(folder, exports)
        raise TraceError(folder, f"folder holds no Kineto traces ({len(skipped)} JSON file(s) of another kind)"
                         + below_hint(folder))
    check_one_run([(r.columns, f) for r, f in kept], sources.run, sources.run_dir)
    for rs, f in zip(parsed, sources.files):
        if rs is not None and str(f) not in exports:
            check_export_has_events([r.columns for r in rs])
    per_file = _check_unique_ranks([r.columns for r, _ in kept], [f for _, f in kept])
    mapped: list[Any] | None = None
    if mapping:
        by_rank = {r.columns.rank_id: r.mapped for r, _ in kept}
        mapped = [by_rank[t.rank_id] for t in per_file]
    del parsed, kept
    schema.use_string_storage()  # here, not earlier: pandas is imported while the traces are parsed
    torn: list[str] = []
    run, timers = sources.run, read_timers(sources.timer_files, torn)
    # An export read back is the run it came from: its run.json and timers travel in it. Not for a run
    # reduced rank by rank, whose ranks were analysed before the file said so (per_rank's run.json).
    exported = exported_run(per_file) if run is None and mapped is None else None
    if exported is not None:
        run, timers, torn = exported[0], timers_frame(exported[1]), exported[2]
    # a unit of several modules is one unit, under the trace's spelling of it (trace/unit_names.py)
    run, renamed = traced_names(run, (n for t in per_file for n in t.categories.get("name", [])))
    timers = renamed_timers(timers, renamed)
    traces = _trace_set(per_file, timers=timers, units=units_from_run(run),
                        run=run, run_dir=str(sources.run_dir) if sources.run_dir is not None else None,
                        skipped=skipped)
    traces.skipped_exports = exports
    traces.torn_timers = torn
    return LoadedRun(traces=traces, mapped=mapped)


def load_ranks(traces: TraceSet, ranks: Sequence[int], *, cache: bool = True,
               progress: bool | None = None) -> TraceSet:
    """Every table of ``ranks`` of a run loaded without its events (``load_run``'s ``mapped`` case),
    read again from their trace files (or the cache beside them) into a TraceSet of those ranks."""
    wanted = set(ranks)
    paths = traces.ranks.loc[traces.ranks["rank"].isin(list(wanted)), "path"].astype(str)
    files = [Path(p) for p in dict.fromkeys(paths)]
    parsed = parse_all(files, cache=_use_cache(cache), progress=progress, jobs=None)
    per_rank = [r.columns for rs in parsed if rs is not None for r in rs if r.columns.rank_id in wanted]
    out = _trace_set(sorted(per_rank, key=lambda t: t.rank_id), timers=traces.timers, units=traces.units,
                     run=traces.run, run_dir=traces.run_dir, skipped=list(traces.skipped))
    out.skipped_exports = list(traces.skipped_exports)
    out.torn_timers = list(traces.torn_timers)
    return out


def _use_cache(cache: bool) -> bool:
    return cache and os.environ.get("FSDPVIZ_NO_CACHE", "") not in ("1", "true", "yes")


def _trace_set(per_rank: list[RankColumns], *, timers: pd.DataFrame, units: pd.DataFrame, run: RunInfo | None,
               run_dir: str | None, skipped: list[str]) -> TraceSet:
    return TraceSet(
        events=frames.events_frame(per_rank),
        lanes=frames.lanes_frame(per_rank),
        steps=frames.steps_frame(per_rank),
        memory=frames.memory_frame(per_rank, run),
        ranks=frames.ranks_frame(per_rank),
        timers=timers,
        units=units,
        run=run,
        run_dir=run_dir,
        sources=list(dict.fromkeys(str(t.rank["path"]) for t in per_rank)),  # an export holds several ranks
        skipped=skipped,
    )


def _start_up(then: Callable[[], None] | None) -> Callable[[], None] | None:
    """What the parent does while the workers parse: importing pandas takes a good part of a second
    (when not yet imported), then the caller's own start-up."""
    if "pandas" in sys.modules and then is None:
        return None

    def start_up() -> None:
        import pandas  # noqa: F401

        if then is not None:
            then()

    return start_up


def _check_unique_ranks(per_file: list[RankColumns], files: list[Path]) -> list[RankColumns]:
    seen: dict[int, Path] = {}
    for tables, path in zip(per_file, files):
        rank = tables.rank_id
        if rank in seen:
            raise DuplicateRankError(rank, seen[rank], path)
        seen[rank] = path
    return sorted(per_file, key=lambda t: t.rank_id)
