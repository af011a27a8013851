"""Memory: the allocator curve, the peak inside each unit's window, the step's peak, and the model.

Samples are the ``[memory]`` events (one per allocation or free, with the allocator's running
``Total Allocated``). Per rank one device is analysed: its busiest GPU, else the CPU allocator.

- **Window peak** of a unit pass: the highest allocated level from the moment its window opens to
  the moment it closes, counting the level it opened at (the last sample at or before the start).
- **Step peak**: the highest sample inside the step, the first time it is reached, and the unit
  pass whose window holds that instant (the innermost one: a block inside the root wins).
- **Model**: FSDP / ZeRO-3 keep ``(p + g + K) * Psi / N`` bytes of sharded state per rank
  (parameters, gradients and optimizer state of ``Psi`` parameters over ``N`` shards, with ``p = g``
  bytes per element and ``K`` optimizer bytes per element), and at the peak also hold unsharded
  units: the two largest units' parameters (the one computing and the one prefetched) and the
  largest unit's gradients. The rest of the measured peak is activations and buffers.
- **Curve**: thinned to a few thousand points per rank for drawing; each time bin keeps its lowest
  and highest sample, so no peak is lost.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pandas as pd

from fsdpviz.trace import schema

MAX_CURVE_POINTS: Final = 4_000  # per rank


def main_devices(memory: pd.DataFrame) -> dict[int, str]:
    """Per rank, the device analysed: the GPU with most samples, else ``cpu``."""
    out: dict[int, str] = {}
    if memory.empty:
        return out
    counts = memory.groupby(["rank", "device"], observed=True).size().reset_index(name="n")
    counts["gpu"] = counts["device"].astype(str) != "cpu"
    counts = counts.sort_values(["rank", "gpu", "n"], ascending=[True, False, False], kind="stable")
    for row in counts.drop_duplicates("rank").itertuples():
        out[int(row.rank)] = str(row.device)
    return out


def device_samples(memory: pd.DataFrame, rank: int, device: str) -> pd.DataFrame:
    """One rank's samples on one device, by time."""
    rows = memory[((memory["rank"] == rank) & (memory["device"] == device)).to_numpy()]
    return rows.sort_values("t_ns", kind="stable").reset_index(drop=True)


def window_peaks(samples: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Highest allocated level within each ``[start, end]``, including the level entered with."""
    out = np.full(len(starts), -1, dtype=np.int64)
    if samples.empty:
        return out
    t = samples["t_ns"].to_numpy(np.int64)
    v = samples["allocated_bytes"].to_numpy(np.int64)
    lo = np.searchsorted(t, starts, side="right") - 1  # last sample at or before the start
    first_inside = np.searchsorted(t, starts, side="left")
    lo = np.where(lo >= 0, lo, first_inside)
    hi = np.searchsorted(t, ends, side="right")
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist())):
        if b > a:
            out[i] = int(v[a:b].max())
    return out


def step_peaks(samples: pd.DataFrame, steps: pd.DataFrame, windows: pd.DataFrame, device: str) -> pd.DataFrame:
    """MEMORY_PEAKS of one rank: per step its peak sample and the unit window holding it."""
    rows = []
    t = samples["t_ns"].to_numpy(np.int64)
    v = samples["allocated_bytes"].to_numpy(np.int64)
    reserved = samples["reserved_bytes"].to_numpy(np.int64)
    w_start = windows["start_ns"].to_numpy(np.int64)
    w_end = windows["end_ns"].to_numpy(np.int64)
    for st in steps.itertuples():
        a, b = np.searchsorted(t, [st.start_ns, st.end_ns], side="left")
        if b <= a:
            continue
        i = a + int(np.argmax(v[a:b]))  # argmax: the first time the peak is reached
        inside = np.flatnonzero((w_start <= t[i]) & (t[i] <= w_end))
        unit = phase = ""
        if len(inside):
            j = inside[np.argmax(w_start[inside])]  # innermost: the latest-opened window around it
            unit, phase = str(windows["unit"].iat[j]), str(windows["phase"].iat[j])
        rows.append({"rank": st.rank, "step": st.step, "device": device, "peak_allocated_bytes": int(v[i]),
                     "peak_reserved_bytes": int(reserved[a:b].max()), "peak_t_ns": int(t[i]),
                     "unit": unit, "phase": phase})
    if not rows:
        return schema.make_empty(schema.MEMORY_PEAKS)
    return schema.conform(pd.DataFrame(rows), schema.MEMORY_PEAKS, table="memory peaks")


def thin_curve(samples: pd.DataFrame, max_points: int = MAX_CURVE_POINTS) -> pd.DataFrame:
    """At most ~``max_points`` samples of one curve (sorted by time): per time bin the lowest and
    the highest allocated sample, plus the first and last, so every peak survives."""
    if len(samples) <= max_points:
        return samples
    n_bins = max(1, max_points // 2)
    t = samples["t_ns"].to_numpy(np.int64)
    v = samples["allocated_bytes"].to_numpy(np.int64)
    edges = np.linspace(float(t[0]), float(t[-1]), n_bins + 1)
    bins = np.clip(np.searchsorted(edges, t.astype(np.float64), side="right") - 1, 0, n_bins - 1)
    pos = np.arange(len(t))
    # per bin: lexsort puts each bin's samples by value; first / last of each bin are min / max
    order = np.lexsort((v, bins))
    b_sorted = bins[order]
    starts = np.flatnonzero(np.r_[True, b_sorted[1:] != b_sorted[:-1]])
    ends = np.r_[starts[1:], len(order)] - 1
    keep = np.unique(np.concatenate([pos[order[starts]], pos[order[ends]], [0, len(t) - 1]]))
    return samples.iloc[keep]


def element_bytes(units: pd.DataFrame, default: int) -> tuple[int, bool]:
    """Bytes per parameter element from the units table (param_bytes / param_numel), and whether
    it was measured (False: ``default`` was assumed)."""
    known = units[(units["param_numel"] > 0) & (units["param_bytes"] > 0)]
    if known.empty:
        return default, False
    ratio = float(known["param_bytes"].sum()) / float(known["param_numel"].sum())
    return max(1, round(ratio)), True


def memory_model(unit_bytes: pd.Series, world_size: int, elem_bytes: int, *, measured_elem: bool,
                 optimizer_bytes_per_param: int | None = None) -> dict[str, Any]:
    """The ZeRO/FSDP memory model next to which the measured peak is shown.

    ``unit_bytes``: unsharded parameter bytes per unit. ``optimizer_bytes_per_param`` (K) defaults
    to Adam: fp32 master weights plus two moments (12) for 16-bit parameters, two moments in the
    parameter dtype (2p) otherwise.
    """
    sizes = sorted((int(b) for b in unit_bytes if b > 0), reverse=True)
    if not sizes or world_size <= 0:
        return {}
    p = elem_bytes
    k = optimizer_bytes_per_param if optimizer_bytes_per_param is not None else (12 if p <= 2 else 2 * p)
    psi = round(sum(sizes) / p)
    sharded = round((2 * p + k) * psi / world_size)
    params_unsharded = sum(sizes[:2])
    grads_unsharded = sizes[0]
    return {
        "param_count": psi,
        "bytes_per_param": p,
        "bytes_per_param_measured": measured_elem,
        "optimizer_bytes_per_param": k,
        "shards": world_size,
        "sharded_state_bytes": sharded,
        "unsharded_params_bytes": params_unsharded,
        "unsharded_grads_bytes": grads_unsharded,
        "model_peak_bytes": sharded + params_unsharded + grads_unsharded,
        "formula": f"({p}+{p}+{k})*{psi}/{world_size} + 2 largest units' params + largest unit's grads",
    }
