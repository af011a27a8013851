"""The work done for one trace file wherever it is parsed: a local worker process or a Dask worker.

:func:`parse_file` parses a file (or reads it back from the Parquet cache) and answers one
:class:`ParsedRank` per rank the file holds; given a per-rank function it also reduces each rank
there, so that only the reduction and the rank's tables without events travel back. Errors in the
user's input come back as a :class:`Failure` (plain data: exceptions with their own ``__init__``
signatures do not survive pickling) and are raised again by :func:`unwrap` in the caller's process.
:mod:`fsdpviz.trace.workers` (local processes) and :mod:`fsdpviz.trace.dask_engine` (a cluster) both
run this module's :func:`parse_file`; neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fsdpviz.errors import FsdpvizError, TraceError
from fsdpviz.trace.cache import load_cached, store_cached
from fsdpviz.trace.decode import NotKinetoError
from fsdpviz.trace.digest import light_columns
from fsdpviz.trace.kineto import RankColumns, parse_trace_ranks
from fsdpviz.trace.schema import string_storage

PerRank = Callable[[RankColumns], Any]
"""A function run on each rank's tables where they are parsed (``parse_all(per_rank=...)``)."""


@dataclass(frozen=True, slots=True)
class ParsedRank:
    """One rank of a parsed file: its tables, and what the per-rank function made of them.

    Without a per-rank function ``columns`` holds every table and ``mapped`` is None; with one,
    ``columns`` holds the tables without events (``trace.digest.light_columns``) and ``mapped`` the
    function's answer."""

    columns: RankColumns
    mapped: Any = None


@dataclass(frozen=True, slots=True)
class Failure:
    """A user-input error from a worker, carried back as plain data."""

    message: str
    path: str = ""
    problem: str = ""
    not_kineto: bool = False

    def exception(self) -> FsdpvizError:
        """The error to raise in the caller's process."""
        if self.not_kineto:
            return NotKinetoError(self.path, self.problem)
        if self.path:
            return TraceError(self.path, self.problem)
        return FsdpvizError(self.message)


def _parse_and_store(path: Path, use_cache: bool) -> list[RankColumns] | Failure:
    try:
        tables = parse_trace_ranks(path)
    except TraceError as exc:
        return Failure(str(exc), exc.path, exc.problem, isinstance(exc, NotKinetoError))
    except FsdpvizError as exc:
        return Failure(str(exc))
    if use_cache and len(tables) == 1:  # a multi-rank export is re-read (the cache holds one rank per file)
        store_cached(path, tables[0])
    return tables


def parse_file(path_text: str, use_cache: bool, per_rank: PerRank | None = None) -> list[ParsedRank] | Failure:
    """The ranks of one trace file, parsed (the cache entry written beside it when ``use_cache``).

    With ``per_rank``, the cache is read here too (the caller then never holds a rank's events) and
    each rank is reduced by it here; its error comes back as a :class:`Failure`."""
    path = Path(path_text)
    if per_rank is None:
        parsed = _parse_and_store(path, use_cache)
        return parsed if isinstance(parsed, Failure) else [ParsedRank(t) for t in parsed]
    cached = load_cached(path) if use_cache else None
    tables_of = [cached] if cached is not None else _parse_and_store(path, use_cache)
    if isinstance(tables_of, Failure):
        return tables_of
    out = []
    with string_storage():  # the rank's tables are built and analysed here, on a process maybe not ours
        while tables_of:  # one rank's events at a time
            tables = tables_of.pop(0)
            light = light_columns(tables)
            try:
                out.append(ParsedRank(light, per_rank(tables)))
            except FsdpvizError as exc:
                return Failure(str(exc))
            del tables
    return out


def unwrap(result: list[ParsedRank] | Failure, skippable: bool) -> list[ParsedRank] | None:
    """A file's ranks, or None for a JSON file that is not a Kineto trace and may be skipped (found
    by scanning a folder); any other failure raised."""
    if isinstance(result, Failure):
        if result.not_kineto and skippable:
            return None
        raise result.exception()
    return result
