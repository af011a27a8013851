"""Plot data for the memory curve under the Gantt: allocator samples of one step, peak-preserving.

A GPU trace records one ``[memory]`` sample per allocation and free: tens of thousands per step,
more than a browser needs to draw a curve a thousand pixels wide. Samples are binned in time and
each bin keeps its lowest and highest sample, so every peak and trough of the curve survives the
thinning. Which device's curve to draw: a rank's GPU when it has one, else its CPU allocator.

With many ranks, one curve per rank turns into a thicket: the page draws the ranks with the
highest peaks (and rank 0), and says which ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fsdpviz.report.style import NS_PER_MS
from fsdpviz.report.timeline import StepChoice

MAX_POINTS_PER_RANK = 2_000
MAX_MEMORY_RANKS = 4  # each curve is a holoviews element (~0.1 s to render); more is a thicket anyway


def main_device(memory: pd.DataFrame) -> pd.Series:
    """Per rank, the device whose allocator the report draws: the busiest GPU, else ``cpu``."""
    if memory.empty:
        return pd.Series(dtype="string", name="device")
    counts = memory.groupby(["rank", "device"], observed=True).size().rename("n").reset_index()
    counts["is_gpu"] = counts["device"].astype(str).str.startswith("cuda")
    counts = counts.sort_values(["rank", "is_gpu", "n"], ascending=[True, False, False], kind="stable")
    return counts.drop_duplicates("rank").set_index("rank")["device"]


def choose_memory_ranks(memory: pd.DataFrame, max_ranks: int = MAX_MEMORY_RANKS) -> list[int]:
    """All ranks with samples when there are few; else rank 0 and the ranks with the highest peaks."""
    if memory.empty:
        return []
    peaks = memory.groupby("rank", observed=True)["allocated_bytes"].max().sort_values(
        ascending=False, kind="stable")
    ranks = sorted(int(r) for r in peaks.index)
    if len(ranks) <= max_ranks:
        return ranks
    chosen = [ranks[0]] + [int(r) for r in peaks.index if int(r) != ranks[0]][: max_ranks - 1]
    return sorted(chosen)


def thin_samples(df: pd.DataFrame, max_points: int) -> pd.DataFrame:
    """Keep at most ~``max_points`` rows of one curve (sorted by ``t_ns``): min and max per time bin."""
    if len(df) <= max_points:
        return df
    n_bins = max(1, max_points // 2)
    t = df["t_ns"].to_numpy(np.int64)
    edges = np.linspace(t[0], t[-1], n_bins + 1)
    bins = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, n_bins - 1)
    values = df["allocated_bytes"].to_numpy()
    frame = pd.DataFrame({"bin": bins, "v": values, "pos": np.arange(len(df))})
    grouped = frame.groupby("bin", sort=True)["v"]
    lo = frame.loc[grouped.idxmin(), "pos"].to_numpy()
    hi = frame.loc[grouped.idxmax(), "pos"].to_numpy()
    keep = np.unique(np.concatenate([lo, hi, [0, len(df) - 1]]))
    return df.iloc[keep]


def memory_curves(memory: pd.DataFrame, choice: StepChoice, ranks: Sequence[int],
                  max_points_per_rank: int = MAX_POINTS_PER_RANK) -> pd.DataFrame:
    """Allocated and reserved bytes of ``ranks`` during ``choice``'s step, x in ms from its origin.

    Each curve starts with the last sample before the step (the level the step starts at) moved to
    the step's origin, so a step without allocations still shows its level. Returns ``rank``,
    ``device``, ``t_ns``, ``t_ms``, ``allocated_bytes``, ``reserved_bytes``.
    """
    cols = ["rank", "device", "t_ns", "t_ms", "allocated_bytes", "reserved_bytes"]
    if memory.empty or not ranks:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    devices = main_device(memory)
    parts: list[pd.DataFrame] = []
    for rank in ranks:
        if rank not in devices.index:
            continue
        mine = memory[(memory["rank"] == rank) & (memory["device"] == devices[rank])]
        mine = mine.sort_values("t_ns", kind="stable")
        before = mine[mine["t_ns"] < choice.origin_ns].tail(1).copy()
        before["t_ns"] = choice.origin_ns
        inside = mine[(mine["t_ns"] >= choice.origin_ns) & (mine["t_ns"] <= choice.end_ns)]
        curve = pd.concat([before, inside], ignore_index=True)
        if curve.empty:
            continue
        # The level holds until the end of the step: repeat the last sample there.
        tail = curve.tail(1).copy()
        tail["t_ns"] = choice.end_ns
        curve = thin_samples(pd.concat([curve, tail], ignore_index=True), max_points_per_rank)
        parts.append(curve)
    if not parts:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    out = pd.concat(parts, ignore_index=True)
    out["device"] = out["device"].astype(str)
    out["t_ms"] = (out["t_ns"] - choice.origin_ns) / NS_PER_MS
    return out[cols]
