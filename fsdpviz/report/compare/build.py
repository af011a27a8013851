"""``load_runs`` + ``build_compare``: run folders -> analysed runs -> one offline compare page.

Used by ``fsdpviz compare``. Each run is loaded and analysed on its own by the one pipeline
(:func:`fsdpviz.analysis.pipeline.analyse`), exactly as ``fsdpviz summary`` and ``fsdpviz report`` do, so the compare page shows the same numbers as each run's own report.
An error in one run names that run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpviz.analysis.compare.model import Comparison
from fsdpviz.analysis.compare.runs import compare_runs, unique_labels
from fsdpviz.analysis.pipeline import LabelledRun
from fsdpviz.errors import FsdpvizError, RunFolderError, TraceError, UsageError
from fsdpviz.trace.tables import TraceSet

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult

COMPARE_NAME = "fsdpviz-compare.html"  # default output, in the working directory

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CompareResult:
    """What was written."""

    path: Path
    size_bytes: int
    seconds: float
    segments: int
    time_axis_ms: float  # the timelines' common axis: the longest representative step


def _folder(path: Path, traces: TraceSet) -> Path:
    return (Path(traces.run_dir) if traces.run_dir else path if path.is_dir() else path.parent).resolve()


def default_label(path: Path, traces: TraceSet) -> str:
    """run.json's ``label``, else the run folder's (or the trace file's folder's) name."""
    label = traces.run.label.strip() if traces.run is not None else ""
    if label:
        return label
    return _folder(path, traces).name or str(path)


def default_labels(loaded: Sequence[tuple[Path, TraceSet]]) -> list[str]:
    """:func:`default_label` of each run; runs whose folders share a name (``a/run``, ``b/run``) are named
    by as many of their parent folders as tell them apart, then made unique (:func:`unique_labels`)."""
    labels = [default_label(p, t) for p, t in loaded]
    for name in {lb for lb in labels if labels.count(lb) > 1}:
        same = [i for i, (p, t) in enumerate(loaded) if labels[i] == name and _folder(p, t).name == name]
        distinct = list(dict.fromkeys(_folder(*loaded[i]) for i in same))
        # told apart by parents where two folders share the name, or where the name is also a label
        # run.json gives another run (a label run.json gives stays as given); one folder twice, alone,
        # by its #2
        if len(distinct) < 2 and (not distinct or len(same) == labels.count(name)):
            continue
        parts = {f: f.relative_to(f.anchor).parts for f in distinct}
        for depth in range(2, max(len(p) for p in parts.values()) + 1):
            tails = {f: "/".join(p[-depth:]) for f, p in parts.items()}
            if len(set(tails.values())) == len(tails):
                for i in same:
                    labels[i] = tails[_folder(*loaded[i])]
                break
    return unique_labels(labels)


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def load_runs(paths: Sequence[str | Path], labels: Sequence[str] | None = None, *, cache: bool = True,
              scheduler: str | None = None,
              progress: Progress | None = None) -> list[LabelledRun]:
    """Load and analyse each run (a run folder, a folder of traces or one trace file per run).

    Raises:
        UsageError: fewer than two runs, or labels that do not match the runs one to one.
        FsdpvizError: a run that cannot be loaded or analysed (the message names it).
    """
    from fsdpviz.analysis.pipeline import analyse

    if len(paths) < 2:
        raise UsageError(f"compare needs at least two runs, got {len(paths)}")
    if labels and len(labels) != len(paths):
        raise UsageError(f"got {len(labels)} --label value(s) for {len(paths)} runs: give one label per run, "
                         "in the order of the runs, or none")
    if labels and len(set(labels)) != len(labels):
        raise UsageError(f"--label values must differ: {', '.join(labels)}")
    for raw in paths:  # a missing run is said before the others are loaded (seconds each)
        if not Path(raw).exists():
            raise TraceError(Path(raw), "no such file or folder")
    loaded: list[tuple[Path, RunResult]] = []
    for i, raw in enumerate(paths):
        path = Path(raw)
        _say(progress, f"run {i + 1}/{len(paths)}: loading {path}")
        try:
            result = analyse([path], cache=cache, progress=False, scheduler=scheduler)
            result.summary  # noqa: B018 - analysed here, so that an error names this run
        except FsdpvizError as exc:
            if str(path) in str(exc):
                raise
            raise RunFolderError(f"{path}: {exc}") from exc
        loaded.append((path, result))
    names = list(labels) if labels else default_labels([(p, r.traces) for p, r in loaded])
    return [LabelledRun(label=name, source=str(path), result=result) for name, (path, result) in zip(names, loaded)]


def build_compare(runs: Sequence[LabelledRun], output: str | Path, *,
                  comparison: Comparison | None = None, progress: Progress | None = None) -> CompareResult:
    """Compare the loaded runs and write the compare page to ``output`` (its folder must exist)."""
    from fsdpviz.report.compare.data import prepare_compare
    from fsdpviz.report.compare.page import build_compare_page
    from fsdpviz.report.html import write_page

    out = Path(output)
    if not out.parent.is_dir():
        raise RunFolderError(f"{out}: cannot write the page: folder {out.parent} does not exist")
    started = time.perf_counter()
    if comparison is None:
        comparison = compare_runs(runs)
    _say(progress, "preparing the compare page")
    data = prepare_compare(runs, comparison)
    _say(progress, f"rendering {len(runs)} runs ({data.segment_count:,} spans)")
    title = "fsdpviz compare: " + " vs ".join(comparison.labels)
    subtitle = " · ".join(f"{r.label}: {r.source}" for r in runs)
    page = build_compare_page(data, title=title, subtitle=subtitle)
    try:
        size = write_page(page, out)
    except OSError as exc:
        raise RunFolderError(f"{out}: cannot write the page: {exc.strerror or exc}") from exc
    return CompareResult(path=out, size_bytes=size, seconds=time.perf_counter() - started,
                         segments=data.segment_count, time_axis_ms=data.duration_ms)
