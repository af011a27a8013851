"""Parquet cache of parsed traces, kept beside the traces in ``.fsdpviz-cache/``.

Parsing a large GPU trace takes seconds; reading its tables back from Parquet takes a few tens of
milliseconds, so reports and summaries of the same run are instant the second time. An entry is
keyed by the source's resolved path, size and modification time plus the fsdpviz version and a
digest of the parser's source, so an edited trace or another fsdpviz never reads stale tables. A folder that cannot be written (a
read-only dataset, a shared mount) simply means no cache: nothing is reported, nothing fails.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Final

import pandas as pd

from fsdpviz import __version__
from fsdpviz.trace import schema
from fsdpviz.trace.tables import RankTables

CACHE_DIR: Final = ".fsdpviz-cache"


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
    return {name: folder / f"{source.name}.{key}.{name}.parquet" for name in RankTables.TABLES}


def load_cached(source: Path) -> RankTables | None:
    """The cached tables of ``source`` if a current entry exists, else None (never raises)."""
    key = cache_key(source)
    if key is None:
        return None
    paths = _entry_paths(source, key)
    if not all(p.is_file() for p in paths.values()):
        return None
    try:
        tables = {
            name: schema.conform(pd.read_parquet(p), RankTables.SCHEMAS[name], table=name)
            for name, p in paths.items()
        }
    except Exception:  # noqa: BLE001 - a damaged cache entry is only a cache miss
        return None
    # The same file may be named by another relative path this time.
    tables["rank"] = tables["rank"].assign(path=pd.array([str(source)], dtype="string"))
    return RankTables(**tables)


def store_cached(source: Path, tables: RankTables) -> bool:
    """Write the cache entry of ``source``; returns False (silently) when the folder is not writable."""
    key = cache_key(source)
    if key is None:
        return False
    paths = _entry_paths(source, key)
    folder = next(iter(paths.values())).parent
    try:
        folder.mkdir(exist_ok=True)
        for name, path in paths.items():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            getattr(tables, name).to_parquet(tmp, index=False)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the old entry or the new one
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
