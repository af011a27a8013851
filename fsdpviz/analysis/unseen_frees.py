"""Blocks the CPU profiler saw allocated and never saw freed: when they died, and the level without them.

torch's CPU allocator tells the profiler of an allocation or a free on the thread that makes it, and
only where the profiler follows that thread. It does not follow gloo's worker threads
(``pt_gloo_runloop``): a block whose last reference a gloo thread drops is freed without an event --
gloo's copy of a reduce-scatter's input, an all-gather's output that FSDP let go while the
collective still held it. Worse, the running total the profiler writes (``Total Allocated``) is
kept by the same reporter that missed the free: it never comes down. Each such block stays in the
level for the rest of the trace, so the level climbs from step to step and a peak counts every
block freed unseen since the trace began (tests/integration/test_unseen_frees_cpu.py holds a
recording's peaks to torch's own FSDP memory tracker).

The trace still says when each block died:

- **the collective's completion**: a block made while a collective was issued (inside its
  ``c10d::*`` op: gloo's copy of the input) or as its buffer (inside FSDP2's ``FSDP::all_gather``)
  and freed unseen was freed by the gloo thread that ran the collective, when it finished: at the
  end of that collective (the one whose issuing op holds the allocation, else the first issued
  after it on the rank; :mod:`fsdpviz.structure.collectives` pairs issue and run). An all-gather's
  output also lives until FSDP2 has copied the parameters out of it: not before the end of the
  unit's next ``FSDP::all_gather_copy_out`` (on a recording, the level had let one go at its
  collective's end while the copy-out still read it);
- **the reuse of its address**: the allocator hands an address out again only once it is free, so
  an allocation at an address whose last event was an allocation means the block there had died
  (certain, and the latest it can have died).

A block never freed, never reused and made for no collective stays: the trace cannot tell it from
memory that lives on (the last step's gradients, the optimizer's state).

Each time is the earliest the block can have died, not when it did: a gather's output whose last
reference gloo's thread drops dies whenever that thread gets to it, which can be milliseconds after
FSDP let it go (once in three recordings made beside other jobs, torch's ``FSDPMemTracker`` counted one
such block, 1,053,696 B, at a sample where the settled level had it dead, and its peak was 4,096 B
higher). So a settled peak can read short of
the run's by at most the blocks freed unseen in its step (``memory.not_seen_freed`` counts them).

:func:`unseen_frees` finds the blocks of one rank and :func:`settle` puts a free event at each
death and takes the block out of the level from then on. Only CPU levels are settled: a GPU
allocator's level is its own count, which came down when the block was freed, seen or not.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pandas as pd

from fsdpviz.analysis.memory_categories import pair_frees
from fsdpviz.structure.intervals import Intervals, covers
from fsdpviz.trace import schema

COLLECTIVE_END: Final = "collective_end"  # freed when the collective that used it finished
ADDRESS_REUSE: Final = "address_reuse"  # freed before its address was handed out again
# One row per block freed unseen, on the rank's own clock.
UNSEEN_FREES: Final[schema.Schema] = {"rank": "int32", "addr": "int64", "bytes": "int64", "alloc_ns": "int64",
                                      "free_ns": "int64", "basis": "string"}
_NEVER: Final = np.iinfo(np.int64).max


def issue_ends(collectives: pd.DataFrame, events: pd.DataFrame) -> np.ndarray:
    """Per collective row (COLLECTIVES), the end of its issuing op (its ``issue_ns`` on its
    ``issue_lane`` among ``events``); -1 where the op is not among them."""
    out = np.full(len(collectives), -1, dtype=np.int64)
    if collectives.empty or events.empty:
        return out
    ops = events[(events["kind"] == schema.KIND_CPU_OP).to_numpy()]
    ends = pd.Series((ops["start_ns"] + ops["dur_ns"]).to_numpy(np.int64),
                     index=pd.MultiIndex.from_arrays([ops["lane"].astype(str).to_numpy(),
                                                      ops["start_ns"].to_numpy(np.int64)]))
    ends = ends[~ends.index.duplicated(keep="last")]  # nested ops opening together: the outer one ends last
    key = pd.MultiIndex.from_arrays([collectives["issue_lane"].astype(str).to_numpy(),
                                     collectives["issue_ns"].to_numpy(np.int64)])
    return ends.reindex(key).fillna(-1).to_numpy(np.int64)


def unseen_frees(rank: int, samples: pd.DataFrame, collectives: pd.DataFrame, events: pd.DataFrame,
                 gather_buffers: Intervals, gathers: pd.DataFrame | None = None,
                 copy_outs: pd.DataFrame | None = None) -> pd.DataFrame:
    """UNSEEN_FREES of one rank (see the module docstring): ``samples`` its device samples by time
    (schema.MEMORY), ``collectives`` its COLLECTIVES (issue point and completion), ``events`` its
    events (the issuing ops' ends), ``gather_buffers`` FSDP2's ``FSDP::all_gather`` ranges, and
    ``gathers`` / ``copy_outs`` the same labels and FSDP2's ``FSDP::all_gather_copy_out`` ones with
    their units (start_ns, end_ns, unit; by start), for when FSDP let each gather's output go."""
    t = samples["t_ns"].to_numpy(np.int64)
    delta = samples["delta_bytes"].to_numpy(np.int64)
    addr = samples["addr"].to_numpy(np.int64)
    freed_at, _ = pair_frees(addr, delta)
    lost = np.flatnonzero((delta > 0) & (freed_at < 0) & (addr >= 0))
    if not len(lost):
        return schema.make_empty(UNSEEN_FREES)
    # the next event at each block's address: an allocation there means the block had died
    idx = np.flatnonzero((addr >= 0) & (delta != 0))
    idx = idx[np.lexsort((idx, addr[idx]))]
    following = np.full(len(t), -1, dtype=np.int64)
    same = addr[idx[:-1]] == addr[idx[1:]]
    following[idx[:-1][same]] = idx[1:][same]
    nxt = following[lost]
    reused = np.where((nxt >= 0) & (delta[np.clip(nxt, 0, None)] > 0), t[np.clip(nxt, 0, None)], _NEVER)
    done, output = _collective_end(t[lost], collectives, events, covers(gather_buffers, t[lost]))
    if gathers is not None and copy_outs is not None:  # an output: not before FSDP's copy-out read it
        done = np.where(done < _NEVER, np.maximum(done, released(t[lost], output, gathers, copy_outs)), done)
    free_ns = np.minimum(done, reused)
    keep = free_ns < _NEVER
    return schema.conform(pd.DataFrame({
        "rank": rank, "addr": addr[lost][keep], "bytes": delta[lost][keep], "alloc_ns": t[lost][keep],
        "free_ns": free_ns[keep],
        "basis": np.where(done[keep] <= reused[keep], COLLECTIVE_END, ADDRESS_REUSE).astype(object)}),
        UNSEEN_FREES, table="unseen frees")


def _collective_end(made: np.ndarray, collectives: pd.DataFrame, events: pd.DataFrame,
                    in_gather_buffer: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per allocation time in ``made``: the end of the collective it was made for -- the one whose
    issuing op holds it, else (made inside FSDP2's gather label, before the op: the all-gather's
    output) the first issued after it -- or _NEVER where it was made for none; and which are such
    outputs."""
    out = np.full(len(made), _NEVER, dtype=np.int64)
    output = np.zeros(len(made), dtype=bool)
    if collectives.empty:
        return out, output
    order = np.argsort(collectives["issue_ns"].to_numpy(np.int64), kind="stable")
    issue = collectives["issue_ns"].to_numpy(np.int64)[order]
    issue_end = issue_ends(collectives, events)[order]
    end = collectives["end_ns"].to_numpy(np.int64)[order]
    known = issue >= 0
    issue, issue_end, end = issue[known], issue_end[known], end[known]
    if not len(issue):
        return out, output
    last = np.searchsorted(issue, made, side="right") - 1  # the latest issued at or before it
    inside = (last >= 0) & (made <= issue_end[np.clip(last, 0, None)])
    out[inside] = end[last[inside]]
    first = np.searchsorted(issue, made, side="left")  # the first issued at or after it
    before_op = ~inside & in_gather_buffer & (first < len(issue))
    out[before_op] = end[first[before_op]]
    return out, before_op


def released(made: np.ndarray, output: np.ndarray, gathers: pd.DataFrame, copy_outs: pd.DataFrame) -> np.ndarray:
    """Per allocation time in ``made``: where it is an all-gather's output (``output``, made inside one of
    ``gathers``), the end of its unit's copy-out that follows it, before that unit's next gather (FSDP2
    reads the output there, then lets it go); -1 elsewhere or where the trace holds no such copy-out."""
    out = np.full(len(made), -1, dtype=np.int64)
    if gathers.empty or copy_outs.empty or not output.any():
        return out
    g_start, g_end = gathers["start_ns"].to_numpy(np.int64), gathers["end_ns"].to_numpy(np.int64)
    g_unit = gathers["unit"].astype(str).to_numpy()
    copies = {str(u): (rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64))
              for u, rows in copy_outs.groupby(copy_outs["unit"].astype(str), sort=False)}
    regathers = {str(u): rows["start_ns"].to_numpy(np.int64)
                 for u, rows in gathers.groupby(gathers["unit"].astype(str), sort=False)}
    for i in np.flatnonzero(output):
        k = int(np.searchsorted(g_start, made[i], side="right")) - 1  # the latest opened before it...
        while k >= 0 and g_end[k] < made[i]:  # ...that still holds it
            k -= 1
        if k < 0 or g_unit[k] not in copies:
            continue
        starts, ends = copies[g_unit[k]]
        j = int(np.searchsorted(starts, made[i], side="left"))
        again = regathers[g_unit[k]]
        later = again[again > g_start[k]]
        if j < len(starts) and (not len(later) or starts[j] < later.min()):
            out[i] = int(ends[j])
    return out


def settle(samples: pd.DataFrame, frees: pd.DataFrame) -> pd.DataFrame:
    """One rank's ``samples`` (schema.MEMORY, by time) with a free event at each block of ``frees``
    (UNSEEN_FREES of that rank, same clock) and every level from then on without it; ``samples``
    itself when there is none. A free sorts before the samples at its own time (the allocation that
    reused its address among them)."""
    if frees.empty or samples.empty:
        return samples
    first = samples.iloc[0]
    added = pd.DataFrame({"rank": first["rank"], "device": first["device"],
                          "t_ns": frees["free_ns"].to_numpy(np.int64),
                          "allocated_bytes": np.zeros(len(frees), np.int64),
                          "reserved_bytes": np.zeros(len(frees), np.int64),
                          "delta_bytes": -frees["bytes"].to_numpy(np.int64), "addr": frees["addr"].to_numpy(np.int64)})
    merged = pd.concat([added, samples[list(schema.MEMORY)]], ignore_index=True)
    original = np.r_[np.zeros(len(added), bool), np.ones(len(samples), bool)]
    order = np.argsort(merged["t_ns"].to_numpy(np.int64), kind="stable")
    merged, original = merged.iloc[order].reset_index(drop=True), original[order]
    settled = np.cumsum(np.where(original, 0, merged["delta_bytes"].to_numpy(np.int64)))
    for col in ("allocated_bytes", "reserved_bytes"):
        values = merged[col].to_numpy(np.int64).astype(np.float64)
        values[~original] = np.nan
        filled = pd.Series(values).ffill().fillna(float(samples[col].to_numpy(np.int64)[0])).to_numpy(np.int64)
        merged[col] = filled + settled if col == "allocated_bytes" else filled
    return schema.conform(merged, schema.MEMORY, table="memory")


def settle_run(memory: pd.DataFrame, frees: pd.DataFrame, devices: dict[int, str]) -> pd.DataFrame:
    """A run's MEMORY table with each rank's ``frees`` (UNSEEN_FREES, each rank's own clock) settled
    on its analysed device ``devices[rank]``; the other ranks' and devices' samples as they were."""
    if frees.empty or memory.empty:
        return memory
    parts, rest = [], np.ones(len(memory), dtype=bool)
    for rank in sorted(set(frees["rank"].tolist())):
        mine = frees[(frees["rank"] == rank).to_numpy()]
        device = devices.get(int(rank))
        if device is None:
            continue
        rows = ((memory["rank"] == rank) & (memory["device"] == device)).to_numpy()
        rest &= ~rows
        samples = memory[rows].sort_values("t_ns", kind="stable").reset_index(drop=True)
        parts.append(settle(samples, mine))
    out = pd.concat([memory[rest], *parts], ignore_index=True).sort_values("rank", kind="stable")
    return schema.conform(out.reset_index(drop=True), schema.MEMORY, table="memory")
