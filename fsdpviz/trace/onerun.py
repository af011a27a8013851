"""What the loader keeps of the files it found: the traces of one run, not fsdpviz's own exports.

Two things in a folder look like traces of a run and are not:

- **fsdpviz's own Perfetto export** (``fsdpviz export --format perfetto -o run.json.gz``): it holds
  every rank of a run, read back from it. Found by scanning a folder beside that run's traces (or
  the trace files it was made of), it would count every rank twice or summarise one run as another.
  So a folder's exports are skipped and named (:attr:`TraceSet.skipped_exports`); an export named
  as a file is read as the run it holds.
- **traces of another recording**: rank 0 of one run next to rank 1 of another reads as one run
  whose ranks disagree (a "straggler" that is only another run). ``fsdpviz record`` writes a run id
  into every trace (``fsdpvizRunId``) and into run.json (``run_id``); traces whose ids differ, or
  differ from their run folder's, are refused with one line naming which files belong to which run.
  Traces without an id (recorded without fsdpviz, or by an older fsdpviz) are not judged: unknown is
  not different.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from fsdpviz.errors import TraceError, UsageError
from fsdpviz.runfolder import RunInfo, RunJsonError, decode_run_json
from fsdpviz.trace.kineto import EXPORT_RUN, EXPORT_TIMERS, EXPORT_TORN, RankColumns

MAX_NAMED: Final = 3  # files named per run in the error line


def is_export(ranks: Sequence[RankColumns]) -> bool:
    """Whether a file's parsed ranks come from an fsdpviz Perfetto export."""
    return bool(ranks) and all(bool(r.rank.get("fsdpviz_export")) for r in ranks)


def check_export_has_events(ranks: Sequence[RankColumns]) -> None:
    """TraceError when an export holds none of the events fsdpviz reads (``--no-raw``: unit tracks and
    memory counters only), instead of the analysis' "no events" for a trace that has no steps."""
    if is_export(ranks) and not any(int(r.rank["n_events"]) for r in ranks):
        raise TraceError(Path(str(ranks[0].rank["path"])),
                         "an export written with --no-raw holds the FSDP unit tracks and memory counters, not "
                         "the events fsdpviz reads; export again without --no-raw to read it back")


def exported_run(ranks: Sequence[RankColumns]) -> tuple[RunInfo, list[dict[str, Any]], list[str]] | None:
    """run.json, the timer records (TIMERS rows) and the timer files whose torn last line was left out
    (``TraceSet.torn_timers``) that an export carried from its run folder (report/perfetto.py), when every
    rank read is from an export that has them; else None (a trace, or an export of traces without a run
    folder). A damaged one is a TraceError naming the file."""
    from fsdpviz.trace.sources import timer_row

    if not is_export(ranks):
        return None
    carrier = next((r for r in ranks if r.rank.get(EXPORT_RUN)), None)
    if carrier is None:
        return None
    path = Path(str(carrier.rank["path"]))
    try:
        run = decode_run_json(str(carrier.rank[EXPORT_RUN]).encode())
        rows = [timer_row(rec) for r in ranks for rec in json.loads(str(r.rank.get(EXPORT_TIMERS) or "[]"))]
        torn = [json.loads(str(r.rank.get(EXPORT_TORN) or "[]")) for r in ranks]
        if not all(isinstance(of, list) and all(isinstance(name, str) for name in of) for of in torn):
            raise ValueError("its list of torn timer files is not a list of names")
    except (RunJsonError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise TraceError(path, f"the run folder's facts in this export cannot be read ({exc})") from None
    return run, rows, list(dict.fromkeys(name for of in torn for name in of))


def exports_only_error(folder: Path, exports: Sequence[str]) -> TraceError:
    """The error for a folder whose only traces are fsdpviz exports: name the file to read one."""
    first = exports[0]
    return TraceError(folder, f"folder holds no traces, only fsdpviz's own export(s) ({', '.join(exports)}); "
                              f"to read an export back, name the file: fsdpviz summary {first}")


def check_one_run(files: Sequence[tuple[RankColumns, Path]], run: RunInfo | None,
                  run_dir: Path | None) -> None:
    """UsageError when the traces carry different run ids, or ids other than their run folder's."""
    by_id: dict[str, list[str]] = {}
    for columns, path in files:
        run_id = str(columns.rank.get("run_id") or "")
        if run_id:
            by_id.setdefault(run_id, []).append(path.name if run_dir is not None else str(path))
    folder_id = run.run_id if run is not None else ""
    if len(by_id) <= 1 and (not folder_id or not by_id or folder_id in by_id):
        return
    groups = []
    for run_id, names in by_id.items():
        listed = ", ".join(names[:MAX_NAMED]) + (f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED
                                                 else "")
        mark = " (run.json's)" if run_id == folder_id else ""
        groups.append(f"run {run_id}{mark}: {listed}")
    where = f"{run_dir}: " if run_dir is not None else ""
    if len(by_id) == 1:
        raise UsageError(f"{where}traces of another recording than run.json's (run {folder_id}): "
                         f"{groups[0]}; record again into an empty folder, or load the traces on their own")
    raise UsageError(f"{where}traces of {len(by_id)} different recordings in one input ({'; '.join(groups)}); "
                     "load one run's traces at a time")
