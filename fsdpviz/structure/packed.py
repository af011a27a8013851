"""Tables packed as flat numpy columns: how a rank's analysis tables travel and wait in the parent.

A DataFrame of a few hundred rows costs several times its data in Python objects (blocks, indexes,
one string object per text cell); a thousand ranks' worth of them would be most of the parent's
memory. Packed, a table is one numpy array per column, text columns as integer codes into a list of
the distinct strings, compressed, and the column dtypes to restore. :func:`concat_packed` joins the ranks' packs
into one DataFrame column by column (categories merged, codes remapped), with the original dtypes.
"""

from __future__ import annotations

import pickle
import sys
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass(slots=True)
class Packed:
    """One table as columns, compressed: ``blob`` is the zlib-compressed pickle of ``(columns,
    categories)`` where ``columns[c]`` is a numpy array, or for a text column (in ``categories``)
    int32 codes into ``categories[c]`` (-1: missing); ``dtypes`` every column's dtype, in order.
    (Times, codes and counts of a rank's tables compress about five-fold, at about a millisecond
    per rank: a thousand ranks' tables wait in the parent in a fifth of the memory.)"""

    n_rows: int
    dtypes: dict[str, Any]
    blob: bytes

    def __len__(self) -> int:
        return self.n_rows

    def open(self) -> tuple[dict[str, np.ndarray], dict[str, list[Any]]]:
        """The columns and the text columns' categories."""
        columns, categories = pickle.loads(zlib.decompress(self.blob))
        return columns, categories


def pack(frame: pd.DataFrame) -> Packed:
    """``frame`` as a :class:`Packed` (its index is not kept)."""
    columns: dict[str, np.ndarray] = {}
    categories: dict[str, list[Any]] = {}
    for name in frame.columns:
        col = frame[name]
        if isinstance(col.dtype, np.dtype) and col.dtype != object:
            columns[name] = col.to_numpy()
        else:  # text (object, string, categorical): codes into the distinct values
            codes, uniques = pd.factorize(col, use_na_sentinel=True)
            columns[name] = codes.astype(np.int32)
            categories[name] = list(uniques)
    blob = zlib.compress(pickle.dumps((columns, categories), protocol=pickle.HIGHEST_PROTOCOL), 1)
    return Packed(len(frame), {c: frame[c].dtype for c in frame.columns}, blob)


def concat_packed(packs: Sequence[Packed], *, text_as_category: bool = False) -> pd.DataFrame:
    """The packs' rows as one DataFrame (fresh index), each column with its original dtype (text
    columns as categories if ``text_as_category``: a fraction of the memory, for internal use)."""
    if not packs:
        return pd.DataFrame()
    # an empty table may carry generic dtypes (object for an int column): it adds no row anyway
    packs = [p for p in packs if p.n_rows] or [packs[0]]
    dtypes = packs[0].dtypes
    opened = [p.open() for p in packs]
    out: dict[str, Any] = {}
    for name, dtype in dtypes.items():
        if name in opened[0][1]:
            merged: dict[Any, int] = {}
            parts = []
            for columns, categories in opened:
                remap = np.array([merged.setdefault(v, len(merged)) for v in categories.pop(name)] + [-1],
                                 dtype=np.int32)
                parts.append(remap[columns.pop(name)])  # code -1 indexes the trailing -1
            codes = np.concatenate(parts) if len(parts) > 1 else parts[0]
            cat = pd.Series(pd.Categorical.from_codes(codes, categories=pd.Index(list(merged), dtype=object)),
                            copy=False)
            out[name] = cat if text_as_category else cat.astype(dtype)
        else:
            arrays = [columns.pop(name) for columns, _ in opened]
            out[name] = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    return pd.DataFrame(out, copy=False)


def release_freed_memory() -> None:
    """Hand memory freed by this process back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). Thousands of small per-rank arrays, freed once joined, leave the heap full of holes
    that the allocator keeps; without this the parent of a large run would stay at its peak, and
    reach a higher one (Dask's workers trim for the same reason: "Memory not released back to the OS"
    in distributed's documentation)."""
    global _TRIM
    if _TRIM is None:
        _TRIM = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                _TRIM = ctypes.CDLL("libc.so.6").malloc_trim
            except (OSError, AttributeError):  # musl and other C libraries have no malloc_trim
                pass
    if _TRIM:
        _TRIM(0)


_TRIM: Any = None
