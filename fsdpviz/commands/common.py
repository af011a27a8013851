"""Plumbing every command shares: its ``fsdpviz:`` progress lines, ``warning:`` lines about what a
loaded run lacks, and the check that an output file's folder exists before minutes of loading.

The texts of the warnings come from :mod:`fsdpviz.analysis.completeness`, which also puts them in
the summary's notes, so that every command says them the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fsdpviz.errors import UsageError

if TYPE_CHECKING:
    from fsdpviz.trace.tables import TraceSet

Say = Callable[[str], None]


def say(message: str) -> None:
    """One ``fsdpviz: ...`` progress line on stderr."""
    print(f"fsdpviz: {message}", file=sys.stderr, flush=True)


def progress_printer(quiet: bool) -> Say | None:
    """:func:`say`, or None when the user asked for quiet (``-q``)."""
    return None if quiet else say


def warn_gaps(traces: TraceSet) -> None:
    """Print one ``warning: ...`` line on stderr per gap in ``traces`` (missing ranks, skipped
    events, ranks that never communicated)."""
    from fsdpviz.analysis.completeness import gap_warnings

    for message in gap_warnings(traces):
        print(f"warning: {' '.join(message.split())}", file=sys.stderr, flush=True)


def check_output_folder(path: Path | None, what: str) -> None:
    """UsageError when ``path``'s folder does not exist or takes no file (``what``: "the report", "the
    page"): said before anything is loaded or printed, not after. The probe is an unnamed temporary file,
    gone when closed."""
    if path is None:
        return
    if not path.parent.is_dir():
        raise UsageError(f"{path}: cannot write {what}: folder {path.parent} does not exist")
    _probe(path, path.parent, what)


def check_output_tree(path: Path, what: str) -> None:
    """UsageError when the folder ``path`` is to be made in (its nearest existing ancestor; ``path``
    itself where it exists) takes no file, or is a file: said before anything is loaded."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{path}: cannot write {what}: {existing} is a file, not a folder")
    _probe(path, existing, what)


def _probe(path: Path, folder: Path, what: str) -> None:
    """UsageError unless ``folder`` takes a file (an unnamed temporary one, gone when closed)."""
    import errno
    import tempfile

    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        why = "" if exc.errno == errno.ENOENT or not exc.strerror else f" ({exc.strerror})"
        raise UsageError(f"{path}: cannot write {what}: folder {folder} takes no new file{why}") from None


SCHEDULER_HELP = ("Parse the traces on the workers of this Dask scheduler (tcp://host:8786; needs "
                  "pip install 'fsdpviz[dask]'); the workers must see the same paths. Default: "
                  "$FSDPVIZ_SCHEDULER, else local processes.")
STEPS_HELP = ("ProfilerSteps to analyse, e.g. 3,4 or 3-5 (ProfilerStep#N in the trace). Default: every "
              "step the trace shows complete.")
INCLUDE_LAST_HELP = "Also analyse the last captured step when the trace cannot show it complete."
QUIET_HELP = "No progress lines on stderr."
PATHS_HELP = ("A run folder (from fsdpviz record), a folder of traces, or trace files (.json / .json.gz, "
              "also recorded without fsdpviz).")


def own_this_process() -> None:
    """The command line's process is fsdpviz's own: the tables it builds hold the strings fsdpviz chose
    (:func:`fsdpviz.trace.schema.own_this_process`); a notebook's process keeps pandas' setting."""
    from fsdpviz.trace.schema import own_this_process as own

    own()
