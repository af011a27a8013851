"""Memory: the allocator curve, the peak inside each unit's window, the step's peak, and the model.

Samples are the ``[memory]`` events (one per allocation or free, with the allocator's running
``Total Allocated``). Per rank one device is analysed: its busiest GPU, else the CPU allocator.

- **Window peak** of a unit pass: the highest allocated level from the moment its window opens to
  the moment it closes, counting the level it opened at (the last sample at or before the start).
- **Step peak**: the highest sample inside the step, the first time it is reached, and the unit
  pass whose window holds that instant (the innermost one: a block inside the root wins).
- **Model** (:class:`MemoryModel`): FSDP / ZeRO-3 keep ``(s + s + K) * Psi / N`` bytes of sharded
  state per rank (parameters, gradients and optimizer state of ``Psi`` parameters over ``N`` shards,
  ``s`` bytes per sharded element and ``K`` optimizer bytes per element, ZeRO-3's fp32 master copy
  of the parameters among them), and at the peak also hold
  unsharded units: the two largest units' parameters (the one computing and the one prefetched) and
  the largest unit's gradients. What the peak really holds, by category, is measured
  (:mod:`fsdpviz.analysis.memory_categories`). ``N`` is the
  shard group a unit's parameters are spread over: the world size, except under HSDP (FSDP2 /
  FSDP1 hybrid sharding), where each shard group holds a full replica (:func:`shard_sizes`).
- **Curve**: the analysed steps' samples (and the level the first one opens at), thinned to a few
  thousand points per rank for drawing; each time bin keeps its lowest and highest sample, so no
  peak is lost. The report draws this table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec
import numpy as np
import pandas as pd

from fsdpviz.runfolder import UnitInfo
from fsdpviz.trace import frames, schema

MAX_CURVE_POINTS: Final = 4_000  # per rank

# The optimizer's states per sharded element assumed where a recording did not measure them: Adam's
# two moments, in the shards' dtype (the memory model's K, and whatif's carving of the unknown state).
ASSUMED_OPTIMIZER_STATES: Final = 2


CPU_DEVICE: Final = frames.CPU_DEVICE  # the CPU allocator's samples


def main_devices(memory: pd.DataFrame) -> dict[int, str]:
    """Per rank, the device analysed: the GPU with most samples, else ``cpu``."""
    out: dict[int, str] = {}
    if memory.empty:
        return out
    counts = memory.groupby(["rank", "device"], observed=True).size().reset_index(name="n")
    counts["gpu"] = counts["device"].astype(str) != CPU_DEVICE
    counts = counts.sort_values(["rank", "gpu", "n"], ascending=[True, False, False], kind="stable")
    for row in counts.drop_duplicates("rank").itertuples():
        out[int(row.rank)] = str(row.device)
    return out


def device_samples(memory: pd.DataFrame, rank: int, device: str) -> pd.DataFrame:
    """One rank's samples on one device, by time."""
    rows = memory[((memory["rank"] == rank) & (memory["device"] == device)).to_numpy()]
    return rows.sort_values("t_ns", kind="stable").reset_index(drop=True)


def window_peak_positions(samples: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position in ``samples`` of the highest allocated level within each ``[start, end]`` (the
    level entered with counts: the last sample at or before the start); -1 where none."""
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
            out[i] = a + int(np.argmax(v[a:b]))
    return out


def step_peak_positions(samples: pd.DataFrame, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Position in ``samples`` of each step's peak as :func:`step_peaks` finds it: the first highest
    sample in ``[start, end)``; -1 for a step without samples."""
    t = samples["t_ns"].to_numpy(np.int64)
    v = samples["allocated_bytes"].to_numpy(np.int64)
    out = np.full(len(starts), -1, dtype=np.int64)
    for k, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        a, b = np.searchsorted(t, [start, end], side="left")
        if b > a:
            out[k] = a + int(np.argmax(v[a:b]))  # argmax: the first time the peak is reached
    return out


def step_peaks(samples: pd.DataFrame, steps: pd.DataFrame, windows: pd.DataFrame, device: str,
               ancestors: dict[str, set[str]] | None = None, at: np.ndarray | None = None) -> pd.DataFrame:
    """MEMORY_PEAKS of one rank: per step its peak sample and the unit window holding it (the
    innermost: a unit's window wins over its ancestors' wherever their labels open, else the
    latest-opened one; ``ancestors`` as ``windows.unit_ancestors``). ``at``: the peaks' positions
    as :func:`step_peak_positions` gives them for ``steps``, when the caller has them."""
    rows = []
    t = samples["t_ns"].to_numpy(np.int64)
    v = samples["allocated_bytes"].to_numpy(np.int64)
    reserved = samples["reserved_bytes"].to_numpy(np.int64)
    w_start = windows["start_ns"].to_numpy(np.int64)
    w_end = windows["end_ns"].to_numpy(np.int64)
    starts, ends = steps["start_ns"].to_numpy(np.int64), steps["end_ns"].to_numpy(np.int64)
    if at is None:
        at = step_peak_positions(samples, starts, ends)
    for rank, step, start_ns, end_ns, i in zip(steps["rank"].to_numpy(), steps["step"].to_numpy(), starts, ends,
                                               at.tolist()):
        if i < 0:
            continue
        a, b = np.searchsorted(t, [start_ns, end_ns], side="left")
        inside = np.flatnonzero((w_start <= t[i]) & (t[i] <= w_end))
        unit = phase = ""
        if len(inside):
            j = _innermost(inside, w_start, windows["unit"], ancestors or {})
            unit, phase = str(windows["unit"].iat[j]), str(windows["phase"].iat[j])
        rows.append({"rank": rank, "step": step, "device": device, "peak_allocated_bytes": int(v[i]),
                     "peak_reserved_bytes": int(reserved[a:b].max()), "peak_t_ns": int(t[i]),
                     "unit": unit, "phase": phase})
    if not rows:
        return schema.make_empty(schema.MEMORY_PEAKS)
    return schema.conform(pd.DataFrame(rows), schema.MEMORY_PEAKS, table="memory peaks")


def _innermost(inside: np.ndarray, w_start: np.ndarray, units: pd.Series, ancestors: dict[str, set[str]]) -> int:
    """Of the windows around an instant, the one no other of them descends from (a unit rather than
    its ancestor), the latest opened among those."""
    names = [str(units.iat[i]) for i in inside]
    enclosing = set().union(*(ancestors.get(n, set()) for n in names))
    deepest = [i for i, n in zip(inside.tolist(), names) if n not in enclosing] or inside.tolist()
    return max(deepest, key=lambda i: w_start[i])


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


def curve(samples: pd.DataFrame, start_ns: int | None = None, end_ns: int | None = None,
          max_points: int = MAX_CURVE_POINTS) -> pd.DataFrame:
    """One rank's drawn curve (``samples`` sorted by time): every sample from ``start_ns`` to
    ``end_ns`` (all when None) after the level the window opens at (the last sample before
    ``start_ns``), thinned to about ``max_points`` with every peak kept (:func:`thin_curve`)."""
    if start_ns is not None and end_ns is not None and len(samples):
        t = samples["t_ns"].to_numpy(np.int64)
        first = max(int(np.searchsorted(t, start_ns, side="left")) - 1, 0)
        samples = samples.iloc[first:int(np.searchsorted(t, end_ns, side="right"))]
    return thin_curve(samples, max_points)


def curves(memory: pd.DataFrame, max_points: int = MAX_CURVE_POINTS) -> pd.DataFrame:
    """MEMORY: each rank's whole curve on its analysed device (:func:`main_devices`), thinned.
    (``RunAnalysis.memory`` is the same for the analysed steps.)"""
    parts = [curve(device_samples(memory, rank, device), max_points=max_points)
             for rank, device in sorted(main_devices(memory).items())]
    parts = [p for p in parts if len(p)]
    if not parts:
        return schema.make_empty(schema.MEMORY)
    return schema.conform(pd.concat(parts, ignore_index=True), schema.MEMORY, table="memory")


def element_bytes(units: pd.DataFrame, default: int) -> tuple[int, bool]:
    """Bytes per parameter element from the units table (param_bytes / param_numel), and whether
    it was measured (False: ``default`` was assumed)."""
    known = units[(units["param_numel"] > 0) & (units["param_bytes"] > 0)]
    if known.empty:
        return default, False
    ratio = float(known["param_bytes"].sum()) / float(known["param_numel"].sum())
    return max(1, round(ratio)), True


def shard_sizes(run_units: Sequence[UnitInfo] | None, gathers: pd.DataFrame, n_ranks: int,
                world_size: int) -> tuple[dict[str, int], str]:
    """Per unit, the number of ranks its parameters are sharded over, and where that came from.

    ``run.json``: the ``shard_size`` ``fsdpviz record`` read off the framework (FSDP2's mesh, FSDP1's
    and DeepSpeed's process group). Else the trace: a unit's all-gathers run on its shard group,
    whose process group name (``pg``: from ``record_param_comms`` on GPU, from the names ``fsdpviz
    record`` gives gloo's calls and threads on CPU) the group's ranks share, so
    the ranks seen using that name are the group -- when every rank of the world was loaded.
    ``gathers``: attributed all-gathers (``unit``, ``rank``, ``pg``) plus any other collectives
    (``pg``, ``rank``) for counting. Units with neither keep the world size (source "world_size").
    """
    recorded = {u.unit: u.shard_size for u in (run_units or []) if u.shard_size is not None and u.shard_size > 0}
    if recorded:
        return recorded, "run.json"
    named = gathers[(gathers["pg"].astype(str) != "").to_numpy()] if len(gathers) else gathers
    if named.empty or n_ranks < world_size:
        return {}, "world_size"
    ranks_per_pg = named.groupby("pg")["rank"].nunique()
    mine = named[(named["unit"].astype(str) != "").to_numpy()]
    if mine.empty:  # only other groups' collectives are named (tensor parallelism's): no unit's group
        return {}, "world_size"
    sizes = mine.assign(n=mine["pg"].map(ranks_per_pg)).groupby("unit")["n"].median()
    return {str(u): int(n) for u, n in sizes.items() if n > 0}, "trace"


class MemoryModel(msgspec.Struct, kw_only=True):
    """The ZeRO / FSDP arithmetic of a run's memory, shown beside the measured categories.

    A rank keeps ``(s + s + K) * Psi / N`` bytes of sharded state (parameters, gradients and
    optimizer state of ``Psi`` parameters over ``N`` shards, ``s`` bytes per sharded element and
    ``K`` optimizer bytes per element: ZeRO's ``(2 + 2 + K) Psi / N`` with fp16 shards, FSDP2's
    ``(4 + 4 + 8) Psi / N`` with fp32 shards and Adam, whatever the gathered dtype), and at the peak
    also unsharded units: the two largest units' parameters (the one computing and the one
    prefetched) and the largest unit's gradients, in the gathered dtype (``p`` bytes per element).
    """

    param_count: int
    bytes_per_param: int  # p: of the gathered (unsharded) parameters
    bytes_per_param_measured: bool
    sharded_bytes_per_param: int  # s: of the sharded parameters and gradients
    sharded_bytes_measured: bool  # from the sharded gradients' size (False: assumed equal to p)
    optimizer_bytes_per_param: int  # K
    optimizer_class: str  # from the optimizer's step label ("" when not seen or several)
    optimizer_bytes_measured: bool = False  # K from the measured optimizer state (False: Adam assumed)
    shards: int
    shards_source: str
    sharded_state_bytes: int
    unsharded_params_bytes: int
    unsharded_grads_bytes: int
    model_peak_bytes: int
    formula: str
    measured_peak_bytes: int | None = None
    # of K, ZeRO-3's fp32 master copy of the parameters its optimizer steps on (ZeRO's K = 12 for
    # Adam: 4 of them); None where none was measured
    master_bytes_per_param: int | None = None

    def to_json(self) -> dict[str, Any]:
        """As ``summary --json`` and the exports give it."""
        return msgspec.to_builtins(self)


def memory_model(unit_bytes: pd.Series, world_size: int, elem_bytes: int, *, measured_elem: bool,
                 sharded_elem_bytes: int | None = None, optimizer_bytes: int | None = None,
                 optimizer_class: str = "", unit_shards: dict[str, int] | None = None,
                 shards_source: str = "world_size") -> MemoryModel | None:
    """The :class:`MemoryModel` of units of ``unit_bytes`` unsharded parameter bytes (``elem_bytes``
    per element). ``sharded_elem_bytes``: measured bytes per sharded element (default: the gathered
    size). ``optimizer_bytes``: the optimizer's bytes per sharded element as measured (K); unknown,
    Adam's two moments in the shards' dtype are assumed (2s)."""
    units = [(str(u), int(b)) for u, b in unit_bytes.items() if b > 0]
    sizes = sorted((b for _, b in units), reverse=True)
    if not sizes or world_size <= 0:
        return None
    p = elem_bytes
    sp = sharded_elem_bytes or p
    # not measured: Adam's two moments in the shards' dtype are assumed (optimizer_bytes_measured False)
    k = optimizer_bytes if optimizer_bytes is not None else ASSUMED_OPTIMIZER_STATES * sp
    psi = round(sum(sizes) / p)
    shards = {u: max(1, (unit_shards or {}).get(u, world_size)) for u, _ in units}
    distinct = sorted(set(shards.values()))
    if len(distinct) == 1:
        n = distinct[0]
        sharded = round((2 * sp + k) * psi / n)
        state = f"({sp}+{sp}+{k})*{psi}/{n}"
    else:  # units sharded over groups of different sizes: each unit's share on its own
        n = max(distinct, key=lambda d: sum(b for u, b in units if shards[u] == d))
        sharded = round(sum((2 * sp + k) * (b / p) / shards[u] for u, b in units))
        state = f"sum over units of ({sp}+{sp}+{k})*params/shard size"
    params_unsharded = sum(sizes[:2])
    grads_unsharded = sizes[0]
    return MemoryModel(
        param_count=psi, bytes_per_param=p, bytes_per_param_measured=measured_elem, sharded_bytes_per_param=sp,
        sharded_bytes_measured=sharded_elem_bytes is not None, optimizer_bytes_per_param=k,
        optimizer_bytes_measured=optimizer_bytes is not None, optimizer_class=optimizer_class, shards=n, shards_source=shards_source if unit_shards else "world_size",
        sharded_state_bytes=sharded, unsharded_params_bytes=params_unsharded, unsharded_grads_bytes=grads_unsharded,
        model_peak_bytes=sharded + params_unsharded + grads_unsharded,
        formula=f"{state} + 2 largest units' params + largest unit's grads")
