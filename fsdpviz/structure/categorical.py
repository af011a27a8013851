"""Reading string columns of big tables without paying per row.

Event tables hold millions of rows whose string columns (lane, name, comm) are categoricals with a
few hundred distinct values. Converting such a column with ``astype(str)`` builds a string per row
(seconds per million rows with Arrow-backed strings); converting the categories once and indexing
them by the codes costs one pointer per row. The categories are read out as a list first: iterating
pandas' string array itself takes one indexing call per value, eight times the list's cost.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pandas as pd


def as_str(values: pd.Series) -> np.ndarray:
    """The column as an object array of ``str`` ("" for missing)."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        cats = np.array([str(c) for c in values.cat.categories.tolist()] + [""], dtype=object)
        codes = values.cat.codes.to_numpy()
        return cats[np.where(codes >= 0, codes, len(cats) - 1)]
    if isinstance(values.dtype, pd.StringDtype):  # already strings: one copy out (a tenth of the cast's cost)
        return values.to_numpy(dtype=object, na_value="", copy=True)  # never the column's own array
    return values.fillna("").astype(str).to_numpy(dtype=object)


def startswith(values: pd.Series, prefix: str | tuple[str, ...]) -> np.ndarray:
    """Boolean mask of rows whose value starts with ``prefix``, tested once per distinct value."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        cats = values.cat.categories
        hit = np.fromiter((str(c).startswith(prefix) for c in cats.tolist()), dtype=bool, count=len(cats))
        codes = values.cat.codes.to_numpy()
        return np.where(codes >= 0, hit[np.clip(codes, 0, None)] if len(cats) else False, False)
    return values.astype(str).str.startswith(prefix).to_numpy(dtype=bool)


def matching(values: pd.Series, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of rows whose value ``pattern`` matches at its start, tested once per distinct value."""
    return _tested(values, pattern.match)


def searching(values: pd.Series, pattern: re.Pattern[str]) -> np.ndarray:
    """Boolean mask of rows whose value ``pattern`` matches anywhere in, tested once per distinct value."""
    return _tested(values, pattern.search)


def _tested(values: pd.Series, test: Callable[[str], object]) -> np.ndarray:
    if isinstance(values.dtype, pd.CategoricalDtype):
        cats = values.cat.categories
        hit = np.fromiter((test(str(c)) is not None for c in cats.tolist()), dtype=bool, count=len(cats))
        codes = values.cat.codes.to_numpy()
        return np.where(codes >= 0, hit[np.clip(codes, 0, None)] if len(cats) else False, False)
    return np.fromiter((test(v) is not None for v in as_str(values)), dtype=bool, count=len(values))
