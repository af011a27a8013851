"""Memory by category: what the allocated level is made of, read off the allocator's own events.

Every ``[memory]`` event is one allocation (+) or free (-) of a block at an address; a free is paired
with the allocation at its address before it. An allocation's category follows from where it was
made (the labels around it) and, where that is not enough, from where its block is freed:

- **unsharded parameters**: made inside a unit's gather labels that hold the parameters themselves
  (FSDP2's ``FSDP::all_gather_copy_out``; ``fsdpviz::all_gather`` of FSDP1 and ZeRO-3, which gather
  straight into the unsharded parameters).
- **communication buffers**: FSDP2's all-gather output (made inside ``FSDP::all_gather``, freed after
  the copy-out) and a reduction's input (made inside a unit's reduction and freed in the step).
- **gradients** (sharded): what a unit's reduction leaves -- made inside it and alive after the next
  optimizer step began, freed by ``Optimizer.zero_grad`` or never in the trace, whatever frees it
  (``model.zero_grad()`` leaves no range) -- and the gradients of the step before the trace (freed
  by ``Optimizer.zero_grad``, or blocks of the reductions' sizes freed, with no allocation seen,
  before the trace's first reduction).
- **unsharded gradients**: made by backward outside FSDP's labels and freed in FSDP's post-backward
  (the reduction, reshard, accumulation). FSDP1 makes and frees its gradients (a unit's flat
  gradient, its parameters' own gradients, the fp32 copy that is the reduce-scatter input: a
  communication buffer) around a post-backward hook that names no unit; they are the unit's whose
  reduction the hook holds, found by time order (:func:`_fsdp1_gradients`).
- **activations**: made inside a unit's forward window outside FSDP's gather labels.
- **optimizer state**: made inside ``Optimizer.step`` and never freed (its lazy initialisation), any
  class; and ZeRO-3's fp32 partitioned copy of the parameters (``fp32_partitioned_groups_flat``,
  DeepSpeed's master weights, which its optimizer steps on: part of ZeRO's K), measured by the
  recorder with the state.
- What was on the device before the trace and stays is divided once the units are known
  (:func:`fsdpviz.analysis.memory_split.split_persistent`) with what ``fsdpviz record`` measured in the training process when the
  trace began (run.json ``ranks[].memory.trace_start``): the **sharded parameters** (else the units'
  elements over their shard groups times the bytes per element, measured from one step's sharded
  gradients, which FSDP keeps in the parameters' dtype), the **gradients** kept from step to step
  when the reductions made none, the **optimizer state**; what cannot be known is named
  (:attr:`fsdpviz.analysis.memory_split.Split.unknown`) and its bytes stay in **other**. On CPU the profiler's level starts at 0
  with the trace: the loader adds what the recorder measured alive then
  (:func:`fsdpviz.trace.frames.measured_baseline`), else those categories are unknown.
- **other**: the rest -- backward's temporaries and activation gradients, the loss, inputs, the CUDA
  libraries' workspaces.

Which labels mean what is :mod:`fsdpviz.structure.label_rules`. Each category's level at a sample is
its share before the first event plus its blocks' allocations and frees up to that sample; what
the events do not explain is ``other``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure import label_rules as rules
from fsdpviz.structure.categorical import as_str
from fsdpviz.structure.intervals import Intervals, covers, empty_intervals, union_intervals
from fsdpviz.structure.labels import optimizer_own_starts
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

# One row per kept sample: every category's level (bytes). Per rank before the units are known,
# ``sharded_params`` holds the whole persistent share (memory_split.apply_split divides it).
CATEGORY_LEVELS: Final[schema.Schema] = {"rank": "int32", "t_ns": "int64", **{c: "int64" for c in CATEGORIES}}
# The levels at a peak: a step's (unit "") or a unit pass's (its window's highest sample).
CATEGORY_PEAKS: Final[schema.Schema] = {"rank": "int32", "step": "int32", "unit": "string", "phase": "string",
                                        "t_ns": "int64", "allocated_bytes": "int64",
                                        **{c: "int64" for c in CATEGORIES}}
# Per rank, what the persistent share is divided with (memory_split.split_persistent).
MEMORY_FACTS: Final[schema.Schema] = {"rank": "int32", "persistent_bytes": "int64", "reduced_bytes": "int64",
                                      "reductions": "int32", "optimizer_made": "bool", "relative": "bool",
                                      "optimizer_class": "string"}
# The units' own blocks (parameters, gradients, communication buffers): one row per block;
# ``reduction``: a buffer its gradient reduction made (the reduce-scatter input, the copy-in's temporaries).
UNIT_BLOCKS: Final[schema.Schema] = {"rank": "int32", "unit": "string", "category": "string",
                                     "alloc_ns": "int64", "free_ns": "int64", "bytes": "int64", "reduction": "bool"}
NOT_FREED: Final = np.iinfo(np.int64).max
# What a rank's allocated level counts: the allocator's own level (GPU); on CPU, where the profiler
# starts it at 0 with the trace, what was allocated since, plus what the recorder measured alive
# then, or only what was allocated since (a trace recorded without that measurement).
LEVEL_ALLOCATOR: Final = "allocator"
LEVEL_MEASURED_BASELINE: Final = "since_trace_start_plus_measured"
LEVEL_SINCE_TRACE_START: Final = "since_trace_start"
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
    optimizer_classes: tuple[str, ...] = ()  # the optimizers' classes from their step labels
    # FSDP1's post-backward hooks, each named by the unit whose reduction it holds; the units'
    # backward windows (start_ns, end_ns, unit)
    fsdp1_post: pd.DataFrame = field(default_factory=lambda: _no_rows())
    backward: pd.DataFrame = field(default_factory=lambda: _no_rows())
    # FSDP2's FSDP::all_gather and FSDP::all_gather_copy_out labels apart (start_ns, end_ns, unit, by start)
    fsdp2_gathers: pd.DataFrame = field(default_factory=lambda: _no_rows())
    copy_outs: pd.DataFrame = field(default_factory=lambda: _no_rows())

    @property
    def optimizer_class(self) -> str:
        """The optimizer's class when one class stepped ("" when none or several)."""
        return self.optimizer_classes[0] if len(self.optimizer_classes) == 1 else ""


@dataclass(slots=True)
class Categorised:
    """One rank's samples with each one's category and every category's level at it."""

    codes: np.ndarray  # per sample: index into CATEGORIES of the block it allocated or freed
    levels: np.ndarray  # (samples, categories) bytes
    persistent: int  # present before the first sample and never freed (in ``sharded_params`` until split)
    reduced_bytes: int  # sharded gradients one step's reductions leave
    reductions: int  # the units' reductions seen (labels)
    optimizer_made: bool  # the optimizer made state inside the trace (its first step is in it)
    blocks: pd.DataFrame  # UNIT_BLOCKS without the rank

    def at(self, i: int) -> dict[str, int]:
        """Each category's level at sample ``i``."""
        return {c: int(self.levels[i, k]) for k, c in enumerate(CATEGORIES)}


def _intervals(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    return union_intervals(starts, ends) if len(starts) else empty_intervals()


def _named_rows(start: np.ndarray, end: np.ndarray, unit: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": start.astype(np.int64), "end_ns": end.astype(np.int64),
                         "unit": unit.astype(object)}).sort_values("start_ns", kind="stable").reset_index(drop=True)


def _no_rows() -> pd.DataFrame:
    return _named_rows(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, dtype=object))


def _label_rows(labels: pd.DataFrame, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = labels[mask]
    return rows["start_ns"].to_numpy(np.int64), rows["end_ns"].to_numpy(np.int64)


def sites(labels: pd.DataFrame, windows: pd.DataFrame, events: pd.DataFrame) -> Sites:
    """The :class:`Sites` of one rank from its labels (labels.LABELS), unit windows (windows.WINDOWS)
    and events (the optimizer's ranges and FSDP1's post-backward hook, which name no unit), read with
    :mod:`fsdpviz.structure.label_rules`."""
    post = rules.post_backward(labels)
    empty = np.zeros(0, dtype=np.int64)
    fsdp1_post = zero = opt = (empty, empty)
    classes: tuple[str, ...] = ()
    if len(events):
        ann = events[(events["kind"] == schema.KIND_ANNOTATION).to_numpy()]
        names = as_str(ann["name"])
        start = ann["start_ns"].to_numpy(np.int64)
        end = start + ann["dur_ns"].to_numpy(np.int64)

        def ranges(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return start[mask], end[mask]

        # each rule once per distinct name (a rank's ranges repeat a few hundred names thousands of times)
        distinct, of_row = np.unique(names, return_inverse=True)
        fsdp1_post = ranges(rules.is_fsdp1_post_backward(distinct)[of_row])
        zero = ranges(rules.is_zero_grad(distinct)[of_row])
        opt_mask = rules.is_optimizer_step(distinct)[of_row]
        # a closure's forward and backward inside the range make activations and gradients, not state
        opt = (optimizer_own_starts(ann["rank"].to_numpy()[opt_mask], start[opt_mask], end[opt_mask], labels),
               end[opt_mask])
        classes = tuple(rules.optimizer_classes(pd.unique(names)))
    forward = windows[(windows["phase"] == vocabulary.FORWARD).to_numpy()] if len(windows) else windows

    def named(mask: np.ndarray) -> pd.DataFrame:
        rows = labels[mask]
        return pd.DataFrame({"start_ns": rows["start_ns"].to_numpy(np.int64), "end_ns": rows["end_ns"].to_numpy(np.int64),
                             "unit": as_str(rows["unit"])}).sort_values("start_ns", kind="stable")

    post_s, post_e = _label_rows(labels, post)
    params = rules.gather_into_params(labels)
    reductions = named(rules.reduce(labels))
    backward = windows[(windows["phase"] == vocabulary.BACKWARD).to_numpy()] if len(windows) else windows
    return Sites(
        gather_buffer=_intervals(*_label_rows(labels, rules.fsdp2_gather(labels))),
        gather_params=_intervals(*_label_rows(labels, params)),
        reduce=_intervals(*_label_rows(labels, rules.reduce(labels))),
        post_backward=_intervals(np.concatenate([post_s, fsdp1_post[0]]), np.concatenate([post_e, fsdp1_post[1]])),
        zero_grad=_intervals(*zero), optimizer=_intervals(*opt),
        forward=_intervals(forward["start_ns"].to_numpy(np.int64), forward["end_ns"].to_numpy(np.int64))
        if len(forward) else empty_intervals(),
        gather_labels=named(rules.gather(labels) | params).reset_index(drop=True),
        fsdp2_gathers=named(rules.fsdp2_gather(labels)).reset_index(drop=True),
        copy_outs=named(rules.copy_out(labels)).reset_index(drop=True),
        post_labels=named(post & (as_str(labels["unit"]) != "")).reset_index(drop=True),
        optimizer_classes=classes, fsdp1_post=_named_by_reduction(*fsdp1_post, reductions),
        backward=_named_rows(backward["start_ns"].to_numpy(np.int64), backward["end_ns"].to_numpy(np.int64),
                             backward["unit"].astype(str).to_numpy(dtype=object)) if len(backward) else _no_rows())


def _named_by_reduction(starts: np.ndarray, ends: np.ndarray, reductions: pd.DataFrame) -> pd.DataFrame:
    """FSDP1's post-backward hook ranges (which name no unit) named by the unit of the reduction
    label inside each (a hook without one -- no gradient, no reduction -- is left out)."""
    if not len(starts) or reductions.empty:
        return _named_rows(starts[:0], ends[:0], np.zeros(0, dtype=object))
    r_start = reductions["start_ns"].to_numpy(np.int64)
    at = np.searchsorted(r_start, starts, side="left")  # the first reduction opening in the hook
    ok = at < len(r_start)
    ok[ok] = r_start[at[ok]] < ends[ok]
    return _named_rows(starts[ok], ends[ok], reductions["unit"].to_numpy(dtype=object)[at[ok]])


def categorise(samples: pd.DataFrame, where: Sites) -> Categorised:
    """Each sample's category and every category's level (see the module docstring). ``samples``:
    one rank's device samples by time (MEMORY columns). What was present before the first sample and
    stays is left whole in ``sharded_params`` (``Categorised.persistent``) for
    :func:`fsdpviz.analysis.memory_split.split_persistent`."""
    n = len(samples)
    t = samples["t_ns"].to_numpy(np.int64)
    delta = samples["delta_bytes"].to_numpy(np.int64)
    freed_at, made_at = pair_frees(samples["addr"].to_numpy(np.int64), delta)
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
    # A reduction's output that outlives the backward is a sharded gradient, however it is freed
    # later (optimizer.zero_grad, model.zero_grad -- no range of its own --, never with
    # set_to_none=False); its input is freed before the optimizer steps.
    freed_grads = alloc & in_reduce & (freed_zero | _freed_after_next(t, freed_at, where.optimizer))
    # still alive at the trace's end: made in the last step, and of a size earlier steps' gradients had
    # (FSDP2 keeps a reduce-scatter input past the step now and then; it is the unsharded size)
    kept_to_end = alloc & in_reduce & never_freed & _last_step(t, where)
    if freed_grads.any():
        kept_to_end &= np.isin(delta, np.unique(delta[freed_grads]))
    elif len(where.optimizer[0]) > 1:  # steps came and went and no reduction's output was a gradient:
        kept_to_end[:] = False  # the gradients are kept from step to step (set_to_none=False)
    sharded_grads = freed_grads | kept_to_end
    codes[sharded_grads] = CODE[GRADIENTS]
    codes[alloc & in_gather_buffer] = CODE[COMM_BUFFERS]
    codes[alloc & in_gather_params] = CODE[UNSHARDED_PARAMS]
    fsdp1 = _fsdp1_gradients(t, alloc & (codes == CODE[OTHER]) & (freed_at >= 0), freed_at, in_forward, where)
    codes[fsdp1["index"].to_numpy(np.int64)] = np.where(fsdp1["reduction"].to_numpy(bool), CODE[COMM_BUFFERS],
                                                        CODE[UNSHARDED_GRADS])
    frees = delta < 0
    paired = frees & (made_at >= 0)
    codes[paired] = codes[made_at[paired]]
    unpaired = frees & (made_at < 0)
    # the gradients of the step before the trace: freed by zero_grad, or (model.zero_grad leaves
    # no range) blocks of the sizes the reductions leave, freed before the trace's first reduction
    grad_sizes = np.unique(delta[sharded_grads])
    first_reduce = where.reduce[0][0] if len(where.reduce[0]) else np.iinfo(np.int64).max
    before_grads = unpaired & ~in_forward & (t < first_reduce) & np.isin(-delta, grad_sizes)
    codes[unpaired & (in_zero | before_grads)] = CODE[GRADIENTS]
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
                       reductions=len(where.reduce[0]), optimizer_made=bool((codes == CODE[OPTIMIZER_STATE]).any()),
                       blocks=pd.concat([_unit_blocks(t, delta, codes, freed_at, where,
                                                      in_reduce & ~in_gather_buffer & ~in_gather_params),
                                         _fsdp1_blocks(fsdp1, t, delta, codes, freed_at)], ignore_index=True))


def _fsdp1_gradients(t: np.ndarray, candidates: np.ndarray, freed_at: np.ndarray, in_forward: np.ndarray,
                     where: Sites) -> pd.DataFrame:
    """FSDP1's gradient blocks of each unit, found by time order around its post-backward hook
    (named by the reduction inside it). Autograd makes a unit's unsharded gradient as one flat
    tensor at the end of its backward, from its parameters' own gradients (freed then), and frees it
    when the hook returns; the hook casts it to the reduce dtype (the reduce-scatter's input, freed
    in the reduction). None of them is made inside a label that names the unit:

    - the reduce-scatter input (``reduction``): made in the hook before the reduction, freed in it;
    - the flat gradient: made in the unit's own backward (not in a unit's nested inside it) before
      the hook, freed after the hook ends and before the next gather, hook or backward opens;
    - its parameters' gradients: made in the unit's own backward, freed from the flat gradient's
      making to the hook's start;
    - the flat gradient an earlier micro-batch left unsharded (``no_sync()``: its hook reduced
      nothing, and the gradient stays in the flat parameter until a micro-batch that syncs): made in
      an earlier backward of the unit's own, freed in this hook or as it returns (before the next
      gather, hook or backward opens).

    ``candidates``: allocations not yet given a category and freed in the trace. Rows: ``index``
    (the allocation's sample), ``unit``, ``reduction``."""
    posts = where.fsdp1_post
    rows: list[tuple[np.ndarray, str, bool]] = []
    if posts.empty or not candidates.any():
        return pd.DataFrame({"index": pd.Series(dtype="int64"), "unit": pd.Series(dtype=object),
                             "reduction": pd.Series(dtype=bool)})
    idx = np.flatnonzero(candidates & ~in_forward)
    made, gone = t[idx], t[freed_at[idx]]
    windows = where.backward
    w_start, w_end = windows["start_ns"].to_numpy(np.int64), windows["end_ns"].to_numpy(np.int64)
    w_unit = windows["unit"].to_numpy(dtype=object)
    opens = np.sort(np.concatenate([posts["start_ns"].to_numpy(np.int64), w_start,
                                    where.gather_labels["start_ns"].to_numpy(np.int64)]))
    reduce_start, reduce_end = where.reduce
    for s, e, unit in zip(posts["start_ns"].to_numpy(np.int64), posts["end_ns"].to_numpy(np.int64),
                          posts["unit"].to_numpy(dtype=object)):
        k = int(np.searchsorted(reduce_start, s, side="left"))
        if k >= len(reduce_start) or reduce_start[k] >= e:
            continue
        rs, re = reduce_start[k], reduce_end[k]
        rows.append((idx[(made >= s) & (made < rs) & (gone >= rs) & (gone <= re)], str(unit), True))
        own = (w_unit == unit) & (w_start <= s) & (w_end >= s)
        if not own.any():
            continue
        start = int(w_start[own].max())
        nested = (w_unit != unit) & (w_start >= start) & (w_start < s)
        outside = ~covers((w_start[nested], w_end[nested]), made) if nested.any() else np.ones(len(made), bool)
        at = int(np.searchsorted(opens, e, side="right"))
        next_open = opens[at] if at < len(opens) else np.iinfo(np.int64).max
        mine = outside & (made >= start) & (made < s)
        flat = mine & (gone >= e) & (gone <= next_open)
        if not flat.any():
            continue
        rows.append((idx[flat], str(unit), False))
        rows.append((idx[mine & ~flat & (gone >= made[flat].min()) & (gone < s)], str(unit), False))
        earlier = (w_unit == unit) & (w_end <= start)
        if earlier.any():
            kept = (gone >= s) & (gone <= next_open) & (made < start) & _own_windows(made, w_start, w_end, w_unit,
                                                                                        earlier)
            rows.append((idx[kept], str(unit), False))
    return pd.DataFrame({"index": np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int64),
                         "unit": np.concatenate([np.full(len(r[0]), r[1], dtype=object) for r in rows])
                         if rows else np.zeros(0, dtype=object),
                         "reduction": np.concatenate([np.full(len(r[0]), r[2]) for r in rows])
                         if rows else np.zeros(0, dtype=bool)})


def _own_windows(t: np.ndarray, w_start: np.ndarray, w_end: np.ndarray, w_unit: np.ndarray,
                 own: np.ndarray) -> np.ndarray:
    """Per time in ``t``: inside one of the ``own`` windows and in no other unit's window nested in it."""
    inside = np.zeros(len(t), dtype=bool)
    for a, b, unit in zip(w_start[own], w_end[own], w_unit[own]):
        nested = (w_unit != unit) & (w_start >= a) & (w_start < b)
        here = (t >= a) & (t < b)
        if nested.any():
            here &= ~covers((w_start[nested], w_end[nested]), t)
        inside |= here
    return inside


def _fsdp1_blocks(found: pd.DataFrame, t: np.ndarray, delta: np.ndarray, codes: np.ndarray,
                  freed_at: np.ndarray) -> pd.DataFrame:
    """UNIT_BLOCKS rows (no rank) of :func:`_fsdp1_gradients`' blocks."""
    i = found["index"].to_numpy(np.int64)
    return pd.DataFrame({"unit": found["unit"].to_numpy(dtype=object),
                         "category": np.array(CATEGORIES, dtype=object)[codes[i]],
                         "alloc_ns": t[i], "free_ns": t[freed_at[i]], "bytes": delta[i],
                         "reduction": found["reduction"].to_numpy(bool)})


def _last_step(t: np.ndarray, where: Sites) -> np.ndarray:
    """Per sample: made after the last optimizer step that another reduction follows. A gradient
    still alive at the trace's end was made then: an earlier step's would have been freed or
    accumulated into before a later step's reductions (FSDP2 keeps its last reduce-scatter input
    past the step now and then: that one is a buffer)."""
    starts = np.sort(where.optimizer[0])
    reduces = where.reduce[0]
    if not len(starts) or not len(reduces):
        return np.ones(len(t), dtype=bool)
    followed = starts[starts < reduces.max()]
    return t >= followed.max() if len(followed) else np.ones(len(t), dtype=bool)


def _freed_after_next(t: np.ndarray, freed_at: np.ndarray, ranges: Intervals) -> np.ndarray:
    """Per sample: an allocation freed after the start of the first of ``ranges`` (the optimizer
    steps) that opens after it."""
    starts = np.sort(ranges[0])
    if not len(starts):
        return np.zeros(len(t), dtype=bool)
    at = np.searchsorted(starts, t, side="right")
    next_start = np.where(at < len(starts), starts[np.clip(at, 0, len(starts) - 1)], np.iinfo(np.int64).max)
    freed = freed_at >= 0
    return freed & (t[np.clip(freed_at, 0, None)] >= next_start)


def pair_frees(addr: np.ndarray, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
                 where: Sites, reducing: np.ndarray) -> pd.DataFrame:
    """The units' own blocks, each with its unit and when it was freed (NOT_FREED: not in the
    trace): unsharded parameters and all-gather buffers (the unit of the gather label they were
    made in), unsharded gradients (the unit of the post-backward label that freed them), sharded
    gradients and the reduction's own buffers (the unit whose reduction made them)."""
    made = delta > 0
    gathered = np.flatnonzero(made & np.isin(codes, [CODE[UNSHARDED_PARAMS], CODE[COMM_BUFFERS]]))
    grads = np.flatnonzero(made & (codes == CODE[UNSHARDED_GRADS]) & (freed_at >= 0))
    reduced = np.flatnonzero(made & (codes == CODE[GRADIENTS]))  # a unit's reduction left them
    buffers = np.flatnonzero(made & (codes == CODE[COMM_BUFFERS]) & reducing)  # in a reduction, outside gathers
    parts = [_blocks_in(gathered, t[gathered], where.gather_labels, t, delta, codes, freed_at),
             _blocks_in(grads, t[np.clip(freed_at[grads], 0, None)], where.post_labels, t, delta, codes, freed_at),
             _blocks_in(reduced, t[reduced], where.post_labels, t, delta, codes, freed_at),
             _blocks_in(buffers, t[buffers], where.post_labels, t, delta, codes, freed_at).assign(reduction=True)]
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
        "bytes": delta[idx], "reduction": np.zeros(len(idx), dtype=bool)})


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


def levels_frame(rank: int, t_ns: np.ndarray, levels: np.ndarray) -> pd.DataFrame:
    """CATEGORY_LEVELS rows of ``rank``: ``levels`` (samples x categories) at times ``t_ns``."""
    out = pd.DataFrame({"rank": rank, "t_ns": np.asarray(t_ns, dtype=np.int64)})
    for k, c in enumerate(CATEGORIES):
        out[c] = levels[:, k]
    return schema.conform(out, CATEGORY_LEVELS, table="memory categories")


class PeakCategories(msgspec.Struct, kw_only=True):
    """What the allocated level held at one peak, by category (memory_categories.CATEGORIES); a
    category that cannot be known is None, and ``unknown`` says why."""

    rank: int
    step: int
    unit: str  # the unit pass whose window holds it ("" for a step's peak outside every unit)
    phase: str
    allocated_bytes: int
    categories: dict[str, int | None]
    unknown: dict[str, str] = msgspec.field(default_factory=dict)


def peak_categories(row: dict[str, Any], unknown: Mapping[str, str] | None = None) -> PeakCategories:
    """A CATEGORY_PEAKS row as the summary gives it (``unknown``: the rank's categories that cannot be
    known, with why: :attr:`fsdpviz.analysis.memory_split.Split.unknown`)."""
    why = dict(unknown or {})
    return PeakCategories(rank=int(row["rank"]), step=int(row["step"]), unit=str(row["unit"]), phase=str(row["phase"]),
                          allocated_bytes=int(row["allocated_bytes"]),
                          categories={c: None if c in why else int(row[c]) for c in CATEGORIES}, unknown=why)


def unit_peak_categories(peaks: pd.DataFrame,
                         unknown: Mapping[int, Mapping[str, str]] | None = None) -> dict[str, PeakCategories]:
    """Per unit, the categories at its highest window peak (over ranks, steps and phases)."""
    rows = peaks[(peaks["unit"].astype(str) != "").to_numpy()]
    if rows.empty:
        return {}
    best = rows.sort_values("allocated_bytes", ascending=False, kind="stable").drop_duplicates("unit")
    return {str(r["unit"]): peak_categories(r, (unknown or {}).get(int(r["rank"])))
            for r in best.to_dict(orient="records")}
