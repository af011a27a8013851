"""Parse many trace files: cache first, then the rest in parallel processes, with progress.

One rank's file is independent of the others, so files are parsed in separate processes (msgspec
decoding and the table building are CPU-bound and hold the GIL). Workers are forked (cheap: the
parser is already imported) before any progress thread starts; a parent that already runs other
threads gets a ``forkserver`` instead, since forking a threaded process can deadlock. Workers
write the cache entry themselves so that it is written in parallel too, and send back flat numpy
columns (``RankColumns``), not DataFrames: they never import pandas, and while they parse, the
parent can import it (``meanwhile``), so that a command's start-up overlaps the parsing. A single
file is parsed in a worker for that reason only; otherwise it is parsed in the calling process, and so
is a small run where the parent has nothing to overlap (:data:`SMALL_PARSE_EVENTS`).

Progress appears on stderr only when loading takes longer than ``PROGRESS_DELAY_S`` and stderr is
a terminal, and disappears when done; asked for explicitly on a non-terminal, it is one plain line
per parsed file.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from fsdpviz.trace.cache import load_cached
from fsdpviz.trace.parse_task import ParsedRank, PerRank, parse_file, unwrap
from fsdpviz.trace.sources import estimated_events

PROGRESS_DELAY_S: Final = 0.5
# Files of this many trace events or fewer in all (estimated from their sizes) are parsed in the calling
# process where it has nothing to overlap with the workers (:func:`_job_count`): up to about 0.2 s of
# parsing, which workers would share for less than it costs to start them and send their tables back
# (docs/performance.md, "Small runs parsed in the calling process").
SMALL_PARSE_EVENTS: Final = 64_000


def parse_all(
    files: Sequence[Path], *, cache: bool, progress: bool | None, jobs: int | None,
    skippable: frozenset[Path] = frozenset(), meanwhile: Callable[[], None] | None = None,
    scheduler: str | None = None, per_rank: PerRank | None = None,
) -> list[list[ParsedRank] | None]:
    """The ranks of every file, in the order given (one per rank the file holds: one, or several for
    an fsdpviz Perfetto export); None for a file in ``skippable`` (found by scanning a folder) that
    is JSON but not a Kineto trace. Raises the first other file's error.

    ``per_rank``: each rank is reduced by it where the file is parsed (a worker process, a Dask
    worker; :func:`fsdpviz.trace.parse_task.parse_file`): the events never reach this process. ``meanwhile`` is called once while the workers parse (or
    before parsing in this process): the caller's own slow start-up work, e.g. importing pandas,
    overlaps the parsing that way.
    """
    if per_rank is None:
        cached = [load_cached(f) if cache else None for f in files]
        results: list[list[ParsedRank] | None] = [[ParsedRank(c)] if c is not None else None for c in cached]
    else:  # a worker reads the cache itself: the parent never holds a rank's events
        results = [None] * len(files)
    todo = [i for i, r in enumerate(results) if r is None]
    if not todo:
        return results
    if scheduler:
        from fsdpviz.trace.dask_engine import parse_on_cluster

        if meanwhile is not None:
            meanwhile()
        parsed = parse_on_cluster([files[i] for i in todo], scheduler, cache=cache, progress=progress,
                                  skippable=skippable, per_rank=per_rank)
        for i, tables in zip(todo, parsed):
            results[i] = tables
        return results
    n_jobs = _job_count(jobs, len(todo), parent_idle=meanwhile is not None,
                        events=estimated_events([files[i] for i in todo]))
    if n_jobs == 0:
        if meanwhile is not None:
            meanwhile()
        with _progress_display(progress, total=len(todo)) as advance:
            for i in todo:
                advance(files[i].name, 0)
                results[i] = unwrap(parse_file(str(files[i]), cache, per_rank), files[i] in skippable)
                advance(files[i].name, 1)
        return results
    # Submit before the progress thread starts: with "fork" all workers are forked on the first
    # submit, so no other thread exists at that moment.
    with ProcessPoolExecutor(max_workers=n_jobs, mp_context=_mp_context()) as pool:
        futures = {pool.submit(parse_file, str(files[i]), cache, per_rank): i for i in todo}
        if meanwhile is not None:
            meanwhile()
        with _progress_display(progress, total=len(todo)) as advance:
            advance(f"{len(todo)} files", 0)
            for fut in as_completed(futures):
                i = futures[fut]
                results[i] = unwrap(fut.result(), files[i] in skippable)
                advance(files[i].name, 1)
    return results


def _job_count(jobs: int | None, n_files: int, *, parent_idle: bool, events: int) -> int:
    """Worker processes to start; 0 = parse in this process.

    One file is parsed here unless the parent has other work to overlap with it (``parent_idle``)
    and another CPU to do it on: sending the tables back costs little next to parsing, but more
    than nothing. So are files of :data:`SMALL_PARSE_EVENTS` or fewer estimated ``events`` in all
    when the parent has nothing to overlap (a notebook or a command with pandas already imported):
    starting the workers and sending their tables back would cost more than the parsing they share.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    n_jobs = max(1, min(jobs if jobs is not None else cpus, n_files))
    if jobs is None and not parent_idle and events <= SMALL_PARSE_EVENTS:
        return 0
    if n_jobs == 1 and not (jobs is None and parent_idle and cpus > 1):
        return 0
    return n_jobs


def _mp_context() -> mp.context.BaseContext:
    """``fork`` when this process has a single thread (fast: nothing to re-import), else a
    ``forkserver`` (``spawn`` off Linux): forking a threaded process can deadlock."""
    methods = mp.get_all_start_methods()
    # macOS lists fork too, but system frameworks are not fork-safe there.
    if "fork" in methods and sys.platform.startswith("linux") and threading.active_count() == 1:
        return mp.get_context("fork")
    if "forkserver" in methods:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["fsdpviz.trace.kineto"])
        return ctx
    return mp.get_context("spawn")


@contextmanager
def _progress_display(progress: bool | None, *, total: int) -> Iterator:
    """Yield ``advance(label, n)``; a transient rich bar starts after a delay when wanted."""
    tty = sys.stderr.isatty()
    wanted = progress if progress is not None else tty
    if not wanted:
        yield lambda label, n: None
        return
    started = time.monotonic()

    def rate(done: int) -> str:
        return f"{done / max(time.monotonic() - started, 1e-9):.1f} files/s"

    if not tty:  # asked for, but a log file or pipe: plain lines, no cursor tricks
        done = [0]

        def line(label: str, n: int) -> None:
            if n:
                done[0] += n
                print(f"fsdpviz: parsed {label} ({done[0]}/{total}, {rate(done[0])})", file=sys.stderr, flush=True)

        yield line
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(
        SpinnerColumn(),
        TextColumn("loading traces"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.description}"),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task("", total=total, rate="")
    finished = [0]
    lock = threading.Lock()
    state = {"started": False, "done": False}

    def start() -> None:
        with lock:
            if not state["done"]:
                bar.start()
                state["started"] = True

    timer = threading.Timer(0.0 if progress else PROGRESS_DELAY_S, start)
    timer.daemon = True
    timer.start()
    try:
        def advance(label: str, n: int) -> None:
            finished[0] += n
            bar.update(task, advance=n, description=label, rate=rate(finished[0]) if finished[0] else "")

        yield advance
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["started"]:
                bar.stop()
