"""The completed summary of a run, kept in the run folder's cache: the second ``summary`` is a read.

``fsdpviz summary`` of a small run spends most of its time after the trace is read: the per-unit
analysis, the replay, each action priced with a what-if run (docs/performance.md, "Where a summary's
time goes"). What it prints depends only on its inputs and on fsdpviz's code, so the completed
summary (:func:`fsdpviz.whatif.gains.completed_summary`, what ``summary --json`` prints) is kept,
once computed, in ``.fsdpviz-cache/`` of the run folder (of the first trace's folder for bare
traces), and read back by the next ``summary`` (which then loads nothing), and by ``report``,
``compare``, ``record`` and the notebook's ``Run.summary`` (which then skip the replay and the
pricing).

An entry is keyed (:class:`SummaryKey`) by:

- the inputs as the user named them (the JSON names ``sources`` and ``run_dir`` as given) and the
  options that change the answer (``--steps``, ``--include-last-step``, ``FSDPVIZ_KEEP_EVENTS``);
- every file the summary reads -- trace files, timers, run.json -- by resolved path, size and
  modification time (as the parse cache, :mod:`fsdpviz.trace.cache`, keys its entries);
- the code: ``fsdpviz.__version__`` and a digest of every source file of the package, so a
  development checkout never reads what other code wrote.

A folder that cannot be written (a read-only dataset, a shared mount; for root too, a folder without
any write bit) falls back to the user's cache folder (``$XDG_CACHE_HOME/fsdpviz``, else ``~/.cache/fsdpviz``); where neither can be written there
is no cache, silently (``FSDPVIZ_CACHE_HOME`` names another folder for that). ``--no-cache`` / ``cache=False`` / ``FSDPVIZ_NO_CACHE=1`` / ``FSDPVIZ_NO_SUMMARY_CACHE=1`` neither
read nor write it. A damaged or foreign entry is a miss.

An entry is one msgpack file holding the key's full digest, the exact text ``summary --json``
printed, the warnings the command printed after its analysis, and the :class:`Summary` struct (its
notes with their codes). ``summary --json`` reads only the text, so a warm run imports neither the
analysis nor pandas.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from fsdpviz import __version__
from fsdpviz.errors import FsdpvizError
from fsdpviz.runfolder import CACHE_DIR, RUN_JSON

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult
    from fsdpviz.analysis.summary import Summary

FORMAT: Final = 1  # the entry's layout; bumped when it changes
PREFIX: Final = "summary."
SUFFIX: Final = ".msgpack"
NO_CACHE_ENV: Final = "FSDPVIZ_NO_CACHE"
NO_SUMMARY_CACHE_ENV: Final = "FSDPVIZ_NO_SUMMARY_CACHE"
CACHE_HOME_ENV: Final = "FSDPVIZ_CACHE_HOME"  # the user's cache folder, when not XDG's (the test suite's own)
KEEP_EVENTS_ENV: Final = "FSDPVIZ_KEEP_EVENTS"  # trace.loader's: the run loaded whole or rank by rank


def cache_enabled(cache: bool) -> bool:
    """Whether the summary cache may be used: ``cache``, and neither ``FSDPVIZ_NO_CACHE=1`` (every
    cache, as the parse cache reads it) nor ``FSDPVIZ_NO_SUMMARY_CACHE=1`` (this one only: the test
    suite sets it, so that a test comparing two views computes both)."""
    off = ("1", "true", "yes")
    return cache and os.environ.get(NO_CACHE_ENV, "") not in off and os.environ.get(NO_SUMMARY_CACHE_ENV, "") not in off


@functools.cache
def code_version() -> str:
    """Digest of ``fsdpviz.__version__`` and of every source file of the package (their paths and
    bytes): any edit to any module, not only the analysis', makes earlier entries unreadable."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha1(__version__.encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def user_cache_dir() -> Path:
    """Where entries of read-only run folders go: ``$FSDPVIZ_CACHE_HOME``, else
    ``$XDG_CACHE_HOME/fsdpviz``, else ``~/.cache/fsdpviz``."""
    own = os.environ.get(CACHE_HOME_ENV, "").strip()
    if own:
        return Path(own)
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "fsdpviz"


@dataclass(frozen=True, slots=True)
class SummaryKey:
    """What a summary depends on, digested (see the module docstring).

    Attributes:
        digest: the full key; an entry is read only when its own copy of it matches.
        inputs: a digest of the inputs as named and the options only: the entry's file name starts
            with it, so that a newer entry of the same inputs replaces the older one.
        folder: the run's own cache folder (``.fsdpviz-cache`` of the run folder, or of the first
            trace's folder for bare traces).
    """

    digest: str
    inputs: str
    folder: Path

    @classmethod
    def of(cls, paths: Sequence[str | Path], *, steps: Sequence[int] | None,
           include_last_step: bool) -> SummaryKey | None:
        """The key of a summary of ``paths``; None when the inputs cannot be resolved or stat'ed (the
        analysis then says what is wrong, as it would without a cache)."""
        from fsdpviz.trace.sources import resolve_sources

        try:
            sources = resolve_sources(paths)
        except FsdpvizError:
            return None
        files = [*sources.files, *sources.timer_files]
        if sources.run_dir is not None:
            files.append(sources.run_dir / RUN_JSON)
        named = "\0".join(str(p) for p in paths)
        options = f"{list(steps) if steps is not None else None}|{include_last_step}|" \
                  f"{os.environ.get(KEEP_EVENTS_ENV, '').strip().lower()}"
        # a relative path names another run from another folder (the JSON prints it as given)
        here = str(Path.cwd()) if any(not Path(p).is_absolute() for p in paths) else ""
        inputs = hashlib.sha1(f"{here}\0{named}\0{options}".encode()).hexdigest()
        digest = hashlib.sha1(f"{FORMAT}|{inputs}|{code_version()}".encode())
        for f in files:
            try:
                st = f.stat()
                digest.update(f"|{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
            except OSError:
                return None
        folder = (sources.run_dir if sources.run_dir is not None else sources.files[0].parent) / CACHE_DIR
        return cls(digest=digest.hexdigest(), inputs=inputs, folder=folder)

    @property
    def file_name(self) -> str:
        return f"{PREFIX}{self.inputs[:16]}.{self.digest[:16]}{SUFFIX}"


class _Entry(msgspec.Struct, kw_only=True):
    """One entry as stored; ``summary`` is decoded only when the struct is asked for."""

    format: int
    digest: str
    json_text: str
    warnings: list[str]
    summary: msgspec.Raw


@dataclass(slots=True)
class CachedSummary:
    """A summary read back: ``json_text`` (``summary --json``'s output), ``warnings`` (the lines
    printed after the analysis), and ``summary``, the :class:`Summary` struct (decoded on first use)."""

    json_text: str
    warnings: list[str]
    raw: msgspec.Raw
    path: Path
    _summary: Summary | None = field(default=None, repr=False)

    @property
    def summary(self) -> Summary:
        """The completed summary as the analysis made it (notes keep their codes)."""
        if self._summary is None:
            from fsdpviz.analysis.summary import Summary

            self._summary = msgspec.msgpack.decode(self.raw, type=Summary, dec_hook=_decode_note)
        return self._summary


def summary_json_text(summary: Summary) -> str:
    """What ``fsdpviz summary --json`` prints for ``summary`` (one definition for the command and the cache)."""
    import json

    return json.dumps(summary.to_json(), indent=2) + "\n"


class SummaryStore:
    """Where one summary's entry is read from and written to: the run's cache folder, else the
    user's (``folders`` overrides both, for tests and benchmarks)."""

    def __init__(self, key: SummaryKey, folders: Sequence[Path] | None = None) -> None:
        self.key = key
        self.folders = list(folders) if folders is not None else [key.folder, user_cache_dir()]

    def read(self) -> CachedSummary | None:
        """The entry of this key from the first folder that has a current one; None otherwise."""
        for folder in self.folders:
            path = folder / self.key.file_name
            try:
                entry = msgspec.msgpack.decode(path.read_bytes(), type=_Entry)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                continue
            if entry.format == FORMAT and entry.digest == self.key.digest:
                return CachedSummary(json_text=entry.json_text, warnings=entry.warnings, raw=entry.summary, path=path)
        return None

    def write(self, summary: Summary, warnings: Sequence[str]) -> Path | None:
        """Store ``summary`` in the first folder that can be written (atomically: a concurrent reader
        sees the old entry or the new one); older entries of the same inputs there are removed.
        Returns the file, or None (silently) when no folder could be written."""
        try:
            data = msgspec.msgpack.encode(_Entry(
                format=FORMAT, digest=self.key.digest, json_text=summary_json_text(summary),
                warnings=list(warnings), summary=msgspec.Raw(msgspec.msgpack.encode(summary, enc_hook=_encode_note))))
        except (TypeError, ValueError):  # a summary field msgpack cannot hold: no cache, never a failure
            return None
        from fsdpviz.trace.cache import writable  # the parse cache's rule, one for both caches

        for folder in self.folders:
            if not writable(folder):
                continue
            path = folder / self.key.file_name
            tmp = folder / f".{self.key.file_name}.{os.getpid()}.tmp"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                tmp.write_bytes(data)
                os.replace(tmp, path)
            except OSError:  # read-only, full, odd filesystem: try the next folder
                try:
                    tmp.unlink(missing_ok=True)
                except OSError:
                    pass
                continue
            self._remove_stale(folder)
            return path
        return None

    def _remove_stale(self, folder: Path) -> None:
        for old in folder.glob(f"{PREFIX}{self.key.inputs[:16]}.*{SUFFIX}"):
            if old.name != self.key.file_name:
                try:
                    old.unlink()
                except OSError:
                    pass


def store_for(paths: Sequence[str | Path], *, steps: Sequence[int] | None = None, include_last_step: bool = False,
              cache: bool = True) -> SummaryStore | None:
    """The store of a summary of ``paths`` with these options; None when caching is off
    (:func:`cache_enabled`) or the inputs cannot be keyed."""
    if not cache_enabled(cache):
        return None
    key = SummaryKey.of(paths, steps=steps, include_last_step=include_last_step)
    return None if key is None else SummaryStore(key)


def _memo_name() -> str:
    """whatif.gains' name of the completed summary in ``RunResult.memo`` (imported when a run is)."""
    from fsdpviz.whatif.gains import SUMMARY_MEMO

    return SUMMARY_MEMO


def seed(result: RunResult, store: SummaryStore | None) -> bool:
    """Put the cached completed summary of ``store`` into ``result`` (whatif.gains' memo), if there is
    one; returns whether it was there."""
    if store is None:
        return False
    cached = store.read()
    if cached is None:
        return False
    try:
        summary = cached.summary
    except (msgspec.DecodeError, msgspec.ValidationError):  # another layout of Summary: a miss
        return False
    from fsdpviz.trace.schema import OVERLAP_GPU

    if summary.bound is not None and summary.bound.device == OVERLAP_GPU and summary.bound.deprofiled_by:
        # the split the model read gave (replay/split.py: the replay's, or the rule's and why), without it
        result.adopt_bound(summary.bound)
    result.memo[_memo_name()] = summary
    result.memo[_SEEDED] = True
    return True


def keep(result: RunResult, store: SummaryStore | None) -> Path | None:
    """Store ``result``'s completed summary, where a view computed it and it did not come from the
    cache (nothing is computed here for the cache's sake)."""
    name = _memo_name()
    if store is None or name not in result.memo or result.memo.get(_SEEDED) is True:
        return None
    from fsdpviz.analysis.completeness import gap_warnings

    summary: Any = result.memo[name]
    return store.write(summary, [" ".join(m.split()) for m in gap_warnings(result.traces)])


_SEEDED: Final = "cache.summary_seeded"


def _encode_note(obj: Any) -> Any:
    """A Note (a str with a ``code``) as ``[code, text]``, so that it comes back with its code."""
    from fsdpviz.structure.records import Note

    if isinstance(obj, Note):
        return [obj.code, obj.text]
    # a TypeError: write() then keeps no entry (the summary is still printed)
    raise TypeError(f"cannot store {type(obj).__name__} in the summary cache")


def _decode_note(kind: type, obj: Any) -> Any:
    from fsdpviz.structure.records import Note

    if kind is Note and isinstance(obj, list) and len(obj) == 2:
        return Note(str(obj[0]), str(obj[1]))
    # msgspec turns a TypeError from a decode hook into a ValidationError: the entry reads as a miss
    raise TypeError(f"cannot read {kind} from the summary cache")
