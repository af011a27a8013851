"""Memory a step adds, and whether a run's allocator curve drifts: what makes peaks comparable.

A run's peak allocated memory is the highest allocator sample in its analysed steps. It compares
well between GPU runs, whose level at the start of each step (sharded parameters, gradients,
optimizer state) is steady. On CPU, torch's profiler does not see gloo's threads free a block, and its
level never comes down for it: the level at each step's start climbed from step to step. The analysis
places those frees (:mod:`fsdpviz.analysis.unseen_frees`) and the samples read here are settled
(``RunResult.analysis`` settles ``traces.memory``), so a drift that is left is one fsdpviz could not
explain, and a peak then says more about how many steps were profiled than about the run.

So the comparison also reports the **step rise**: per rank and analysed step, the step's peak minus
the level the step started at (the last sample at or before its start), median over ranks and
steps. It is what one step adds on top of what it inherits, and stays meaningful under drift. A run
**drifts** when the level at step start grows across its analysed steps (from the second to the
last, the first being special right after profiling starts) by more than 10 % of its peak and
1 MiB.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.analysis.memory import device_samples
from fsdpviz.trace.tables import TraceSet

DRIFT_SHARE: Final = 0.10
DRIFT_FLOOR_BYTES: Final = 1 << 20


def step_levels(traces: TraceSet, steps: list[int]) -> pd.DataFrame:
    """Per rank and analysed step: ``start_bytes`` (level at the step's start) and ``peak_bytes``."""
    cols = ["rank", "step", "start_bytes", "peak_bytes"]
    rows = []
    for rank, device in sorted(traces.memory_devices.items()):
        samples = device_samples(traces.memory, rank, device)
        t = samples["t_ns"].to_numpy(np.int64)
        v = samples["allocated_bytes"].to_numpy(np.int64)
        mine = traces.steps[(traces.steps["rank"] == rank) & traces.steps["step"].isin(steps)].sort_values("step")
        for row in mine.itertuples():
            a, b = np.searchsorted(t, [row.start_ns, row.end_ns], side="left")
            if b <= a:
                continue
            start = v[a - 1] if a > 0 else v[a]
            rows.append((rank, int(row.step), int(start), int(v[a:b].max())))
    return pd.DataFrame(rows, columns=cols)


def step_rise_bytes(levels: pd.DataFrame) -> int | None:
    """Median over ranks and steps of peak - level at step start (None without samples)."""
    if levels.empty:
        return None
    return int(np.median(levels["peak_bytes"] - levels["start_bytes"]))


def drift_unknown(levels: pd.DataFrame) -> str | None:
    """Why :func:`drift_bytes` cannot tell whether the level drifts (None where it can: its None then
    means the level does not drift)."""
    if levels.empty:
        return "no allocator samples in its analysed steps (recorded without memory, or a trace without them)"
    if int(levels.groupby("rank")["step"].nunique().max()) < 2:
        return "fewer than two analysed steps with allocator samples on any rank"
    return None


def drift_bytes(levels: pd.DataFrame) -> int | None:
    """How much the level at step start grows over the analysed steps (max over ranks), if it drifts.

    None when it does not (see the module docstring for the rule) or cannot be told (:func:`drift_unknown`).
    """
    if levels.empty:
        return None
    worst = 0
    for _, rows in levels.groupby("rank"):
        starts = rows.sort_values("step")["start_bytes"].to_numpy()
        if len(starts) < 2:
            continue
        first = starts[1] if len(starts) >= 3 else starts[0]
        worst = max(worst, int(starts[-1] - first))
    peak = int(levels["peak_bytes"].max())
    return worst if worst > max(DRIFT_SHARE * peak, DRIFT_FLOOR_BYTES) else None
