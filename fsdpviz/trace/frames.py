"""Per-rank columns -> the run's DataFrames, in one pass per column.

Each parser process sends back one rank's tables as flat numpy columns (:class:`RankColumns`);
here they become the ``TraceSet`` tables. Categorical columns arrive as codes into each rank's own
category list: the lists are merged (in rank order, first seen first) and each rank's codes are
remapped through a small array before the concatenation, so no column ever goes through Python
objects. Columns are concatenated one at a time and each rank's part is dropped as soon as it is
copied, and the frame is built on the concatenated arrays without another copy, so the peak is the
result plus one column, not twice the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fsdpviz.runfolder import RunInfo
from fsdpviz.trace import schema
from fsdpviz.trace.event_columns import COMM_CATEGORIES
from fsdpviz.trace.kineto import RankColumns

if TYPE_CHECKING:
    import pandas as pd

# Categorical EVENTS columns with fixed categories, and those whose categories each rank brings.
_FIXED_CATEGORIES = {"kind": schema.EVENT_KINDS, "comm": COMM_CATEGORIES}
_RANK_CATEGORIES = ("lane", "name", "pg", "comm_dtype")


def _merged_codes(per_rank: Sequence[RankColumns], table: str, column: str, categories: str,
                  ) -> tuple[np.ndarray, list[str]]:
    """Codes of ``table[column]`` over all ranks, into the merged list of the ranks' categories."""
    merged: dict[str, int] = {}
    parts = []
    for r in per_rank:
        remap = np.array([merged.setdefault(c, len(merged)) for c in r.categories[categories]], dtype=np.int32)
        codes = getattr(r, table).pop(column)
        parts.append(remap[codes] if len(remap) else codes.astype(np.int32))
        del codes
    return _concat(parts), list(merged)


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def events_frame(per_rank: Sequence[RankColumns]) -> pd.DataFrame:
    """The EVENTS table of all ranks (consumes the ranks' event columns)."""
    import pandas as pd

    counts = [r.n_events for r in per_rank]
    if sum(counts) == 0:
        return schema.make_empty(schema.EVENTS)
    columns: dict[str, object] = {
        "rank": np.repeat(np.array([r.rank_id for r in per_rank], dtype=np.int32), counts)
    }
    for col in schema.EVENTS:
        if col == "rank":
            continue
        if col in _FIXED_CATEGORIES:
            codes = _concat([r.events.pop(col) for r in per_rank])
            columns[col] = pd.Categorical.from_codes(codes, categories=pd.Index(list(_FIXED_CATEGORIES[col])))
        elif col in _RANK_CATEGORIES:
            codes, categories = _merged_codes(per_rank, "events", col, col)
            columns[col] = pd.Categorical.from_codes(codes, categories=pd.Index(categories))
        else:
            columns[col] = _concat([r.events.pop(col) for r in per_rank])
    # copy=False: keep the concatenated arrays as the frame's columns (pandas would otherwise copy
    # them into one 2-D block per dtype: the events table twice in memory for a moment).
    return schema.conform(pd.DataFrame(columns, copy=False), schema.EVENTS, table="events")


def lanes_frame(per_rank: Sequence[RankColumns]) -> pd.DataFrame:
    import pandas as pd

    rows = [pd.DataFrame({"rank": r.rank_id, "lane": r.categories["lane"], **r.lanes})
            for r in per_rank if r.categories["lane"]]
    if not rows:
        return schema.make_empty(schema.LANES)
    return schema.conform(pd.concat(rows, ignore_index=True), schema.LANES, table="lanes")


def steps_frame(per_rank: Sequence[RankColumns]) -> pd.DataFrame:
    import pandas as pd

    parts = [pd.DataFrame({"rank": r.rank_id, **r.steps}) for r in per_rank if len(r.steps["step"])]
    if not parts:
        return schema.make_empty(schema.STEPS)
    return schema.conform(pd.concat(parts, ignore_index=True), schema.STEPS, table="steps")


def memory_frame(per_rank: Sequence[RankColumns], run: RunInfo | None = None) -> pd.DataFrame:
    """The MEMORY table of all ranks (consumes the ranks' memory columns). With ``run``, each rank's
    CPU level (which the profiler starts at 0 with the trace) is raised by what the recorder measured
    alive then and kept (:func:`measured_baseline`)."""
    import pandas as pd

    counts = [len(r.memory["t_ns"]) for r in per_rank]
    if sum(counts) == 0:
        return schema.make_empty(schema.MEMORY)
    codes, devices = _merged_codes(per_rank, "memory", "device", "device")
    columns: dict[str, object] = {
        "rank": np.repeat(np.array([r.rank_id for r in per_rank], dtype=np.int32), counts),
        "device": pd.Categorical.from_codes(codes, categories=pd.Index(devices)).astype("string"),
    }
    for col in ("t_ns", "allocated_bytes", "reserved_bytes", "delta_bytes", "addr"):
        columns[col] = _concat([r.memory.pop(col) for r in per_rank])
    frame = schema.conform(pd.DataFrame(columns, copy=False), schema.MEMORY, table="memory")
    baselines = measured_baseline(run)
    if baselines:
        ranks = frame["rank"].to_numpy()
        on_cpu = (frame["device"].astype(str) == CPU_DEVICE).to_numpy()
        add = np.zeros(len(frame), dtype=np.int64)
        for rank, extra in baselines.items():
            add[(ranks == rank) & on_cpu] = extra
        frame["allocated_bytes"] = frame["allocated_bytes"].to_numpy(np.int64) + add
    return frame


CPU_DEVICE = "cpu"


def measured_baseline(run: RunInfo | None) -> dict[int, int]:
    """Per rank whose recorder measured what its CPU training process held when the trace began
    (run.json ``ranks[].memory.trace_start``, device ``cpu``): the bytes the CPU profiler's level
    leaves out and that stay (sharded parameters, optimizer state, kept gradients)."""
    out: dict[int, int] = {}
    for info in run.ranks if run is not None else []:
        start = info.memory.trace_start if info.memory is not None else None
        if start is not None and start.device == CPU_DEVICE and start.baseline_bytes() > 0:
            out[info.rank] = start.baseline_bytes()
    return out


def ranks_frame(per_rank: Sequence[RankColumns]) -> pd.DataFrame:
    import pandas as pd

    return schema.conform(pd.DataFrame([r.rank for r in per_rank]), schema.RANKS, table="ranks")
