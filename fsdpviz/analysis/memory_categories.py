"""Memory by category: what the allocated level is made of, read off the allocator's own events.

Every ``[memory]`` event is one allocation (+) or free (-) of a block at an address; a free is paired
with the allocation at its address before it. An allocation's category follows from where it was
made (the labels around it) and, where that is not enough, from where its block is freed:

- **unsharded parameters**: made inside a unit's gather labels that hold the parameters themselves
  (FSDP2's ``FSDP::all_gather_copy_out``; ``fsdpviz::all_gather`` of FSDP1 and ZeRO-3, which gather
  straight into the unsharded parameters).
- **communication buffers**: FSDP2's all-gather output (made inside ``FSDP::all_gather``, freed after
  the copy-out) and a reduction's input (made inside a unit's reduction and freed in the step).
- **gradients** (sharded): what a unit's reduction leaves (made inside it, freed by ``zero_grad`` or
  not in the trace) and the gradients of the step before the trace (freed inside
  ``Optimizer.zero_grad`` with no allocation seen).
- **unsharded gradients**: made by backward outside FSDP's labels and freed in FSDP's post-backward
  (the reduction, reshard, accumulation).
- **activations**: made inside a unit's forward window outside FSDP's gather labels.
- **optimizer state**: made inside ``Optimizer.step`` and never freed (its lazy initialisation).
- What was on the device before the trace and stays is divided once the units are known
  (:func:`split_persistent`): the **sharded parameters** are the units' elements over their shard
  groups times the bytes per element (measured from the size of one step's sharded gradients, which
  FSDP keeps in the parameters' dtype; else the units' own), as many **gradients** when the
  reductions made none (they are kept from step to step), the **optimizer state** the states per
  element of the optimizer's class (read off its ``Optimizer.step#Class.step`` label: Adam's two
  moments, ...) in the same dtype; the rest is **other**.
- **other**: the rest -- backward's temporaries and activation gradients, the loss, inputs, the CUDA
  libraries' workspaces.

Each category's level at a sample is its share before the first event plus its blocks' allocations
and frees up to that sample; what the events do not explain (a dropped sample) is ``other``, so the
categories always add up to the allocator's own level.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.analysis.intervals import Intervals, covers, empty_intervals, union_intervals
from fsdpviz.analysis.labels import (
    COPY_OUT_ACTION,
    FAMILY_FSDP2,
    FAMILY_FSDPVIZ,
    FSDP2_REDUCE_ACTION,
    FSDPVIZ_REDUCE_ACTION,
    GATHER_ACTION,
    POST_BACKWARD_ACTIONS,
)
from fsdpviz.trace import schema

SHARDED_PARAMS: Final = "sharded_params"
OPTIMIZER_STATE: Final = "optimizer_state"
GRADIENTS: Final = "gradients"
UNSHARDED_PARAMS: Final = "unsharded_params"
UNSHARDED_GRADS: Final = "unsharded_grads"
COMM_BUFFERS: Final = "comm_buffers"
ACTIVATIONS: Final = "activations"
OTHER: Final = "other"
CATEGORIES: Final = (SHARDED_PARAMS, OPTIMIZER_STATE, GRADIENTS, UNSHARDED_PARAMS, UNSHARDED_GRADS, COMM_BUFFERS,
                     ACTIVATIONS, OTHER)
CODE: Final = {c: k for k, c in enumerate(CATEGORIES)}
# What a rank holds 1/N of when its shard group has N ranks; the rest does not depend on N.
SHARDED: Final = (SHARDED_PARAMS, OPTIMIZER_STATE, GRADIENTS)
TITLES: Final = {SHARDED_PARAMS: "sharded parameters", OPTIMIZER_STATE: "optimizer state",
                 GRADIENTS: "gradients (sharded)", UNSHARDED_PARAMS: "unsharded parameters",
                 UNSHARDED_GRADS: "unsharded gradients", COMM_BUFFERS: "communication buffers",
                 ACTIVATIONS: "activations", OTHER: "other"}

ZERO_GRAD_PREFIX: Final = "Optimizer.zero_grad#"
STEP_PREFIX: Final = "Optimizer.step#"
_OPTIMIZER_CLASS_RE: Final = re.compile(r"^Optimizer\.step#(?P<cls>\w+)\.step")
# States per parameter element, each the size of the parameter's element (torch.optim's classes).
OPTIMIZER_STATES: Final = {"Adam": 2, "AdamW": 2, "Adamax": 2, "NAdam": 2, "RAdam": 2, "Adadelta": 2,
                           "Rprop": 2, "Adagrad": 1, "RMSprop": 1}
_ELEMENT_SIZES: Final = (1, 2, 4, 8)
_FSDP1_POST_BACKWARD: Final = "FullyShardedDataParallel._post_backward_hook"

# One row per kept sample: every category's level (bytes). Per rank before the units are known,
# ``sharded_params`` holds the whole persistent share (:func:`apply_split` divides it).
CATEGORY_LEVELS: Final[schema.Schema] = {"rank": "int32", "t_ns": "int64", **{c: "int64" for c in CATEGORIES}}
# The levels at a peak: a step's (unit "") or a unit pass's (its window's highest sample).
CATEGORY_PEAKS: Final[schema.Schema] = {"rank": "int32", "step": "int32", "unit": "string", "phase": "string",
                                        "t_ns": "int64", "allocated_bytes": "int64",
                                        **{c: "int64" for c in CATEGORIES}}
# Per rank, what the persistent share is divided with (:func:`split_persistent`).
MEMORY_FACTS: Final[schema.Schema] = {"rank": "int32", "persistent_bytes": "int64", "reduced_bytes": "int64",
                                      "reductions": "int32", "optimizer_class": "string"}
# The unsharded parameters and all-gather buffers of each unit: one row per block.
UNIT_BLOCKS: Final[schema.Schema] = {"rank": "int32", "unit": "string", "category": "string",
                                     "alloc_ns": "int64", "free_ns": "int64", "bytes": "int64"}
NOT_FREED: Final = np.iinfo(np.int64).max
MAX_CATEGORY_POINTS: Final = 1_000  # per rank: the category levels kept for drawing (the peaks among them)


@dataclass(frozen=True, slots=True)
class Sites:
    """Where a rank's allocations can be made: interval sets on its clock, and the labels that name
    units (to say whose parameters a block holds)."""

    gather_buffer: Intervals  # FSDP2's FSDP::all_gather: the all-gather output
    gather_params: Intervals  # FSDP2's copy-out; fsdpviz's all-gather (FSDP1, ZeRO-3)
    reduce: Intervals  # a unit's gradient reduction
    post_backward: Intervals  # FSDP's post-backward labels (the reduction among them)
    zero_grad: Intervals
    optimizer: Intervals
    forward: Intervals  # units' forward windows
    gather_labels: pd.DataFrame  # start_ns, end_ns, unit of the gather and copy-out labels, by start
    post_labels: pd.DataFrame  # the same of the post-backward labels that name their unit
    optimizer_class: str = ""  # the optimizer's class from its step label ("" when none)


@dataclass(frozen=True, slots=True)
class ShardedState:
    """What the units' shards come to on one rank."""

    elements: float  # sum over units of numel / shard size
    bytes_per_element: int  # of the sharded parameters (and their gradients and optimizer states)
    measured: bool  # bytes per element from the sharded gradients (False: the units' own)


@dataclass(slots=True)
class Categorised:
    """One rank's samples with each one's category and every category's level at it."""

    codes: np.ndarray  # per sample: index into CATEGORIES of the block it allocated or freed
    levels: np.ndarray  # (samples, categories) bytes
    persistent: int  # present before the first sample and never freed (in ``sharded_params`` until split)
    reduced_bytes: int  # sharded gradients one step's reductions leave
    reductions: int  # the units' reductions seen (labels)
    blocks: pd.DataFrame  # UNIT_BLOCKS without the rank

    def at(self, i: int) -> dict[str, int]:
        """Each category's level at sample ``i``."""
        return {c: int(self.levels[i, k]) for k, c in enumerate(CATEGORIES)}


def _intervals(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    return union_intervals(starts, ends) if len(starts) else empty_intervals()


def _label_rows(labels: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = labels[mask]
    return rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64)


def sites(labels: pd.DataFrame, windows: pd.DataFrame, events: pd.DataFrame) -> Sites:
    """The :class:`Sites` of one rank from its labels (labels.LABELS), unit windows (windows.WINDOWS)
    and events (the optimizer's ranges and FSDP1's post-backward hook, which name no unit)."""
    family, action = labels["family"].astype(str).to_numpy(), labels["action"].astype(str).to_numpy()
    fsdp2, fsdpviz = family == FAMILY_FSDP2, family == FAMILY_FSDPVIZ
    gather = action == GATHER_ACTION
    reduce = (fsdp2 & (action == FSDP2_REDUCE_ACTION)) | (fsdpviz & (action == FSDPVIZ_REDUCE_ACTION))
    post = reduce | (fsdp2 & np.isin(action, list(POST_BACKWARD_ACTIONS)))
    params = (fsdp2 & (action == COPY_OUT_ACTION)) | (fsdpviz & gather)
    empty = np.zeros(0, dtype=np.int64)
    fsdp1_post = zero = opt = (empty, empty)
    cls = ""
    if len(events):
        ann = events[(events["kind"] == schema.KIND_ANNOTATION).to_numpy()]
        names = ann["name"].astype(str).to_numpy()
        start = ann["start_ns"].to_numpy(np.int64)
        end = start + ann["dur_ns"].to_numpy(np.int64)

        def ranges(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return start[mask], end[mask]

        fsdp1_post = ranges(names == _FSDP1_POST_BACKWARD)
        zero = ranges(np.char.startswith(names.astype(str), ZERO_GRAD_PREFIX))
        is_step = np.char.startswith(names.astype(str), STEP_PREFIX)
        opt = ranges(is_step)
        if is_step.any():
            match = _OPTIMIZER_CLASS_RE.match(str(names[is_step][0]))
            cls = match.group("cls") if match else ""
    forward = windows[(windows["phase"] == vocabulary.FORWARD).to_numpy()] if len(windows) else windows
    def named(mask: np.ndarray) -> pd.DataFrame:
        rows = labels[mask]
        return pd.DataFrame({"start_ns": rows["start_ns"].to_numpy(np.int64), "end_ns": rows["end_ns"].to_numpy(np.int64),
                             "unit": rows["unit"].astype(str).to_numpy()}).sort_values("start_ns", kind="stable")

    post_s, post_e = _label_rows(labels, post)
    return Sites(
        gather_buffer=_intervals(*_label_rows(labels, fsdp2 & gather)),
        gather_params=_intervals(*_label_rows(labels, params)),
        reduce=_intervals(*_label_rows(labels, reduce)),
        post_backward=_intervals(np.concatenate([post_s, fsdp1_post[0]]), np.concatenate([post_e, fsdp1_post[1]])),
        zero_grad=_intervals(*zero), optimizer=_intervals(*opt),
        forward=_intervals(forward["start_ns"].to_numpy(np.int64), forward["end_ns"].to_numpy(np.int64))
        if len(forward) else empty_intervals(),
        gather_labels=named((gather & (fsdp2 | fsdpviz)) | params).reset_index(drop=True),
        post_labels=named(post & (labels["unit"].astype(str) != "").to_numpy()).reset_index(drop=True),
        optimizer_class=cls)


def categorise(samples: pd.DataFrame, where: Sites) -> Categorised:
    """Each sample's category and every category's level (see the module docstring). ``samples``:
    one rank's device samples by time (MEMORY columns). What was present before the first sample and
    stays is left whole in ``sharded_params`` (``Categorised.persistent``) for :func:`split_persistent`."""
    n = len(samples)
    t = samples["t_ns"].to_numpy(np.int64)
    delta = samples["delta_bytes"].to_numpy(np.int64)
    freed_at, made_at = _pairs(samples["addr"].to_numpy(np.int64), delta)
    in_gather_buffer, in_gather_params = covers(where.gather_buffer, t), covers(where.gather_params, t)
    in_reduce, in_post = covers(where.reduce, t), covers(where.post_backward, t)
    in_zero, in_opt, in_forward = covers(where.zero_grad, t), covers(where.optimizer, t), covers(where.forward, t)
    codes = np.full(n, CODE[OTHER], dtype=np.int8)
    alloc = delta > 0
    never_freed = alloc & (freed_at < 0)
    freed_in = np.where(freed_at >= 0, freed_at, 0)
    freed_zero = (freed_at >= 0) & in_zero[freed_in]
    freed_post = (freed_at >= 0) & in_post[freed_in]
    # in order of precedence: a later assignment wins
    codes[alloc & in_forward] = CODE[ACTIVATIONS]
    codes[alloc & ~in_forward & ~in_post & freed_post] = CODE[UNSHARDED_GRADS]
    codes[alloc & in_opt & never_freed] = CODE[OPTIMIZER_STATE]
    codes[alloc & in_reduce] = CODE[COMM_BUFFERS]
    sharded_grads = alloc & in_reduce & (never_freed | freed_zero)
    codes[sharded_grads] = CODE[GRADIENTS]
    codes[alloc & in_gather_buffer] = CODE[COMM_BUFFERS]
    codes[alloc & in_gather_params] = CODE[UNSHARDED_PARAMS]
    frees = delta < 0
    paired = frees & (made_at >= 0)
    codes[paired] = codes[made_at[paired]]
    unpaired = frees & (made_at < 0)
    codes[unpaired & in_zero] = CODE[GRADIENTS]  # the gradients of the step before the trace
    # Before the first sample: blocks freed later with no allocation seen are their category's;
    # the rest stays all along (sharded parameters, optimizer state, workspaces).
    before = int(samples["allocated_bytes"].iat[0] - delta[0]) if n else 0
    base = dict.fromkeys(CATEGORIES, 0)
    for c in (GRADIENTS, OTHER):
        base[c] = int(-delta[unpaired & (codes == CODE[c])].sum())
    persistent = max(0, before - base[GRADIENTS] - base[OTHER])
    base[SHARDED_PARAMS] = persistent
    levels = np.zeros((n, len(CATEGORIES)), dtype=np.int64)
    for k, c in enumerate(CATEGORIES):
        levels[:, k] = base[c] + np.cumsum(np.where(codes == k, delta, 0))
    # Whatever the events do not explain (a sample the profiler dropped, a level that is not the sum
    # of its allocations) is "other": the categories always add up to the allocator's own level.
    levels[:, CODE[OTHER]] += samples["allocated_bytes"].to_numpy(np.int64) - levels.sum(axis=1)
    return Categorised(codes=codes, levels=levels, persistent=persistent,
                       reduced_bytes=_reduced_per_step(t, delta, sharded_grads, where),
                       reductions=len(where.reduce[0]),
                       blocks=_unit_blocks(t, delta, codes, freed_at, where))


def _pairs(addr: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per allocation, the sample that frees its block; per free, the allocation (-1: not seen).

    An allocator hands an address out again only once it is free, so a block's free is the next
    event at its address when that is a free: the events sorted by address (time within one) pair
    up neighbour by neighbour, without a loop over samples (this runs on every rank's samples)."""
    n = len(delta)
    freed_at = np.full(n, -1, dtype=np.int64)
    made_at = np.full(n, -1, dtype=np.int64)
    idx = np.flatnonzero((addr >= 0) & (delta != 0))
    if len(idx) < 2:
        return freed_at, made_at
    idx = idx[np.lexsort((idx, addr[idx]))]  # by address, in time order within each
    first, second = idx[:-1], idx[1:]
    pair = (addr[first] == addr[second]) & (delta[first] > 0) & (delta[second] < 0)
    freed_at[first[pair]], made_at[second[pair]] = second[pair], first[pair]
    return freed_at, made_at


def _unit_blocks(t: np.ndarray, delta: np.ndarray, codes: np.ndarray, freed_at: np.ndarray,
                 where: Sites) -> pd.DataFrame:
    """The units' own blocks, each with its unit and when it was freed (NOT_FREED: not in the
    trace): unsharded parameters and all-gather buffers (the unit of the gather label they were
    made in), unsharded gradients (the unit of the post-backward label that freed them), sharded
    gradients (the unit whose reduction made them)."""
    made = delta > 0
    gathered = np.flatnonzero(made & np.isin(codes, [CODE[UNSHARDED_PARAMS], CODE[COMM_BUFFERS]]))
    grads = np.flatnonzero(made & (codes == CODE[UNSHARDED_GRADS]) & (freed_at >= 0))
    reduced = np.flatnonzero(made & (codes == CODE[GRADIENTS]))  # a unit's reduction left them
    parts = [_blocks_in(gathered, t[gathered], where.gather_labels, t, delta, codes, freed_at),
             _blocks_in(grads, t[np.clip(freed_at[grads], 0, None)], where.post_labels, t, delta, codes, freed_at),
             _blocks_in(reduced, t[reduced], where.post_labels, t, delta, codes, freed_at)]
    return pd.concat(parts, ignore_index=True)


def _blocks_in(idx: np.ndarray, when: np.ndarray, labels: pd.DataFrame, t: np.ndarray, delta: np.ndarray,
               codes: np.ndarray, freed_at: np.ndarray) -> pd.DataFrame:
    """UNIT_BLOCKS rows (no rank) of the allocations ``idx`` whose time ``when`` lies in one of
    ``labels`` (the latest opened before it that still holds it)."""
    if not len(idx) or labels.empty:
        return pd.DataFrame({k: pd.Series(dtype=v) for k, v in UNIT_BLOCKS.items() if k != "rank"})
    starts, ends = labels["start_ns"].to_numpy(np.int64), labels["end_ns"].to_numpy(np.int64)
    at = np.searchsorted(starts, when, side="right") - 1
    inside = (at >= 0) & (when < ends[np.clip(at, 0, None)])
    idx, at = idx[inside], at[inside]
    free = freed_at[idx]
    return pd.DataFrame({
        "unit": labels["unit"].to_numpy()[at],
        "category": np.array(CATEGORIES, dtype=object)[codes[idx]],
        "alloc_ns": t[idx], "free_ns": np.where(free >= 0, t[np.clip(free, 0, None)], NOT_FREED),
        "bytes": delta[idx]})


def _reduced_per_step(t: np.ndarray, delta: np.ndarray, grads: np.ndarray, where: Sites) -> int:
    """Bytes of sharded gradients one step's reductions leave: the most made between two
    ``zero_grad`` calls, else all of them."""
    if not grads.any():
        return 0
    made, when = delta[grads], t[grads]
    starts = where.zero_grad[0]
    if len(starts) < 2:
        return int(made.sum())
    sums = [int(made[(when >= a) & (when < b)].sum()) for a, b in itertools.pairwise(starts)]
    return max(sums) if max(sums) > 0 else int(made.sum())


def sharded_state(units: pd.DataFrame, shards: Mapping[str, int], world_size: int,
                  reduced_bytes: int) -> ShardedState | None:
    """One rank's share of the units' parameters (``units``: schema.UNITS; ``shards``: ranks each
    unit is sharded over, the world size when absent); bytes per element measured from
    ``reduced_bytes`` (one step's sharded gradients) when that gives a whole element size, else the
    units' own. None without the units' sizes."""
    known = units[(units["param_numel"] > 0).to_numpy()] if len(units) else units
    if known.empty:
        return None
    numel = known["param_numel"].to_numpy(np.float64)
    per = np.array([max(1, shards.get(str(u), world_size)) for u in known["unit"]], dtype=np.float64)
    elements = float((numel / per).sum())
    with_bytes = known[(known["param_bytes"] > 0).to_numpy()]
    gathered = max(1, round(float(with_bytes["param_bytes"].sum()) / float(with_bytes["param_numel"].sum()))) \
        if len(with_bytes) else None
    if reduced_bytes > 0 and elements > 0:
        ratio = reduced_bytes / elements
        size = min(_ELEMENT_SIZES, key=lambda s: abs(s - ratio))
        # shards are the gathered dtype or wider (fp32 under mixed precision), never past fp32 for a
        # 16/32-bit model: more means the reductions left more than the gradients (gloo's all-reduce)
        if abs(size - ratio) <= 0.1 * size and size <= max(4, gathered or 4):
            return ShardedState(elements, size, True)
    if gathered is None:
        return None
    return ShardedState(elements, gathered, False)


def split_persistent(persistent: int, state: ShardedState | None, optimizer_class: str, *,
                     gradients_kept: bool = False) -> dict[str, int]:
    """What was present before the trace and stayed, divided: the units' sharded parameters, their
    sharded gradients when ``gradients_kept`` (the reductions made none: ``zero_grad(set_to_none=
    False)`` keeps them from step to step), the optimizer's states where its class says how many per
    element, the rest ``other``."""
    if state is None:
        return {SHARDED_PARAMS: 0, OPTIMIZER_STATE: 0, GRADIENTS: 0, OTHER: persistent}
    one = round(state.elements * state.bytes_per_element)
    params = min(persistent, one)
    grads = min(persistent - params, one) if gradients_kept else 0
    states = OPTIMIZER_STATES.get(optimizer_class, 0)
    optimizer = min(persistent - params - grads, states * one)
    return {SHARDED_PARAMS: params, OPTIMIZER_STATE: optimizer, GRADIENTS: grads,
            OTHER: persistent - params - grads - optimizer}


def split_levels(levels: np.ndarray, parts: Mapping[str, int]) -> np.ndarray:
    """One rank's ``levels`` (samples x categories, ``sharded_params`` holding the persistent share as
    :func:`categorise` leaves it) with that share divided as ``parts`` (:func:`split_persistent`) says."""
    out = levels.copy()
    for c in (OPTIMIZER_STATE, GRADIENTS, OTHER):
        out[:, CODE[c]] += parts[c]
        out[:, CODE[SHARDED_PARAMS]] -= parts[c]
    return out


def apply_split(frame: pd.DataFrame, split: Mapping[int, Mapping[str, int]]) -> pd.DataFrame:
    """``frame`` (category columns, ``sharded_params`` holding each rank's persistent share as
    :func:`categorise` leaves it) with each rank's share divided as ``split[rank]`` says."""
    if frame.empty or not split:
        return frame
    frame = frame.copy()
    ranks = frame["rank"].to_numpy()
    moved = 0
    for c in (OPTIMIZER_STATE, GRADIENTS, OTHER):
        share = pd.Series({r: parts[c] for r, parts in split.items()}, dtype="int64")
        add = share.reindex(ranks).fillna(0).to_numpy(np.int64)  # one pass, whatever the number of ranks
        frame[c] = frame[c].to_numpy(np.int64) + add
        moved = moved + add
    frame[SHARDED_PARAMS] = frame[SHARDED_PARAMS].to_numpy(np.int64) - moved
    return frame


def levels_frame(rank: int, t_ns: np.ndarray, levels: np.ndarray) -> pd.DataFrame:
    """CATEGORY_LEVELS rows of ``rank``: ``levels`` (samples x categories) at times ``t_ns``."""
    out = pd.DataFrame({"rank": rank, "t_ns": np.asarray(t_ns, dtype=np.int64)})
    for k, c in enumerate(CATEGORIES):
        out[c] = levels[:, k]
    return schema.conform(out, CATEGORY_LEVELS, table="memory categories")


class PeakCategories(msgspec.Struct, kw_only=True):
    """What the allocated level held at one peak, by category (memory_categories.CATEGORIES)."""

    rank: int
    step: int
    unit: str  # the unit pass whose window holds it ("" for a step's peak outside every unit)
    phase: str
    allocated_bytes: int
    categories: dict[str, int]


def peak_categories(row: dict[str, Any]) -> PeakCategories:
    """A CATEGORY_PEAKS row as the summary gives it."""
    return PeakCategories(rank=int(row["rank"]), step=int(row["step"]), unit=str(row["unit"]), phase=str(row["phase"]),
                          allocated_bytes=int(row["allocated_bytes"]),
                          categories={c: int(row[c]) for c in CATEGORIES})


def unit_peak_categories(peaks: pd.DataFrame) -> dict[str, PeakCategories]:
    """Per unit, the categories at its highest window peak (over ranks, steps and phases)."""
    rows = peaks[(peaks["unit"].astype(str) != "").to_numpy()]
    if rows.empty:
        return {}
    best = rows.sort_values("allocated_bytes", ascending=False, kind="stable").drop_duplicates("unit")
    return {str(r["unit"]): peak_categories(r) for r in best.to_dict(orient="records")}
