"""What the user pointed at -> the trace files to read, and the run folder around them if any.

Accepted inputs (any mix, one run at a time):
- trace files: ``*.json``, ``*.json.gz``, ``*.pt.trace.json.gz`` (tensorboard_trace_handler);
- a folder of trace files (not searched recursively: sibling folders are often other runs); JSON
  files in it that are not Kineto traces (configs, notes) are skipped, named in ``TraceSet.skipped``;
- a run folder written by ``fsdpviz record``: ``run.json`` + ``traces/`` (+ ``timers/``).

What the loader then keeps of the files found in folders (fsdpviz's own exports are skipped, traces of
different recordings refused) is :mod:`fsdpviz.trace.onerun`'s to decide.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from fsdpviz.errors import RunFolderError, TraceError, UsageError
from fsdpviz.runfolder import (
    LOGS_DIR,
    RUN_JSON,
    TIMERS_DIR,
    TRACES_DIR,
    RunInfo,
    RunJsonError,
    decode_run_json,
    is_trace_name,
)
from fsdpviz.trace import schema

if TYPE_CHECKING:
    import pandas as pd



@dataclass(kw_only=True, slots=True)
class Sources:
    """Resolved input: trace files in a stable order, and the run folder when there is one."""

    files: list[Path]
    scanned: frozenset[Path] = frozenset()  # files found in folders rather than named by the user
    run_dir: Path | None = None
    run: RunInfo | None = None
    timer_files: list[Path] = field(default_factory=list)


# Bytes of file per trace event, at the low end of what traces hold (fsdpviz's synthetic FSDP2 runs:
# ~18 of gzip; real GPU traces carry more arguments per event): the estimate errs toward more events,
# so toward analysing a run rank by rank.
_BYTES_PER_EVENT: Final = {True: 18, False: 200}


def estimated_events(files: Sequence[Path]) -> int:
    """Trace events in ``files``, estimated from their sizes (gzip or not) without reading them."""
    total = 0.0
    for f in files:
        try:
            total += f.stat().st_size / _BYTES_PER_EVENT[f.name.endswith(".gz")]
        except OSError:
            pass
    return int(total)


def _traces_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and is_trace_name(p))


def below_hint(folder: Path) -> str:
    """``; its subfolder run is a run folder: give that one`` where a folder without traces holds run
    folders (run.json) one level down, as a recording's own folder does beside its script's files."""
    try:
        runs = sorted(p.name for p in folder.iterdir() if p.is_dir() and (p / RUN_JSON).is_file())
        traces = (folder / TRACES_DIR).is_dir() and bool(_traces_in(folder / TRACES_DIR))
    except OSError:
        return ""
    if traces and not runs:  # a run folder whose run.json is gone: its traces can still be read alone
        return (f"; it looks like a run folder without its {RUN_JSON}, whose {TRACES_DIR}/ holds traces: give "
                f"{folder / TRACES_DIR} to read them alone (no timers or recorded settings then)")
    if not runs:
        return ""
    listed = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    return (f"; its subfolder {listed} is a run folder: give that one" if len(runs) == 1
            else f"; its subfolders {listed} are run folders: give one of them")


def check_inputs(paths: Sequence[str | Path]) -> None:
    """Raise the one error line :func:`resolve_sources` would for missing input, before a command says
    it is loading it."""
    if not paths:
        raise UsageError("no input: give trace files, a folder of traces, or a run folder")
    for raw in paths:
        if not Path(raw).exists():
            raise TraceError(Path(raw), "no such file or folder")


def resolve_sources(paths: Sequence[str | Path]) -> Sources:
    """Expand files / folders / a run folder into the list of trace files to load."""
    check_inputs(paths)
    files: list[Path] = []
    scanned: set[Path] = set()
    run_dir: Path | None = None
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            files.append(path)
            continue
        if (path / RUN_JSON).is_file():
            if run_dir is not None:
                raise UsageError(f"{run_dir} and {path} are two run folders: load one run at a time")
            run_dir = path
            traces_dir = path / TRACES_DIR
            found = _traces_in(traces_dir) if traces_dir.is_dir() else []
            if not found:
                raise RunFolderError(no_traces_message(path))
            files.extend(found)
            scanned.update(found)
            continue
        found = _traces_in(path)
        if not found:
            raise TraceError(path, "folder holds no trace files (*.json, *.json.gz)" + below_hint(path))
        files.extend(found)
        scanned.update(found)
    unique = list(dict.fromkeys(p.resolve() for p in files))
    run = read_run_json(run_dir) if run_dir is not None else None
    timers = sorted((run_dir / TIMERS_DIR).glob("*.jsonl")) if run_dir is not None else []
    by_resolved = {p.resolve(): p for p in files}
    ordered = [by_resolved[p] for p in unique]
    named = {Path(raw) for raw in paths}
    return Sources(
        files=ordered,
        scanned=frozenset(p for p in ordered if p in scanned and p not in named),
        run_dir=run_dir,
        run=run,
        timer_files=timers,
    )


def no_traces_message(run_dir: Path) -> str:
    """Why a run folder has no traces, as far as run.json and its logs tell, and where to look."""
    text = f"{run_dir}: run folder has no traces ({TRACES_DIR}/ is empty or missing)"
    try:
        run = read_run_json(run_dir)
    except RunFolderError:
        return text
    timers = sorted((run_dir / TIMERS_DIR).glob("*.jsonl")) if (run_dir / TIMERS_DIR).is_dir() else []
    if run.options.get("mode") == "timers" and run.status == "ok" and timers:
        # the timers-only mode records no trace by design: nothing failed
        return (text + f"; it was recorded with --mode timers (no profiler): its step and phase times are in "
                f"{run_dir / TIMERS_DIR}, and fsdpviz's analyses read a trace: record it again without --mode timers "
                "(or with --mode both)")
    if run.status and run.status != "ok":
        text += f"; the run {run.status}" + (f" ({run.reason})" if run.reason else "")
    elif run.status == "ok" and not run.ranks:
        text += "; the command ran, but no process ran the forward of an FSDP / ZeRO-3 model"
    if run.status and run.status != "ok" and not run.ranks:
        text += " before any process ran the forward of an FSDP / ZeRO-3 model"
    logs = sorted(str(p) for p in (run_dir / LOGS_DIR).glob("*.log")) if (run_dir / LOGS_DIR).is_dir() else []
    pointers = [f"{run_dir / RUN_JSON} (status, reason, ranks)"]
    if logs:
        pointers.append(", ".join(logs[:3]) + (f" and {len(logs) - 3} more" if len(logs) > 3 else ""))
    return text + "; see " + " and ".join(pointers)


def read_run_json(run_dir: Path) -> RunInfo:
    """Parse ``run.json``; a broken one is an error naming the file (and the field)."""
    path = run_dir / RUN_JSON
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read run.json ({exc.strerror or exc})") from None
    try:
        return decode_run_json(data)
    except RunJsonError as exc:
        raise RunFolderError(f"{path}: cannot read run.json ({exc})") from None


def units_from_run(run: RunInfo | None) -> pd.DataFrame:
    """The UNITS table from run.json's ``units`` list (empty when absent)."""
    import pandas as pd

    if run is None or not run.units:
        return schema.make_empty(schema.UNITS)
    rows = [
        {
            "unit": u.unit,
            "order": u.order if u.order >= 0 else i,
            "param_numel": u.param_numel,
            "param_bytes": u.param_bytes,
            "framework": run.framework,
            "parent": u.parent,
            "dtype": u.dtype,
            "size_source": schema.UNIT_SIZES_RUN if u.param_bytes >= 0 else "",
        }
        for i, u in enumerate(run.units)
    ]
    return schema.conform(pd.DataFrame(rows), schema.UNITS, table="units")


def read_timers(files: Sequence[Path], torn: list[str] | None = None) -> pd.DataFrame:
    """The TIMERS table from ``timers/rank{R}.jsonl`` files; a bad line is an error naming file and line,
    but for a file's last line, which a rank stopped mid-write leaves torn: it is left out, and the file
    named in ``torn`` (the summary says so)."""
    rows: list[dict[str, Any]] = []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise RunFolderError(f"{path}: cannot read timers ({exc})") from None
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rows.append(timer_row(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                # The recorder may be killed mid-line: a torn last line is expected, not an error.
                if line_no == len(lines):
                    if torn is not None:
                        torn.append(str(path))
                    break
                raise RunFolderError(f"{path}:{line_no}: bad timer record ({exc})") from None
    return timers_frame(rows)


def timer_row(rec: dict[str, Any]) -> dict[str, Any]:
    """One timer record (a line of ``timers/rank{R}.jsonl``) as a TIMERS row; KeyError, TypeError or
    ValueError when it is not one (a number past its column's type among them)."""
    row: dict[str, Any] = {
        "rank": int(rec["rank"]),
        "step": int(rec["step"]),
        "unit": str(rec.get("unit", "")),
        "phase": str(rec.get("phase", "")),
        "kind": str(rec.get("kind", "")),
        "ms": float("nan") if rec["ms"] is None else float(rec["ms"]),
        "bytes": int(rec.get("bytes", schema.UNKNOWN_BYTES)),
    }
    for key, top in (("rank", _INT32_MAX), ("step", _INT32_MAX), ("bytes", _INT64_MAX)):
        value = int(row[key])
        if not -top - 1 <= value <= top:
            raise ValueError(f"{key} {value} does not fit its column")
    return row


# the TIMERS columns' types (trace/kineto.py holds its own for the parser, which the summary cache's
# lookup of the sources does not import)
_INT32_MAX: Final = 2**31 - 1
_INT64_MAX: Final = 2**63 - 1


def timers_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The TIMERS table of :func:`timer_row`'s rows."""
    import pandas as pd

    if not rows:
        return schema.make_empty(schema.TIMERS)
    return schema.conform(pd.DataFrame(rows), schema.TIMERS, table="timers")
