"""The units of a run and their per-unit numbers (medians over ranks and steps).

Units come from run.json when ``fsdpviz record`` wrote one (names, order, sizes as the framework
reported them). For traces recorded without fsdpviz they are read off the labels: the order is the
forward order of their windows, the size the bytes their forward all-gather produced (the
unsharded, padded parameters), the parent the innermost unit whose forward window encloses theirs.

:func:`unit_stats` reduces UNIT_STEPS to one row per unit (as traced, but for the passes' own
``forward_clock_ns`` / ``backward_clock_ns``, which the run's analysis moved: :func:`moved_pass_ns`);
:func:`summary_records` gives the summary's ``units`` (:class:`UnitSummary`), their times moved to the
run's clock as every figure the summary shows is.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.analysis.memory_categories import PeakCategories
from fsdpviz.formatting import ms
from fsdpviz.trace import comms, schema


def derive_units(run_units: pd.DataFrame, windows: pd.DataFrame, moved: pd.Series,
                 framework: str, gathers: pd.DataFrame | None = None) -> pd.DataFrame:
    """UNITS: run.json's units, completed with what the traces show; else units from the traces.

    A unit's size from the trace (``size_source`` ``trace``) is what its all-gathers issued
    (``gathers``, spans.ISSUED_GATHERS: bytes and dtype of the gathered, padded parameters, median
    over ranks and steps), else what one of its gather collectives moved (``moved``: unit -> bytes,
    the median over its all-gathers; no dtype, so no numel)."""
    seen = windows[windows["phase"] == vocabulary.FORWARD]
    if seen.empty:
        seen = windows
    order = seen.sort_values(["rank", "start_ns"], kind="stable").drop_duplicates("unit")["unit"].tolist()
    sizes = _trace_sizes(gathers, moved)
    if len(run_units):
        out = run_units.copy()
        missing = (out["param_bytes"] < 0).to_numpy()
        if missing.any():
            found = sizes.reindex(out.loc[missing, "unit"].astype(str).tolist())
            for col in ("param_bytes", "param_numel"):
                out.loc[missing, col] = found[col].fillna(-1).to_numpy(dtype=np.int64)
            out.loc[missing, "dtype"] = found["dtype"].fillna("").to_numpy(dtype=object)
            out.loc[missing, "size_source"] = np.where(found["param_bytes"].fillna(-1).to_numpy() > 0,
                                                       schema.UNIT_SIZES_TRACE, "")
        known = set(out["unit"])
        extra = [u for u in order if u not in known]
        if extra:  # units the traces show but run.json does not list
            out = pd.concat([out, _units_frame(extra, sizes, framework, windows, len(out))], ignore_index=True)
        return schema.conform(out, schema.UNITS, table="units")
    return _units_frame(order, sizes, framework, windows, 0)


def _trace_sizes(gathers: pd.DataFrame | None, moved: pd.Series) -> pd.DataFrame:
    """Per unit (index): ``param_bytes``, ``param_numel`` (-1 without a dtype), ``dtype`` as the
    trace gives them (see :func:`derive_units`)."""
    cols = {"param_bytes": pd.Series(dtype="int64"), "param_numel": pd.Series(dtype="int64"),
            "dtype": pd.Series(dtype=object)}
    if gathers is not None and len(gathers):
        g = gathers.assign(dtype=gathers["dtype"].astype(str))
        nbytes = g.groupby("unit")["bytes"].median().round().astype("int64")
        dtype = g[g["dtype"] != ""].groupby("unit")["dtype"].agg(lambda d: d.value_counts().index[0])
        dtype = dtype.reindex(nbytes.index).fillna("")
        size = dtype.map(lambda d: comms.dtype_bytes(d) or 0).astype("int64")
        numel = np.where(size > 0, nbytes // size.clip(lower=1), -1)
        return pd.DataFrame({"param_bytes": nbytes, "param_numel": numel, "dtype": dtype}, index=nbytes.index)
    if moved.empty:
        return pd.DataFrame(cols)
    return pd.DataFrame({"param_bytes": moved.round().astype("int64"), "param_numel": -1, "dtype": ""},
                        index=moved.index)


def _units_frame(names: list[str], sizes: pd.DataFrame, framework: str, windows: pd.DataFrame,
                 first_order: int) -> pd.DataFrame:
    parents = _parents(windows)
    found = sizes.reindex(names)
    nbytes = found["param_bytes"].fillna(-1).to_numpy(dtype=np.int64)
    frame = pd.DataFrame({
        "unit": names,
        "order": np.arange(first_order, first_order + len(names)),
        "param_numel": found["param_numel"].fillna(-1).to_numpy(dtype=np.int64),
        "param_bytes": nbytes,
        "framework": framework,
        "parent": [parents.get(u, "") for u in names],
        "dtype": found["dtype"].fillna("").to_numpy(dtype=object),
        "size_source": np.where(nbytes > 0, schema.UNIT_SIZES_TRACE, ""),
    })
    return schema.conform(frame, schema.UNITS, table="units")


def _parents(windows: pd.DataFrame) -> dict[str, str]:
    """unit -> innermost other unit whose forward window encloses its first forward window."""
    fwd = windows[windows["phase"] == vocabulary.FORWARD]
    if fwd.empty:
        return {}
    first_rank = fwd["rank"].min()
    fwd = fwd[fwd["rank"] == first_rank]
    first_step = fwd["step"].min()
    fwd = fwd[fwd["step"] == first_step].drop_duplicates("unit")
    out = {}
    for row in fwd.itertuples():
        around = fwd[(fwd["start_ns"] <= row.start_ns) & (fwd["end_ns"] >= row.end_ns) & (fwd["unit"] != row.unit)]
        if len(around):
            out[row.unit] = str(around.sort_values("start_ns")["unit"].iat[-1])
    return out


def _by_phase(us: pd.DataFrame, phase: str, cols: dict[str, str]) -> pd.DataFrame:
    part = us[us["phase"] == phase].set_index(["rank", "step", "unit"])[list(cols)]
    return part.rename(columns=cols)


def unit_stats(unit_steps: pd.DataFrame, units: pd.DataFrame) -> pd.DataFrame:
    """UNIT_STATS: per unit, medians over (rank, step) of its per-step numbers."""
    if unit_steps.empty:
        return schema.make_empty(schema.UNIT_STATS)
    us = unit_steps
    key = ["rank", "step", "unit"]
    per = us.groupby(key).agg(all_gather_ns=("ag_ns", "sum"), reduce_scatter_ns=("rs_ns", "sum"),
                              all_reduce_ns=("ar_ns", "sum"), ag_exposed=("ag_exposed_ns", "sum"),
                              rs_exposed_ns=("rs_exposed_ns", "sum"), ar_exposed=("ar_exposed_ns", "sum"))
    per["exposed_comm_ns"] = per["ag_exposed"] + per["rs_exposed_ns"] + per["ar_exposed"]
    per = per.join(_by_phase(us, vocabulary.FORWARD, {
        "compute_ns": "forward_ns", "compute_clock_ns": "forward_clock_ns", "ag_exposed_ns": "forward_ag_exposed_ns",
        "prefetch_lead_ns": "forward_prefetch_lead_ns", "issue_depth": "forward_issue_depth"}))
    per = per.join(_by_phase(us, vocabulary.BACKWARD, {
        "compute_ns": "backward_ns", "compute_clock_ns": "backward_clock_ns", "ag_exposed_ns": "backward_ag_exposed_ns",
        "prefetch_lead_ns": "backward_prefetch_lead_ns", "issue_depth": "backward_issue_depth"}))
    for col in ("forward_issue_depth", "backward_issue_depth"):
        per[col] = per[col].where(per[col] >= 0)  # NO_DEPTH: no gather in that pass
    for col in ("forward_ns", "backward_ns", "forward_ag_exposed_ns", "backward_ag_exposed_ns"):
        per[col] = per[col].fillna(0)
    for phase in (vocabulary.FORWARD, vocabulary.BACKWARD):  # a (rank, step) without the pass: 0, as traced
        per[f"{phase}_clock_ns"] = per[f"{phase}_clock_ns"].where(per[f"{phase}_ns"] > 0, 0.0)
    med_cols = ["all_gather_ns", "forward_ns", "backward_ns", "forward_clock_ns", "backward_clock_ns",
                "reduce_scatter_ns", "all_reduce_ns",
                "exposed_comm_ns", "forward_ag_exposed_ns", "backward_ag_exposed_ns", "rs_exposed_ns",
                "forward_prefetch_lead_ns", "backward_prefetch_lead_ns", "forward_issue_depth",
                "backward_issue_depth"]
    stats = per.groupby("unit")[med_cols].median()
    # unknown (-1) on any rank-step: unknown for the unit
    wait, by = us["host_wait_ns"], [us[k] for k in key]
    waits = wait.groupby(by).sum().astype(float).where((wait >= 0).groupby(by).all())
    stats["host_wait_ns"] = waits.groupby(level="unit").median().where(waits.notna().groupby(level="unit").all())
    stats["n_samples"] = per.groupby("unit").size()
    # a grouped max rather than pivot_table: the same (unit, phase) table at a fraction of its fixed cost
    peaks = us.groupby(["unit", "phase"])["peak_allocated_bytes"].max()
    phases = set(peaks.index.get_level_values("phase"))
    for phase in (vocabulary.FORWARD, vocabulary.BACKWARD):
        stats[f"{phase}_peak_allocated_bytes"] = (peaks.xs(phase, level="phase") if phase in phases
                                                  else pd.Series(dtype=float))
    stats["peak_allocated_bytes"] = us.groupby("unit")["peak_allocated_bytes"].max()
    info = units.set_index("unit")[["order", "param_numel", "param_bytes"]] if len(units) else None
    if info is not None:
        stats = stats.join(info)
    else:
        stats = stats.assign(order=np.nan, param_numel=-1, param_bytes=-1)
    first_seen = us.sort_values(["rank", "step", "window_start_ns"]).drop_duplicates("unit")["unit"].tolist()
    fallback = {u: len(units) + i for i, u in enumerate(first_seen)}
    stats["order"] = [o if pd.notna(o) else fallback[u] for u, o in zip(stats.index, stats["order"])]
    stats[["param_numel", "param_bytes"]] = stats[["param_numel", "param_bytes"]].fillna(-1)
    for col in ("forward_peak_allocated_bytes", "backward_peak_allocated_bytes", "peak_allocated_bytes"):
        stats[col] = stats[col].fillna(-1)
    stats["unsharded_bytes"] = np.where(stats["param_bytes"] > 0, 2 * stats["param_bytes"], -1)
    stats = stats.reset_index().sort_values("order", kind="stable")
    return schema.conform(stats, schema.UNIT_STATS, table="unit_stats")


def _num(value: float) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else round(float(value), 2)


def _int_or_none(value: float) -> int | None:
    return None if value is None or not math.isfinite(float(value)) or value < 0 else int(value)


class UnitSummary(msgspec.Struct, kw_only=True):
    """One entry of the summary's ``units``: a unit's medians over ranks and steps, per step.

    The contract keys come first (``name`` ... ``peak_allocated_bytes``), then more detail; ``None``
    where a number does not exist (a unit that gathers nothing has no prefetch lead)."""

    name: str
    param_numel: int | None
    all_gather_ms: float | None
    forward_ms: float | None
    backward_ms: float | None
    reduce_scatter_ms: float | None
    exposed_comm_ms: float | None
    prefetch_lead_ms: float | None
    peak_allocated_bytes: int | None
    order: int
    param_bytes: int | None
    all_reduce_ms: float | None
    forward_exposed_all_gather_ms: float | None
    backward_exposed_all_gather_ms: float | None
    exposed_reduce_scatter_ms: float | None
    forward_prefetch_lead_ms: float | None
    backward_prefetch_lead_ms: float | None
    forward_issue_depth: float | None
    backward_issue_depth: float | None
    forward_peak_allocated_bytes: int | None
    backward_peak_allocated_bytes: int | None
    unsharded_bytes: int | None
    samples: int
    dtype: str = ""
    """The gathered parameters' dtype ("" where unknown)."""
    forward_timer_ms: float | None = None
    backward_timer_ms: float | None = None
    """The unit's own work in its forward / backward as fsdpviz's timers clock it in the steps the
    profiler did not slow (``forward_ms`` / ``backward_ms``: the trace's profiled steps, moved to the
    run's clock); None without timers for the unit in every such step."""
    param_scope: str | None = None
    """``local``: ``param_numel`` / ``param_bytes`` are one rank's part after tensor parallelism split the
    parameters; ``global``: the whole parameters (no tensor parallelism); None where unknown."""
    size_source: str = ""
    """Where ``param_numel`` / ``param_bytes`` come from: ``run.json`` (the framework's objects, as
    ``fsdpviz record`` read them), ``trace`` (the unit's all-gathers' arguments), "" (unknown)."""
    host_wait_ms: float | None = None
    """Per step, the GPU idle that waited for launches the host made in this unit's passes (its hooks,
    copy-in and copy-out launches, its modules' kernels): what fewer or larger units save (analysis/bound.py);
    None on a CPU rank or without launches in the trace."""
    peak_categories: PeakCategories | None = None
    """At the unit's highest window peak (over ranks, steps and phases), what the allocated level
    held by category (summary.PeakCategories); None without memory samples."""

    def metric(self, key: str) -> float | int | None:
        """A number by its JSON key (compare sums them over unit groups)."""
        value = getattr(self, key, None)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _times(ns: Any, k: float) -> float | None:
    return None if ns is None else float(ns) * k


def moved_pass_ns(ns: pd.Series, host_gap: pd.Series, idle_gap: pd.Series, device_scale: float = 1.0,
                  host_scale: float = 1.0, idle_scale: float = 1.0) -> pd.Series:
    """Unit passes (``ns``) on the run's clock: on a GPU a pass runs from its first kernel to its last, so
    it holds the idle between them (``host_gap``: waiting for a launch; ``idle_gap``: the rest; -1:
    unknown, a CPU rank's), which the de-profiler moves as it moves the step's (by ``host_scale``,
    ``idle_scale``) while the kernels move by ``device_scale`` (:mod:`fsdpviz.structure.deprofile`); a pass
    without known gaps by ``device_scale`` alone."""
    host, idle = host_gap.clip(lower=0), idle_gap.clip(lower=0)
    return ns * device_scale - host * (device_scale - host_scale) - idle * (device_scale - idle_scale)


def summary_records(stats: pd.DataFrame, units: pd.DataFrame | None = None, device_scale: float = 1.0,
                    host_scale: float = 1.0, comm_scale: float | None = None) -> list[UnitSummary]:
    """The summary's ``units`` from UNIT_STATS (with each unit's dtype and size source from UNITS),
    in forward order, their times moved to the run's clock (:mod:`fsdpviz.structure.deprofile`): the
    device's (the prefetch leads) by ``device_scale``, the collectives' (all-gathers, reduce-scatters,
    all-reduces, their exposed parts) by ``comm_scale`` (None: ``device_scale``), the host wait by
    ``host_scale`` (the bound's factors; 1: as traced), a
    pass as the run's analysis moved it (``forward_clock_ns``: :func:`moved_pass_ns`, rank-step by
    rank-step)."""
    info: dict[str, tuple[str, str]] = {}
    if units is not None and len(units):
        info = dict(zip(units["unit"].astype(str), zip(units["dtype"].astype(str), units["size_source"].astype(str))))

    def device(ns: Any) -> float | None:
        return ms(_times(ns, device_scale))

    def comm(ns: Any) -> float | None:
        return ms(_times(ns, device_scale if comm_scale is None else comm_scale))

    records = []
    for r in stats.to_dict(orient="records"):
        dtype, source = info.get(r["unit"], ("", ""))
        source = source if r["param_bytes"] > 0 else ""
        lead = r["forward_prefetch_lead_ns"]
        records.append(UnitSummary(
            name=r["unit"],
            param_numel=_int_or_none(r["param_numel"]),
            all_gather_ms=comm(r["all_gather_ns"]),
            forward_ms=ms(r["forward_clock_ns"]),
            backward_ms=ms(r["backward_clock_ns"]),
            reduce_scatter_ms=comm(r["reduce_scatter_ns"]),
            exposed_comm_ms=comm(r["exposed_comm_ns"]),
            prefetch_lead_ms=device(lead if math.isfinite(lead) else r["backward_prefetch_lead_ns"]),
            peak_allocated_bytes=_int_or_none(r["peak_allocated_bytes"]),
            order=int(r["order"]),
            param_bytes=_int_or_none(r["param_bytes"]),
            all_reduce_ms=comm(r["all_reduce_ns"]),
            forward_exposed_all_gather_ms=comm(r["forward_ag_exposed_ns"]),
            backward_exposed_all_gather_ms=comm(r["backward_ag_exposed_ns"]),
            exposed_reduce_scatter_ms=comm(r["rs_exposed_ns"]),
            forward_prefetch_lead_ms=device(r["forward_prefetch_lead_ns"]),
            backward_prefetch_lead_ms=device(r["backward_prefetch_lead_ns"]),
            forward_issue_depth=_num(r["forward_issue_depth"]),
            backward_issue_depth=_num(r["backward_issue_depth"]),
            forward_peak_allocated_bytes=_int_or_none(r["forward_peak_allocated_bytes"]),
            backward_peak_allocated_bytes=_int_or_none(r["backward_peak_allocated_bytes"]),
            unsharded_bytes=_int_or_none(r["unsharded_bytes"]),
            samples=int(r["n_samples"]),
            dtype=dtype,
            size_source=source,
            host_wait_ms=ms(_times(r["host_wait_ns"], host_scale)),
        ))
    return records
