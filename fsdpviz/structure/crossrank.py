"""Across ranks: whose clock to trust, who started collectives late, and by how much.

**Matching.** Ranks issue the collectives of one process group in the same order (NCCL and gloo
require it), so the k-th collective of a kind on a group in step S is the same collective on every
rank: the match key is ``(step, pg, comm, seq)``. Point-to-point sends and receives are not
collectives in this sense and are not matched.

**Clocks.** A collective ends at about the same instant on all its ranks (it cannot end before
the last rank joins, and then all finish together). So the offset of rank r's clock from the
reference rank's is the median over matched collectives of ``end_r - end_ref``. Ranks on one host
share a clock and the estimate is noise; it is applied only when the clocks demonstrably disagree:
when more than a tenth of the matched collectives end on one rank before they start on the other
(impossible on one clock), or when the offset exceeds 1 ms with little spread.

**Skew.** After alignment, a collective's start skew is its latest start minus its earliest start;
a rank's lateness in a step is the sum over the step's collectives of how much later it started
them than the earliest rank: the time others spent waiting for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure.categorical import as_str
from fsdpviz.trace import schema

if TYPE_CHECKING:
    from fsdpviz.trace.tables import TraceSet

CAUSALITY_TOLERANCE_NS: Final = 10_000
VIOLATION_FRACTION: Final = 0.1
LARGE_OFFSET_NS: Final = 1_000_000


# Point-to-point sends/receives pair different ranks and need not end together; an unclassified
# communication kernel (RCCL Generic) may be either: neither is matched across ranks.
UNMATCHED_COMMS: Final = (vocabulary.SEND_RECV, vocabulary.OTHER_COMM)


def with_seq(collectives: pd.DataFrame) -> pd.DataFrame:
    """Collectives of all ranks with ``seq``: their order within (rank, step, pg, comm). A
    collective listed once per unit it carried (ZeRO-3 buckets) is kept once; point-to-point
    and unclassified communication is left out."""
    c = collectives[~collectives["comm"].isin(list(UNMATCHED_COMMS)).to_numpy()]
    c = c.drop_duplicates(["rank", "lane", "start_ns", "end_ns", "comm", "pg"])
    c = c.sort_values(["rank", "step", "pg", "comm", "start_ns"], kind="stable")
    return c.assign(seq=c.groupby(["rank", "step", "pg", "comm"], sort=False).cumcount().to_numpy())


KEY: Final = ["step", "pg", "comm", "seq"]


def _compare(mine: pd.DataFrame, other: pd.DataFrame) -> tuple[int, bool, int, int]:
    """(offset, clocks disagree, matched, violations) of ``mine`` against ``other``'s times."""
    m = mine.merge(other, on=KEY, suffixes=("", "_ref"))
    if m.empty:
        return 0, False, 0, 0
    delta = (m["end_ns"] - m["end_ns_ref"]).to_numpy(np.int64)
    offset = int(np.median(delta))
    spread = float(np.median(np.abs(delta - offset)))
    tol = CAUSALITY_TOLERANCE_NS
    violations = int(((m["end_ns"] < m["start_ns_ref"] - tol) | (m["end_ns_ref"] < m["start_ns"] - tol)).sum())
    disagree = violations > VIOLATION_FRACTION * len(m) or (abs(offset) > LARGE_OFFSET_NS and spread < abs(offset) / 10)
    return offset, bool(disagree), len(m), violations


def estimate_clocks(coll: pd.DataFrame, ranks: list[int]) -> pd.DataFrame:
    """CLOCK: each rank's offset from the lowest rank, and whether it should be applied.

    A rank is compared with the reference rank when they share collectives, else with any rank
    already placed on the reference clock (HSDP: a rank of another shard group is reached through
    the replica group it shares with a placed rank).
    """
    ref = min(ranks)
    cols = KEY + ["start_ns", "end_ns"]
    by_rank = {r: coll.loc[coll["rank"] == r, cols] for r in ranks}
    placed: dict[int, pd.DataFrame] = {ref: by_rank[ref]}  # times on the reference clock
    rows = {ref: {"rank": ref, "offset_ns": 0, "applied": False, "n_matched": len(by_rank[ref]), "n_violations": 0}}
    pending = [r for r in ranks if r != ref]
    while pending:
        progress = False
        for rank in list(pending):
            for anchor in sorted(placed, key=lambda a: (a != ref, a)):
                offset, disagree, n, violations = _compare(by_rank[rank], placed[anchor])
                if n == 0:
                    continue
                shift = offset if disagree else 0
                mine = by_rank[rank]
                placed[rank] = mine.assign(start_ns=mine["start_ns"] - shift, end_ns=mine["end_ns"] - shift)
                rows[rank] = {"rank": rank, "offset_ns": offset, "applied": disagree, "n_matched": n,
                              "n_violations": violations}
                pending.remove(rank)
                progress = True
                break
        if not progress:  # ranks sharing no collective with any placed rank keep their clock
            for rank in pending:
                rows[rank] = {"rank": rank, "offset_ns": 0, "applied": False, "n_matched": 0, "n_violations": 0}
            break
    frame = pd.DataFrame([rows[r] for r in ranks])
    return schema.conform(frame, schema.CLOCK, table="clock")


def applied_offsets(clock: pd.DataFrame) -> dict[int, int]:
    """rank -> ns to subtract from its times (0 for ranks whose clock is kept)."""
    return {int(rank): (int(offset) if applied else 0) for rank, offset, applied in
            zip(clock["rank"].to_numpy(), clock["offset_ns"].to_numpy(), clock["applied"].to_numpy())}


def shift_times(frame: pd.DataFrame, offsets: dict[int, int], cols: Sequence[str],
                markers: Sequence[str] = ()) -> pd.DataFrame:
    """Move each rank's times onto the reference clock: subtract its offset from ``cols``.
    Columns in ``markers`` use ``-1`` for "none" and keep it."""
    if frame.empty or not any(offsets.values()):
        return frame
    delta = frame["rank"].map(offsets).fillna(0).astype(np.int64).to_numpy()
    moved = {}
    for col in cols:
        values = frame[col].to_numpy()
        moved[col] = np.where(values >= 0, values - delta, values) if col in markers else values - delta
    # only the moved columns are new, copy-on-write shares the rest: aligning a run's events costs
    # their time column, not a copy of every event
    return frame.assign(**moved)


def aligned_traces(traces: TraceSet, offsets: dict[int, int]) -> TraceSet:
    """``traces`` with each rank's event, step and memory times moved onto the reference clock
    (``offsets``: :func:`applied_offsets`); ``traces`` itself when no clock was moved."""
    if not any(offsets.values()):
        return traces
    return replace(traces, events=shift_times(traces.events, offsets, ("start_ns",)),
                   steps=shift_times(traces.steps, offsets, ("start_ns", "end_ns")),
                   memory=shift_times(traces.memory, offsets, ("t_ns",)))


def collective_skew(coll: pd.DataFrame, ref_rank: int) -> pd.DataFrame:
    """SKEW: per collective seen on two or more ranks (times already aligned)."""
    # Sorted once by the collective's key, then by start and rank: each collective is a run of rows, its
    # first row the early rank (ties: the lowest) and its first row by latest start the late one. In
    # numpy over the key's codes: a dozen pandas sorts, groupbys and joins cost a few per cent of a
    # small run's summary.
    keys = coll[KEY]
    known = keys.notna().all(axis=1).to_numpy()  # a key with a gap names no collective (as groupby drops it)
    c = coll[known]
    if c.empty:
        return schema.make_empty(schema.SKEW)
    codes = [c[col].to_numpy(np.int64) if col in ("step", "seq") else pd.factorize(c[col], sort=True)[0]
             for col in KEY]
    start = c["start_ns"].to_numpy(np.int64)
    rank = c["rank"].to_numpy(np.int64)
    key_order = codes[::-1]  # np.lexsort sorts by its last key first
    order = np.lexsort((rank, start, *key_order))
    keyed = np.stack([k[order] for k in codes])
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = (keyed[:, 1:] != keyed[:, :-1]).any(axis=0)
    group_start = np.flatnonzero(new_group)
    size = np.diff(np.append(group_start, len(order)))
    gid = np.empty(len(order), dtype=np.int64)
    gid[order] = np.cumsum(new_group) - 1
    shared = size > 1
    if not shared.any():
        return schema.make_empty(schema.SKEW)
    first_rows = order[group_start]
    late_rows = np.lexsort((rank, -start, gid))[group_start]  # same groups, same sizes, same order
    # the unit it belongs to: as the reference rank saw it, else the lowest rank that attributed it
    named = np.flatnonzero((c["kind"] != "").to_numpy(dtype=bool, na_value=False))
    unit, phase, kind = (np.full(len(group_start), "", dtype=object) for _ in range(3))
    if len(named):
        by = named[np.lexsort((start[named], rank[named], rank[named] != ref_rank, gid[named]))]
        firsts = by[np.r_[True, gid[by][1:] != gid[by][:-1]]]
        for out_col, col in ((unit, "unit"), (phase, "phase"), (kind, "kind")):
            out_col[gid[firsts]] = as_str(c[col])[firsts]
    first = start[first_rows]
    out = pd.DataFrame({col: c[col].to_numpy()[first_rows] for col in KEY})
    out = out.assign(unit=unit, phase=phase, kind=kind, n_ranks=size, first_start_ns=first,
                     start_skew_ns=start[late_rows] - first, late_rank=rank[late_rows],
                     early_rank=rank[first_rows])[shared]
    return schema.conform(out.sort_values("first_start_ns", kind="stable").reset_index(drop=True), schema.SKEW,
                          table="skew")


def rank_lateness(coll: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, step): sum over the step's matched collectives of start - earliest start."""
    if coll.empty:
        return pd.DataFrame({"rank": pd.Series(dtype="int32"), "step": pd.Series(dtype="int32"),
                             "late_ns": pd.Series(dtype="int64")})
    g = coll.groupby(KEY, sort=False)
    c = coll.assign(first=g["start_ns"].transform("min"), n=g["rank"].transform("size"))
    c = c[c["n"] > 1]
    late = (c["start_ns"] - c["first"]).rename("late_ns")
    return c.assign(late_ns=late).groupby(["rank", "step"], as_index=False)["late_ns"].sum()
