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

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from fsdpviz.errors import TraceError, UsageError
from fsdpviz.runfolder import RunInfo
from fsdpviz.trace.kineto import RankColumns

MAX_NAMED: Final = 3  # files named per run in the error line


def is_export(ranks: Sequence[RankColumns]) -> bool:
    """Whether a file's parsed ranks come from an fsdpviz Perfetto export."""
    return bool(ranks) and all(bool(r.rank.get("fsdpviz_export")) for r in ranks)


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
