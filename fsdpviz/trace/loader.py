"""``load_traces``: trace files, folders or a run folder -> one ``TraceSet`` on one clock.

Each rank's file is parsed independently (in parallel processes when there are several and
more than one core), or read back from the Parquet cache beside it when unchanged; the per-rank
tables are then concatenated in rank order (``frames``). Two files claiming the same rank are an
error that names both, because merging them would silently double every number.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fsdpviz.errors import DuplicateRankError, TraceError
from fsdpviz.trace import frames
from fsdpviz.trace.dask_engine import ENV_SCHEDULER
from fsdpviz.trace.kineto import RankColumns
from fsdpviz.trace.sources import read_timers, resolve_sources, units_from_run
from fsdpviz.trace.tables import TraceSet
from fsdpviz.trace.workers import parse_all


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
        jobs: parallel parser processes; None = one per file up to the number of CPUs.
        scheduler: a Dask scheduler address (``tcp://host:8786``): parse on that cluster's workers
            instead (they must see the same paths); None = ``FSDPVIZ_SCHEDULER`` if set, else local.

    Raises:
        TraceError, DuplicateRankError, RunFolderError, UsageError (all FsdpvizError).
    """
    sources = resolve_sources(paths)
    use_cache = cache and os.environ.get("FSDPVIZ_NO_CACHE", "") not in ("1", "true", "yes")
    # Importing pandas takes a good part of a second: do it while the workers parse.
    meanwhile = _import_pandas if "pandas" not in sys.modules else None
    address = scheduler or os.environ.get(ENV_SCHEDULER, "").strip() or None
    parsed = parse_all(
        sources.files, cache=use_cache, progress=progress, jobs=jobs, skippable=sources.scanned,
        meanwhile=meanwhile, scheduler=address,
    )
    kept = [(t, f) for ts, f in zip(parsed, sources.files) if ts is not None for t in ts]
    skipped = [str(f) for t, f in zip(parsed, sources.files) if t is None]
    if not kept:
        folder = sources.files[0].parent
        raise TraceError(folder, f"folder holds no Kineto traces ({len(skipped)} JSON file(s) of another kind)")
    per_rank = _check_unique_ranks([t for t, _ in kept], [f for _, f in kept])
    del parsed, kept
    return TraceSet(
        events=frames.events_frame(per_rank),
        lanes=frames.lanes_frame(per_rank),
        steps=frames.steps_frame(per_rank),
        memory=frames.memory_frame(per_rank),
        ranks=frames.ranks_frame(per_rank),
        timers=read_timers(sources.timer_files),
        units=units_from_run(sources.run),
        run=sources.run,
        run_dir=str(sources.run_dir) if sources.run_dir is not None else None,
        sources=list(dict.fromkeys(str(t.rank["path"]) for t in per_rank)),  # an export holds several ranks
        skipped=skipped,
    )


def _import_pandas() -> None:
    import pandas  # noqa: F401


def _check_unique_ranks(per_file: list[RankColumns], files: list[Path]) -> list[RankColumns]:
    seen: dict[int, Path] = {}
    for tables, path in zip(per_file, files):
        rank = tables.rank_id
        if rank in seen:
            raise DuplicateRankError(rank, seen[rank], path)
        seen[rank] = path
    return sorted(per_file, key=lambda t: t.rank_id)
