"""Plot data for the "across steps and ranks" section: step times of every step on every rank.

The profiler captures a few steps; the recorder's timers cover every step of the run. When a run
folder has timers, their whole-step records are the source (all steps); otherwise the profiled
``ProfilerStep#N`` ranges are. Either way the result is one row per (rank, step) with the step's
duration in ms, which the page shows per step (spread over ranks: stragglers) and per rank
(spread over steps: a consistently slow rank).
"""

from __future__ import annotations

import pandas as pd

from fsdpviz.report.style import NS_PER_MS
from fsdpviz.trace.tables import TraceSet

SOURCE_TIMERS = "timers"
SOURCE_PROFILER = "profiler"
# The timer record of a whole step: no unit, and kind "step" (see docs/recording.md).
STEP_TIMER_KIND = "step"


def step_times(traces: TraceSet) -> pd.DataFrame:
    """One row per (rank, step): ``rank``, ``step``, ``ms``, ``source`` (timers or profiler)."""
    timers = traces.timers
    if not timers.empty:
        whole = timers[(timers["unit"] == "") & (timers["kind"] == STEP_TIMER_KIND)]
        if not whole.empty:
            out = whole.groupby(["rank", "step"], as_index=False)["ms"].sum()
            out["source"] = SOURCE_TIMERS
            return out.astype({"rank": "int64", "step": "int64"})
    steps = traces.steps
    out = pd.DataFrame({
        "rank": steps["rank"].astype("int64"),
        "step": steps["step"].astype("int64"),
        "ms": (steps["end_ns"] - steps["start_ns"]) / NS_PER_MS,
    })
    out["source"] = SOURCE_PROFILER
    return out.sort_values(["step", "rank"]).reset_index(drop=True)


def per_step_spread(times: pd.DataFrame) -> pd.DataFrame:
    """Per step: the fastest, median and slowest rank's time and which rank was slowest.

    ``spread_ms`` (slowest - fastest) is the time the other ranks wait for the slowest one at the
    step's first collective.
    """
    if times.empty:
        return pd.DataFrame(columns=["step", "min_ms", "median_ms", "max_ms", "spread_ms", "slowest_rank"])
    grouped = times.groupby("step", sort=True)["ms"]
    out = pd.DataFrame({"min_ms": grouped.min(), "median_ms": grouped.median(), "max_ms": grouped.max()})
    out["spread_ms"] = out["max_ms"] - out["min_ms"]
    slowest = times.loc[grouped.idxmax().to_numpy()].set_index("step")["rank"]
    out["slowest_rank"] = slowest
    return out.reset_index()


def per_rank_summary(times: pd.DataFrame) -> pd.DataFrame:
    """Per rank: median and max step time, and how often it was the slowest rank of a step."""
    if times.empty:
        return pd.DataFrame(columns=["rank", "median_ms", "max_ms", "n_steps", "times_slowest"])
    grouped = times.groupby("rank", sort=True)["ms"]
    out = pd.DataFrame({"median_ms": grouped.median(), "max_ms": grouped.max(), "n_steps": grouped.size()})
    slowest = per_step_spread(times)["slowest_rank"].value_counts()
    out["times_slowest"] = slowest.reindex(out.index, fill_value=0).astype("int64")
    return out.reset_index()
