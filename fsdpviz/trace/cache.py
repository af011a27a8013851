"""Parquet cache of parsed traces, kept beside the traces in ``.fsdpviz-cache/``.

Parsing a large GPU trace takes seconds; reading its tables back from Parquet takes a few tens of
milliseconds, so reports and summaries of the same run are instant the second time. An entry is
keyed by the source's resolved path, size and modification time plus the fsdpviz version and a
digest of the parser's source, so an edited trace or another fsdpviz never reads stale tables. A
folder that cannot be written (a read-only dataset, a shared mount) simply means no cache: nothing
is reported, nothing fails.

An entry holds one rank's :class:`RankColumns` as written by a parser process (which has no
pandas): one Parquet file per table (events, lanes, steps, memory, rank) of plain columns, the
categorical ones as integer codes, their category lists as JSON in the events file's metadata.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Final

from fsdpviz import __version__
from fsdpviz.runfolder import CACHE_DIR
from fsdpviz.trace.kineto import RankColumns

_PARTS: Final = ("events", "lanes", "steps", "memory", "rank")
_META_KEY: Final = b"fsdpviz"


@functools.cache
def _parser_signature() -> str:
    """Digest of the parser's own source files, so that an edited parser (a development checkout
    between releases) never reads tables an older parser wrote."""
    digest = hashlib.sha1(__version__.encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def cache_key(source: Path) -> str | None:
    """Digest naming the cache entry of ``source``; None when the file cannot be stat'ed."""
    try:
        st = source.stat()
    except OSError:
        return None
    text = f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}|{_parser_signature()}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _entry_paths(source: Path, key: str) -> dict[str, Path]:
    folder = source.parent / CACHE_DIR
    return {name: folder / f"{source.name}.{key}.{name}.parquet" for name in _PARTS}


def load_cached(source: Path) -> RankColumns | None:
    """The cached tables of ``source`` if a current entry exists, else None (never raises)."""
    key = cache_key(source)
    if key is None:
        return None
    paths = _entry_paths(source, key)
    if not all(p.is_file() for p in paths.values()):
        return None
    try:
        import pyarrow.parquet as pq

        tables = {name: pq.read_table(path) for name, path in paths.items()}
        events = tables["events"]
        rank = {k: v[0] for k, v in tables["rank"].to_pydict().items()}
        rank["path"] = str(source)  # the same file may be named by another path this time
        return RankColumns(
            events={name: events.column(name).to_numpy() for name in events.column_names},
            categories=json.loads(events.schema.metadata[_META_KEY]),
            lanes=tables["lanes"].to_pydict(),
            steps={name: col.to_numpy() for name, col in zip(tables["steps"].column_names, tables["steps"].columns)},
            memory={name: col.to_numpy() for name, col in zip(tables["memory"].column_names, tables["memory"].columns)},
            rank=rank,
        )
    except Exception:  # noqa: BLE001 - a damaged cache entry is only a cache miss
        return None


def writable(folder: Path) -> bool:
    """Whether ``folder`` (or, before it exists, the folder it would be made in) may be written: by
    its permissions for this user, and by its mode bits at all -- a dataset whose owner took every
    write bit away is read-only for root too, who could otherwise write there."""
    here = folder
    while not here.exists():
        if here.parent == here:
            return False
        here = here.parent
    try:
        return bool(here.stat().st_mode & 0o222) and os.access(here, os.W_OK)
    except OSError:
        return False


def store_cached(source: Path, tables: RankColumns) -> bool:
    """Write the cache entry of ``source``; returns False (silently) when the folder is not writable."""
    key = cache_key(source)
    if key is None:
        return False
    paths = _entry_paths(source, key)
    folder = paths["events"].parent
    if not writable(folder):  # by its mode bits too: root could otherwise write into a read-only dataset
        return False
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        events = pa.table(tables.events).replace_schema_metadata({_META_KEY: json.dumps(tables.categories)})
        parts = {
            "events": events,
            "lanes": pa.table(tables.lanes),
            "steps": pa.table(tables.steps),
            "memory": pa.table(tables.memory),
            "rank": pa.table({k: [v] for k, v in tables.rank.items()}),
        }
        folder.mkdir(exist_ok=True)
        # Events (the largest) last: an entry is complete once all its files are there.
        for name in ("rank", "lanes", "steps", "memory", "events"):
            tmp = paths[name].with_name(f".{paths[name].name}.{os.getpid()}.tmp")
            pq.write_table(parts[name], tmp)
            os.replace(tmp, paths[name])  # atomic: a concurrent reader sees the old entry or the new one
        _remove_stale(source, key, folder)
    except Exception:  # noqa: BLE001 - read-only folders, full disks, odd filesystems: no cache
        return False
    return True


def _remove_stale(source: Path, key: str, folder: Path) -> None:
    prefix = f"{source.name}."
    for old in folder.glob(f"{source.name}.*.parquet"):
        rest = old.name[len(prefix):]
        if not rest.startswith(key) and len(rest.split(".")) == 3:
            try:
                old.unlink()
            except OSError:
                pass
