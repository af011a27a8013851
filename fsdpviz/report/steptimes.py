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
# The timer record of a whole step: no unit, phase "step", kind "total" (docs/recording.md, "Timers").
STEP_TIMER_PHASE = "step"
STEP_TIMER_KIND = "total"


def step_times(traces: TraceSet) -> pd.DataFrame:
    """One row per (rank, step): ``rank``, ``step``, ``ms``, ``source`` (timers or profiler)."""
    timers = traces.timers
    if not timers.empty:
        whole = timers[(timers["unit"] == "") & (timers["phase"] == STEP_TIMER_PHASE)
                       & (timers["kind"] == STEP_TIMER_KIND) & timers["ms"].notna()]
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


def choose_gantt_ranks(ranks: list[int], times: pd.DataFrame, max_ranks: int) -> tuple[list[int], str]:
    """The ranks the Gantt draws, and why (empty reason when all are drawn).

    Every rank up to ``max_ranks``; beyond that rank 0, the slowest and the fastest ranks by
    median step time (stragglers and the ranks waiting for them), then ranks spread evenly over
    the rest, so that a 64-rank Gantt stays readable and within the page's span budget.
    """
    ranks = sorted(int(r) for r in ranks)
    if len(ranks) <= max_ranks:
        return ranks, ""
    chosen: list[int] = [ranks[0]]
    if not times.empty:
        median = times.groupby("rank")["ms"].median().sort_values(kind="stable")
        by_speed = [int(r) for r in median.index if int(r) in set(ranks)]
        n_each = max(1, (max_ranks - 1) // 4)
        for r in list(reversed(by_speed))[:n_each] + by_speed[:n_each]:
            if r not in chosen:
                chosen.append(r)
    rest = [r for r in ranks if r not in chosen]
    n_more = max_ranks - len(chosen)
    if n_more > 0 and rest:
        idx = [round(i * (len(rest) - 1) / max(n_more - 1, 1)) for i in range(n_more)]
        chosen.extend(rest[i] for i in dict.fromkeys(idx))
    chosen = sorted(set(chosen))[:max_ranks]
    reason = (f"The Gantt draws {len(chosen)} of {len(ranks)} ranks: rank {ranks[0]}, the slowest and "
              "fastest ranks by median step time, and ranks spread over the rest "
              f"({', '.join(str(r) for r in chosen)}). `fsdpviz report --ranks` picks others.")
    return chosen, reason
