"""One rank's tables without its events: what the parent of a large run keeps of each rank.

When the ranks are analysed where they are parsed (``load_traces(..., per_rank=...)``), the parent
needs each rank's lanes, steps, RANKS row and memory samples, not its events. The samples are thinned
so that what is read from them across ranks stays exact: per device, the highest allocated and
reserved level between any two step boundaries (so the peak of any set of whole steps) and the level
each step opens at (the last sample before it). Between boundaries a coarse grid of
``MEMORY_BINS`` keeps the shape (lowest and highest sample of each bin), enough for an overview, not
for the drawn curves: those come from the analysis (thinned from every sample) or from the rank's
full tables, read again for the ranks a page draws.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from fsdpviz.trace.kineto import RankColumns
from fsdpviz.trace.unit_names import names_units

MEMORY_BINS: Final = 64


def thin_memory(memory: dict[str, np.ndarray], step_starts: np.ndarray, step_ends: np.ndarray,
                bins: int = MEMORY_BINS) -> dict[str, np.ndarray]:
    """The samples (MEMORY columns but rank, sorted by time) kept by the rule in the module docstring."""
    t = memory["t_ns"]
    n = len(t)
    if n <= 2 * bins:
        return {k: v.copy() for k, v in memory.items()}
    edges = np.linspace(float(t[0]), float(t[-1]), bins + 1)[1:-1].astype(np.int64)
    bounds = np.unique(np.concatenate([step_starts.astype(np.int64), step_ends.astype(np.int64), edges]))
    # segment k holds t in [bounds[k-1], bounds[k]): a step [start, end) is a run of whole segments
    segment = np.searchsorted(bounds, t, side="right").astype(np.int64)
    device = memory["device"].astype(np.int64)
    group = segment * (int(device.max()) + 1) + device
    keep = [np.array([0, n - 1])]
    order = np.argsort(group, kind="stable")  # by group, time order within each
    g_sorted = group[order]
    first = np.flatnonzero(np.r_[True, g_sorted[1:] != g_sorted[:-1]])
    last = np.r_[first[1:], n] - 1
    keep += [order[first], order[last]]  # each group's first and last sample (the level a step opens at)
    for col in ("allocated_bytes", "reserved_bytes"):
        by_value = np.lexsort((memory[col], group))  # within each group by value: last = highest
        keep.append(by_value[last])
        if col == "allocated_bytes":
            keep.append(by_value[first])  # and the lowest allocated (the curve's shape)
    kept = np.unique(np.concatenate(keep))
    return {k: v[kept] for k, v in memory.items()}


def light_columns(columns: RankColumns) -> RankColumns:
    """A copy of ``columns`` with no events and thinned memory (:func:`thin_memory`); ``columns``
    is left as it was."""
    events = {k: v[:0].copy() for k, v in columns.events.items()}
    steps = {k: np.asarray(v).copy() for k, v in columns.steps.items()}
    memory = thin_memory(columns.memory, steps.get("start_ns", np.zeros(0, np.int64)),
                         steps.get("end_ns", np.zeros(0, np.int64)))
    return RankColumns(
        events=events,
        # the event names, process groups and dtypes index the events, which are left out; but for FSDP2's
        # labels of units of several modules, which name those units as the whole run's load reads them
        # (trace/unit_names.py; no event refers to them here)
        categories={k: ([n for n in v if names_units(n)] if k == "name" else [] if k in ("pg", "comm_dtype")
                        else list(v)) for k, v in columns.categories.items()},
        lanes={k: list(v) for k, v in columns.lanes.items()},
        steps=steps,
        memory=memory,
        rank=dict(columns.rank),
    )
