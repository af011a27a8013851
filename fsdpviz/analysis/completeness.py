"""What a loaded run lacks: ranks of the world without a trace, events the loader had to skip,
communication between its ranks.

Neither stops the analysis -- the numbers cover what is there -- but both change what the numbers
mean: an overlap measured on ranks 0-5 of 8 says nothing about the two missing ranks, and a trace
with thousands of unreadable events may be missing the work that mattered. So the summary lists
them in its ``notes`` (and ``missing_ranks`` / ``skipped_events``), and every command that reads
traces also prints them as ``warning:`` lines on stderr (``gap_warnings``).

Missing ranks, and ranks that never communicated, are a warning when the user pointed at a whole
run (a run folder, or traces of several ranks); one trace file of a larger job is how many people
profile (rank 0 only), so there it is only a note.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsdpviz.structure.framework import unconnected_ranks_note
from fsdpviz.structure.records import MISSING_RANKS, SKIPPED_EVENTS, SKIPPED_EXPORTS, TORN_TIMERS, Note
from fsdpviz.trace.tables import TraceSet

MAX_LISTED_FILES = 3  # skipped events: files named in the one warning line


def format_ranks(ranks: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    parts: list[str] = []
    run: list[int] = []
    for rank in sorted(set(ranks)):
        if run and rank == run[-1] + 1:
            run.append(rank)
            continue
        if run:
            parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [rank]
    if run:
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(parts)


def missing_ranks_note(traces: TraceSet) -> Note | None:
    """One sentence naming the ranks of the world without a trace, None when none are missing."""
    missing = traces.missing_ranks
    if not missing:
        return None
    return Note(MISSING_RANKS, f"{traces.describe_sources()}: no trace for rank(s) {format_ranks(missing)} of world "
                f"size {traces.world_size}; the numbers cover rank(s) {format_ranks(traces.rank_ids)} only")


def skipped_events_note(traces: TraceSet) -> Note | None:
    """One sentence counting the events the loader skipped, per file, None when it skipped none."""
    skipped = traces.skipped_events
    if not skipped:
        return None
    listed = _listed([f"{traces.source_of(rank)} ({n:,})" for rank, n in sorted(skipped.items())], " file(s)")
    return Note(SKIPPED_EVENTS, f"skipped {sum(skipped.values()):,} event(s) fsdpviz cannot use (unknown phase or "
                f"category, missing, negative or out-of-range times, fields of the wrong type) in {listed}")


def skipped_exports_note(traces: TraceSet) -> Note | None:
    """One sentence naming the fsdpviz exports a folder held, which were not read; None when none."""
    exports = traces.skipped_exports
    if not exports:
        return None
    listed = _listed(exports)
    return Note(SKIPPED_EXPORTS, f"skipped {listed}: fsdpviz's own export of a run (fsdpviz export --format "
                                 "perfetto), not a trace of its own; name the file alone to read it back")


def torn_timers_note(traces: TraceSet) -> Note | None:
    """One sentence naming the timer files whose last line could not be read and was left out (a rank
    stopped while writing it, or the file was cut short); None when none."""
    torn = traces.torn_timers
    if not torn:
        return None
    return Note(TORN_TIMERS, f"left out the last line of {_listed(torn)}: it is not a whole timer record (a rank "
                             "stopped while writing it, or the file was cut short); the lines before it are read")


def _listed(names: list[str], what: str = "") -> str:
    """The first :data:`MAX_LISTED_FILES` of ``names``, and how many more (``what``: their word)."""
    more = len(names) - MAX_LISTED_FILES
    return ", ".join(names[:MAX_LISTED_FILES]) + (f" and {more} more{what}" if more > 0 else "")


def gap_notes(traces: TraceSet) -> list[Note]:
    """The summary's notes about missing ranks, skipped events and exports, and ranks that never
    communicated."""
    return [n for n in (missing_ranks_note(traces), skipped_events_note(traces), skipped_exports_note(traces),
                        torn_timers_note(traces), unconnected_ranks_note(traces)) if n]


def gap_warnings(traces: TraceSet) -> list[str]:
    """What a command prints as ``warning:`` lines (see the module docstring)."""
    whole_run = traces.run_dir is not None or len(traces.rank_ids) > 1
    notes = [missing_ranks_note(traces) if whole_run else None, skipped_events_note(traces),
             skipped_exports_note(traces), torn_timers_note(traces),
             unconnected_ranks_note(traces) if whole_run else None]
    return [n.text for n in notes if n is not None]
