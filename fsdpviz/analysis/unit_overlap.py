"""Per unit and pass: how long it gathered, computed and reduced, and how much of it was exposed.

One UNIT_STEPS row per rank, step, unit and phase (forward / backward), from the SPANS table.
Each number is first measured per pass of the step (``micro``: one pass, or one per micro-batch
under gradient accumulation) and then folded into the step (:func:`fold_passes`): durations and
exposed times add up, start and end times span all passes, the lead and the issue depth are those
of the pass that waited most (the smallest).

- ``ag_*``: the pass's all-gather(s) of the unit's parameters, issued at ``ag_issue_ns`` on the CPU,
  running ``ag_start_ns`` -> ``ag_end_ns`` on their lane; ``ag_exposed_ns`` is the part of that
  time during which the rank computed nothing (compute as in the whole-step overlap: non-NCCL,
  non-copy kernels on GPU; training-thread ops outside collective calls and waits on CPU).
- ``prefetch_lead_ns`` = start of the unit's compute - end of its gather: positive when the
  parameters were ready before they were needed, ~0 or negative when compute waited.
- ``issue_depth``: how many other units that started computing before this one computed after
  the gather began (the units it was issued ahead of): 0 = gathered only once the previous unit had
  finished (nothing to hide behind), 1 = one unit ahead, 2 = two units ahead... An enclosing unit (the root around
  its blocks) counts as one, and only when no other unit was computing.
- ``rs_*`` / ``ar_*``: the unit's gradient reduce-scatter (and HSDP all-reduce), exposed the same way.

A host backend's collective on CUDA tensors (gloo) is its op on the backend's thread and the copies
it staged through host memory (:mod:`fsdpviz.structure.staging`): its time is the union of both, as
the whole-step overlap and the purposes count it, so the units' communication adds up to theirs.

A collective that carries several units (ZeRO-3 buckets) appears for each of them, but only the
unit that waited for it (see :func:`waited_on`) counts its exposed time, and each counts only its
share of the duration (:func:`collective_shares`): summed over units, every collective counts once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure.intervals import (
    Intervals,
    covered_ns,
    empty_intervals,
    exposed_ns,
    total_ns,
    union_intervals,
)
from fsdpviz.trace import schema

_UNIT_PHASES: Final = (vocabulary.FORWARD, vocabulary.BACKWARD)


def exposed_by_rank(rows: pd.DataFrame, compute: dict[int, Intervals]) -> np.ndarray:
    """``exposed_ns`` of each row (``rank``, ``start_ns``, ``end_ns``) against its rank's compute."""
    out = np.zeros(len(rows), dtype=np.int64)
    if rows.empty:
        return out
    ranks = rows["rank"].to_numpy()
    start = rows["start_ns"].to_numpy(np.int64)
    end = rows["end_ns"].to_numpy(np.int64)
    for rank in np.unique(ranks):
        m = ranks == rank
        out[m] = exposed_ns(start[m], end[m], compute.get(int(rank), empty_intervals()))
    return out


# STAGED: the copies a host backend's collectives staged, one row each: the collective's op
# (``rank``, ``lane``, ``coll_start_ns``, ``coll_end_ns``, as its spans row holds it) and the copy's
# ``start_ns`` / ``end_ns`` (:func:`fsdpviz.structure.staging.staged_copies`).
STAGED_COLUMNS: Final = ("rank", "lane", "coll_start_ns", "coll_end_ns", "start_ns", "end_ns")


def collective_times(rows: pd.DataFrame, compute: dict[int, Intervals],
                     staged: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per collective row (``rank``, ``lane``, ``start_ns``, ``end_ns``): its time and the part of it
    with no compute on the rank; with ``staged`` (:data:`STAGED_COLUMNS`), a host backend's collective
    counts the copies it staged too (one union with its op: a copy that ran beside it counts once)."""
    length = (rows["end_ns"].to_numpy(np.int64) - rows["start_ns"].to_numpy(np.int64)).copy()
    exposed = exposed_by_rank(rows, compute)
    if staged is None or staged.empty or rows.empty:
        return length, exposed
    copies = staged.groupby(["rank", "lane", "coll_start_ns", "coll_end_ns"], sort=False).indices
    copy_start = staged["start_ns"].to_numpy(np.int64)
    copy_end = staged["end_ns"].to_numpy(np.int64)
    keys = zip(rows["rank"].astype(int), rows["lane"].astype(str), rows["start_ns"].astype(np.int64),
               rows["end_ns"].astype(np.int64))
    # each collective with copies: the pieces of its union, then each rank's pieces against its compute
    # in one call (not one pass over the compute set per collective)
    pieces: dict[int, tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}
    for i, (rank, lane, start, end) in enumerate(keys):
        mine = copies.get((rank, lane, start, end))
        if mine is None:
            continue
        lo, hi = union_intervals(np.append(copy_start[mine], start), np.append(copy_end[mine], end))
        length[i] = total_ns((lo, hi))
        starts, ends, owners = pieces.setdefault(rank, ([], [], []))
        starts.append(lo)
        ends.append(hi)
        owners.append(np.full(len(lo), i, dtype=np.int64))
    for rank, (starts, ends, owners) in pieces.items():
        owner = np.concatenate(owners)
        covered = covered_ns(compute.get(rank, empty_intervals()), np.concatenate(starts), np.concatenate(ends))
        under = np.bincount(owner, weights=covered.astype(np.float64), minlength=len(rows))
        at = np.unique(owner)
        exposed[at] = length[at] - np.rint(under[at]).astype(np.int64)
    return length, exposed


def waited_on(rows: pd.DataFrame, comp: pd.DataFrame, gather: bool) -> np.ndarray:
    """Which collective rows count their exposure for their unit. A collective carrying several
    units (``n_units`` > 1, one row each) is waited on by one of them: for a gather the unit that
    starts computing first, for a reduction the unit that finished computing last. Every other
    unit still shows the span (its data moved then) but not its exposed time, so sums over units
    and findings count each collective once."""
    owned = rows["n_units"].to_numpy() <= 1
    if owned.all():
        return owned
    key = ["rank", "step", "micro", "unit", "phase"]
    times = comp.groupby(key).agg(first=("start_ns", "min"), last=("end_ns", "max"))
    shared_at = np.flatnonzero(~owned)
    shared = rows.iloc[shared_at].reset_index(drop=True).join(times, on=key)
    # the smaller the better: earliest compute start (gather), latest compute end (reduction)
    value = shared["first"].astype(float).fillna(np.inf) if gather else -shared["last"].astype(float).fillna(-np.inf)
    group = ["rank", "step", "micro", "phase", "lane", "start_ns"]
    best = value.groupby([shared[c] for c in group]).transform("min")
    candidates = shared[(value == best).to_numpy()]
    winners = candidates.index[~candidates.duplicated(group).to_numpy()]  # ties: the first listed
    owned = owned.copy()
    owned[shared_at] = np.isin(np.arange(len(shared)), winners)
    return owned


def collective_shares(rows: pd.DataFrame, unit_bytes: Mapping[str, int] | None = None) -> np.ndarray:
    """Each collective row's share of its collective's duration: 1 for a collective of one unit;
    for one carrying several units (``n_units`` > 1, one row each) the unit's parameter bytes over
    those of all its units, or an equal share when a size is unknown."""
    n_units = rows["n_units"].to_numpy()
    share = np.ones(len(rows), dtype=np.float64)
    shared_at = np.flatnonzero(n_units > 1)
    if len(shared_at) == 0:
        return share
    sub = rows.iloc[shared_at]
    size = sub["unit"].map(lambda u: (unit_bytes or {}).get(str(u), 0)).astype(np.float64)
    size = size.where(size > 0)
    key = [sub[c] for c in ("rank", "lane", "start_ns", "end_ns", "kind")]
    known = size.notna().groupby(key).transform("all").to_numpy(dtype=bool)
    total = size.groupby(key).transform("sum").to_numpy(dtype=np.float64)
    by_size = np.divide(size.to_numpy(), total, out=np.zeros(len(sub)), where=known & (total > 0))
    share[shared_at] = np.where(known, by_size, 1.0 / n_units[shared_at])
    return share


def _agg(frame: pd.DataFrame, key: list[str], **named: tuple[str, str]) -> pd.DataFrame:
    """groupby-agg with nullable integers, so joins that leave gaps never round ns times to float."""
    return frame.groupby(key).agg(**named).astype("Int64")


def _reduce_at(ufunc: np.ufunc, codes: np.ndarray, n: int, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per group code, ``ufunc`` (np.minimum / np.maximum) over ``values`` of the ``rows``; -1 where the
    group has none."""
    info = np.iinfo(np.int64)
    out = np.full(n, info.max if ufunc is np.minimum else info.min, dtype=np.int64)
    ufunc.at(out, codes[rows], values[rows])
    seen = np.zeros(n, dtype=bool)
    seen[codes[rows]] = True
    return np.where(seen, out, -1)


def _sum_at(codes: np.ndarray, n: int, rows: np.ndarray, values: np.ndarray, absent: int = 0) -> np.ndarray:
    """Per group code, the sum of ``values`` over the ``rows``, as int64; ``absent`` where the group has none."""
    at, vals = codes[rows], values[rows]
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, at, vals.astype(np.int64))
    if absent:
        seen = np.zeros(n, dtype=bool)
        seen[at] = True
        out[~seen] = absent
    return out


def _waited_sum(codes: np.ndarray, n: int, known: np.ndarray, rows: np.ndarray, exposed: np.ndarray,
                spans: pd.DataFrame, comp: pd.DataFrame, gather: bool) -> np.ndarray:
    """Per group code, the exposed time of the collective ``rows`` their unit waited on
    (:func:`waited_on`, which chooses among all of them), summed over those with a known key."""
    waited = np.zeros(len(rows), dtype=np.int64)
    waited[rows] = exposed[rows] * waited_on(spans[rows], comp, gather=gather)
    return _sum_at(codes, n, rows & known, waited)


def issue_depths(ag: pd.DataFrame, pieces: pd.DataFrame, ancestors: dict[str, set[str]] | None = None) -> np.ndarray:
    """Per gather row (``rank``, ``step``, ``micro``, ``phase``, ``unit``, ``ag_start_ns``,
    ``compute_start_ns``): the number of other units with a compute span of the same rank, step and
    pass that began before the unit's own compute and ended after the gather started: the units that
    computed between the gather's issue and its unit's compute, the depth it was issued ahead."""
    depth = np.full(len(ag), schema.NO_DEPTH, dtype=np.int64)
    key = ["rank", "step", "micro", "phase"]
    # Units as codes once for the whole table, and "is u an ancestor of g" as one boolean matrix:
    # the per-group work below is then array indexing, not Python loops over unit pairs.
    unit_codes, units = pd.factorize(pd.concat([pieces["unit"].astype(object), ag["unit"].astype(object)],
                                               ignore_index=True))
    piece_unit, ag_unit = unit_codes[:len(pieces)], unit_codes[len(pieces):]
    names = [str(u) for u in units]
    is_ancestor = np.array([[u in (ancestors or {}).get(g, set()) for u in names] for g in names],
                           dtype=bool).reshape(len(names), len(names))
    piece_start = pieces["start_ns"].to_numpy(np.int64)
    piece_end = pieces["end_ns"].to_numpy(np.int64)
    compute_start = ag["compute_start_ns"].to_numpy(np.int64)
    first_all = np.where(compute_start >= 0, compute_start, ag["ag_end_ns"].to_numpy(np.int64))
    ag_start = ag["ag_start_ns"].to_numpy(np.int64)
    groups = pieces.groupby(key, sort=False).indices
    for group, rows in ag.groupby(key, sort=False).indices.items():
        idx = groups.get(group)
        if idx is None:
            depth[rows] = 0
            continue
        p_unit = piece_unit[idx]
        gathered = ag_unit[rows]
        hits = ((p_unit[None, :] != gathered[:, None])
                & (piece_start[idx][None, :] < first_all[rows][:, None])
                & (piece_end[idx][None, :] > ag_start[rows][:, None]))
        # distinct units: a unit computing in two pieces (the root around its children) counts once
        present, local = np.unique(p_unit, return_inverse=True)
        one_hot = np.zeros((len(idx), len(present)), dtype=np.float32)
        one_hot[np.arange(len(idx)), local.reshape(-1)] = 1.0
        per_unit = (hits.astype(np.float32) @ one_hot) > 0
        # An enclosing unit's own compute (the root's embedding, or its glue between blocks) is
        # not a unit ahead: it counts as one only when nothing else hid the gather.
        is_anc = is_ancestor[np.ix_(gathered, present)]
        others = (per_unit & ~is_anc).sum(axis=1)
        depth[rows] = np.where(others > 0, others, (per_unit & is_anc).any(axis=1).astype(np.int64))
    return depth


def unit_steps(spans: pd.DataFrame, windows: pd.DataFrame, compute: dict[int, Intervals],
               ancestors: dict[str, set[str]] | None = None,
               unit_bytes: Mapping[str, int] | None = None, staged: pd.DataFrame | None = None) -> pd.DataFrame:
    """UNIT_STEPS from spans and unit windows; ``compute``: each rank's compute union;
    ``unit_bytes``: the units' parameter bytes, for their shares of shared collectives; ``staged``: the
    copies host backends' collectives staged (:data:`STAGED_COLUMNS`, counted with their collective)."""
    s = spans[(spans["unit"] != "").to_numpy() & spans["phase"].isin(list(_UNIT_PHASES)).to_numpy()]
    key = ["rank", "step", "micro", "unit", "phase"]
    if s.empty:
        return schema.make_empty(schema.UNIT_STEPS)
    start = s["start_ns"].to_numpy(np.int64)
    end = s["end_ns"].to_numpy(np.int64)
    kind = s["kind"].to_numpy(dtype=object)
    is_collective = np.isin(kind, list(vocabulary.UNIT_COLLECTIVES))
    length = end - start
    exposed = np.zeros(len(s), dtype=np.int64)
    length[is_collective], exposed[is_collective] = collective_times(s[is_collective], compute, staged)
    # a collective carrying several units counts its duration once over them (shares by size)
    dur = np.rint(length * collective_shares(s, unit_bytes)).astype(np.int64)
    # One row per (rank, step, micro, unit, phase) in the order the spans first name it; every column
    # below is one numpy reduction over the rows' group codes (a groupby and a join per column were 9 %
    # of an in-process summary of a sample, in a sampling profile). A key with a gap (a hand-made table;
    # conformed spans have none) keeps its row, with nothing counted for it.
    codes = s.groupby(key, sort=False, observed=True, dropna=False).ngroup().to_numpy()
    known = s[key].notna().all(axis=1).to_numpy()
    n = int(codes.max()) + 1
    first_row = np.full(n, len(s), dtype=np.int64)
    np.minimum.at(first_row, codes, np.arange(len(s)))
    out = s[key].iloc[first_row].reset_index(drop=True)
    is_kind = {k: kind == k for k in (vocabulary.COMPUTE, vocabulary.ALL_GATHER, vocabulary.REDUCE_SCATTER,
                                      vocabulary.ALL_REDUCE, vocabulary.COPY_IN, vocabulary.COPY_OUT,
                                      vocabulary.RESHARD)}
    by_kind = {k: rows & known for k, rows in is_kind.items()}
    comp = s[is_kind[vocabulary.COMPUTE]]
    compute_rows, ag_rows = by_kind[vocabulary.COMPUTE], by_kind[vocabulary.ALL_GATHER]
    out["compute_start_ns"] = _reduce_at(np.minimum, codes, n, compute_rows, start)
    out["compute_end_ns"] = _reduce_at(np.maximum, codes, n, compute_rows, end)
    out["compute_ns"] = _sum_at(codes, n, compute_rows, dur)
    out["ag_issue_ns"] = _reduce_at(np.minimum, codes, n, ag_rows, s["issue_ns"].to_numpy(np.int64))
    out["ag_start_ns"] = _reduce_at(np.minimum, codes, n, ag_rows, start)
    out["ag_end_ns"] = _reduce_at(np.maximum, codes, n, ag_rows, end)
    out["ag_bytes"] = _sum_at(codes, n, ag_rows, s["bytes"].to_numpy(np.int64), absent=-1)
    out["ag_ns"] = _sum_at(codes, n, ag_rows, dur)
    out["ag_exposed_ns"] = _waited_sum(codes, n, known, is_kind[vocabulary.ALL_GATHER], exposed, s, comp,
                                       gather=True)
    for k, col in ((vocabulary.REDUCE_SCATTER, "rs"), (vocabulary.ALL_REDUCE, "ar")):
        rows = by_kind[k]
        out[f"{col}_ns"] = _sum_at(codes, n, rows, dur)
        out[f"{col}_exposed_ns"] = _waited_sum(codes, n, known, is_kind[k], exposed, s, comp, gather=False)
    for k, col in ((vocabulary.COPY_IN, "copy_in_ns"), (vocabulary.COPY_OUT, "copy_out_ns"),
                   (vocabulary.RESHARD, "reshard_ns")):
        out[col] = _sum_at(codes, n, by_kind[k], dur)
    w = _agg(windows, key, window_start_ns=("start_ns", "min"), window_end_ns=("end_ns", "max"))
    at = w.reindex(pd.MultiIndex.from_frame(out[key]))
    for col in ("window_start_ns", "window_end_ns"):
        out[col] = at[col].fillna(-1).to_numpy(np.int64)
    has_ag = (out["ag_end_ns"] >= 0).to_numpy()
    has_comp = (out["compute_start_ns"] >= 0).to_numpy()
    lead = (out["compute_start_ns"] - out["ag_end_ns"]).to_numpy(dtype=np.int64).astype(np.float64)
    out["prefetch_lead_ns"] = np.where(has_ag & has_comp, lead, np.nan)
    depth = np.full(len(out), schema.NO_DEPTH, dtype=np.int64)
    if has_ag.any():
        depth[has_ag] = issue_depths(out[has_ag].reset_index(drop=True), comp, ancestors)
    out["issue_depth"] = depth
    out["peak_allocated_bytes"] = -1
    # filled per GPU rank by the run's analysis (analysis/bound.py)
    out["host_wait_ns"] = out["host_gap_ns"] = out["idle_gap_ns"] = -1
    out["compute_clock_ns"] = np.nan  # moved by the run's analysis, once the run's clock is known
    return schema.conform(fold_passes(out), schema.UNIT_STEPS, table="unit_steps")


_FIRST_COLS = ("window_start_ns", "compute_start_ns", "ag_issue_ns", "ag_start_ns")
_LAST_COLS = ("window_end_ns", "compute_end_ns", "ag_end_ns")
_SUM_COLS = ("compute_ns", "ag_ns", "ag_exposed_ns", "rs_ns", "rs_exposed_ns", "ar_ns", "ar_exposed_ns",
             "copy_in_ns", "copy_out_ns", "reshard_ns")


def fold_passes(per_pass: pd.DataFrame) -> pd.DataFrame:
    """Rows per (rank, step, micro, unit, phase) -> one row per (rank, step, unit, phase) with
    ``n_passes``: sums of durations, the earliest start and latest end (``-1`` = none), the
    smallest lead and issue depth, the sum of the gathered bytes."""
    key = ["rank", "step", "unit", "phase"]
    with_window = (per_pass["window_start_ns"] >= 0).to_numpy()
    if not per_pass.duplicated(key).any():  # one pass per step (no gradient accumulation): nothing to add up
        return per_pass.assign(n_passes=with_window.astype(np.int32)).drop(columns="micro")
    frame = per_pass.assign(_window=with_window)
    for col in (*_FIRST_COLS, *_LAST_COLS, "ag_bytes", "issue_depth"):
        # -1 / NO_DEPTH: nothing to count. Nullable integers: float64 would round ns wall-clock times.
        frame[col] = frame[col].astype("Int64").where(frame[col] >= 0)
    grouped = frame.groupby(key, sort=False)
    out = grouped[list(_SUM_COLS)].sum()
    out = out.join(grouped[list(_FIRST_COLS)].min()).join(grouped[list(_LAST_COLS)].max())
    out["ag_bytes"] = grouped["ag_bytes"].sum(min_count=1)
    out["prefetch_lead_ns"] = grouped["prefetch_lead_ns"].min()
    out["issue_depth"] = grouped["issue_depth"].min()
    out["n_passes"] = grouped["_window"].sum()
    out["peak_allocated_bytes"] = grouped["peak_allocated_bytes"].max()
    for col in ("host_wait_ns", "host_gap_ns", "idle_gap_ns", "compute_clock_ns"):  # filled after folding
        out[col] = grouped[col].max()
    out = out.reset_index()
    for col in (*_FIRST_COLS, *_LAST_COLS, "ag_bytes", "issue_depth"):
        out[col] = out[col].fillna(-1).astype(np.int64)
    return out
