"""Real GPU traces loaded once per test session (several test modules read the same files)."""

from __future__ import annotations

import functools
from pathlib import Path

from fsdpviz.trace import TraceSet, load_traces


@functools.cache
def load_real(path: Path) -> TraceSet:
    """``load_traces([path])`` without the Parquet cache, memoised; callers must not mutate it."""
    return load_traces([path], cache=False)
