"""Plot data for the "across steps and ranks" section: step times of every step on every rank.

The profiler captures a few steps; the recorder's timers cover every step of the run. When a run
folder has timers, their whole-step records are the source (all steps); otherwise the profiled
``ProfilerStep#N`` ranges are. Either way the result is one row per (rank, step) with the step's
duration in ms, which the page shows per step (spread over ranks: stragglers) and per rank
(spread over steps: a consistently slow rank).
"""

from __future__ import annotations

import pandas as pd

from fsdpviz.analysis.run import STEP_PARTS
from fsdpviz.formatting import NS_PER_MS
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


STEP_PART_COLORS = dict(zip((name for _, name in STEP_PARTS), ("#4c78a8", "#f58518", "#9d9d9d", "#c7c7c7"),
                            strict=True))


def step_breakdown(rank_times: pd.DataFrame | None) -> pd.DataFrame:
    """Where each rank's step went as traced (means over the analysed steps, as the traced step is each
    rank's mean), long: rank, part, ms. The training threads' parts of the traced step: on a GPU host
    work the profiler slowed, which no factor moves to the run's clock, so the chart says "as traced" on
    every device. "In FSDP's / ZeRO's ranges" is the time the framework's own ranges covered, the
    collectives they waited for included: not the bound's FSDP per-unit work, which leaves those out.

    ``rank_times`` is the analysis' STEP_TIMES table."""
    if rank_times is None or rank_times.empty:
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "part": pd.Series(dtype=str),
                             "ms": pd.Series(dtype="float64")})
    mean = rank_times.groupby("rank", sort=True)[[c for c, _ in STEP_PARTS]].mean() / NS_PER_MS
    parts = [pd.DataFrame({"rank": mean.index.astype("int64"), "part": label, "ms": mean[col].to_numpy()})
             for col, label in STEP_PARTS]
    return pd.concat(parts, ignore_index=True)


EXPOSED_PER_RANK = "exposed communication (per step)"
LATE_PER_RANK = "late to collectives (median per step)"


def rank_waits(rank_times: pd.DataFrame | None, exposed_ms: dict[int, float | None] | None = None,
               scale: float = 1.0) -> pd.DataFrame:
    """Per rank: exposed communication and lateness, long: rank, what, ms.

    Exposed communication is ``exposed_ms``: the summary's per-rank figure
    (``overlap.per_rank[r].exposed_comm_ms``, the per-rank table's), so the chart and the tables
    agree. Lateness (median over analysed steps) is how much later than the earliest rank a rank
    started its collectives, summed over a step's collectives, moved to the run's clock by ``scale``
    (the bound's ``device_scale``) as the straggler finding's is: a straggler has a high lateness and
    little exposed communication, the ranks waiting for it the reverse."""
    parts = []
    if exposed_ms:
        known = {r: v for r, v in exposed_ms.items() if v is not None}
        parts.append(pd.DataFrame({"rank": pd.Series(list(known), dtype="int64"), "what": EXPOSED_PER_RANK,
                                   "ms": pd.Series(list(known.values()), dtype="float64")}))
    if rank_times is not None and not rank_times.empty and "late_ns" in rank_times.columns:
        med = scale * rank_times.groupby("rank", sort=True)["late_ns"].median() / NS_PER_MS
        parts.append(pd.DataFrame({"rank": med.index.astype("int64"), "what": LATE_PER_RANK, "ms": med.to_numpy()}))
    if not parts:
        return pd.DataFrame({"rank": pd.Series(dtype="int64"), "what": pd.Series(dtype=str),
                             "ms": pd.Series(dtype="float64")})
    return pd.concat(parts, ignore_index=True).sort_values(["rank"], kind="stable").reset_index(drop=True)


def skew_points(skew: pd.DataFrame | None, rank_times: pd.DataFrame | None) -> pd.DataFrame:
    """One point per collective seen on several ranks: when it started in its step (ms from the
    step's earliest start on any rank) and how far apart the ranks started it (``skew_ms``)."""
    cols = ["step", "t_ms", "skew_ms", "comm", "unit_name", "phase", "kind", "late_rank", "early_rank"]
    if skew is None or skew.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    from fsdpviz.report.timeline.units import unit_label

    if rank_times is not None and not rank_times.empty:
        origin = rank_times.groupby("step")["start_ns"].min()
    else:
        origin = skew.groupby("step")["first_start_ns"].min()
    out = skew.assign(
        t_ms=(skew["first_start_ns"] - skew["step"].map(origin).fillna(skew["first_start_ns"].min())) / NS_PER_MS,
        skew_ms=skew["start_skew_ns"] / NS_PER_MS,
        unit_name=skew["unit"].astype(str).map(lambda u: unit_label(u) if u else "(none)"),
    )
    out["comm"] = out["comm"].astype(str)
    return out[cols].reset_index(drop=True)


def unit_timer_times(unit_passes: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Per-unit forward / backward times of every clean unprofiled step and rank: unit_name, phase, ms.

    ``unit_passes`` is :func:`fsdpviz.structure.profiler_cost.unit_pass_steps`: each unit's own work
    as the recorder's timers clock it (nested units, gathers and reductions excluded), the numbers
    whose median is the summary's ``forward_timer_ms`` / ``backward_timer_ms`` (the unit table's
    timers columns). Units in forward order, forward before backward."""
    cols = ["unit", "unit_name", "phase", "ms"]
    if unit_passes.empty:
        return pd.DataFrame({c: pd.Series(dtype=str) for c in cols})
    from fsdpviz.report.timeline.units import unit_label

    rows = unit_passes
    rank_of = {u: i for i, u in enumerate(order)}
    rows = rows.assign(unit=rows["unit"].astype(str), _o=rows["unit"].astype(str).map(rank_of).fillna(len(order)),
                       _p=rows["phase"].map({"forward": 0, "backward": 1}))
    rows = rows.sort_values(["_o", "unit", "_p"], kind="stable")
    rows["unit_name"] = rows["unit"].map(unit_label)
    return rows[cols].reset_index(drop=True)
