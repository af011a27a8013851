"""Peak memory under another setting, from a recording's memory by category.

A recorded step's allocated level is, at every sample, its categories
(:mod:`fsdpviz.analysis.memory_categories`). A setting changes some of them and leaves the rest:

- **world size** N -> N': the sharded categories (parameters, gradients, optimizer state) scale by
  N / N'; activations, unsharded parameters and gradients, buffers and the rest are per rank and
  stay. FSDP2 at N' = 1 gathers nothing: its all-gather buffers go (the unsharded parameters stay:
  at one rank FSDP2 casts the shard into them).
- **the units' own blocks** move with the setting, block by block (each as recorded, with its unit):
  unsharded parameters and all-gather buffers (the unit whose gather made them), unsharded
  gradients (whose post-backward freed them), sharded gradients (whose reduction made them).
  ``reshard_after_forward`` False keeps a unit's forward parameters until its backward ends and
  gathers nothing in backward; True frees them at the end of its forward and gathers them again in
  backward when the unit before it in backward starts (FSDP2 prefetches one unit ahead: the
  all-gather output from then, the parameters from the unit's copy-out). A merged unit's gather is
  issued when its first member's was and copied out when the first member's was; its parameters
  are freed when the last member's would have been; its members' unsharded gradients wait for its
  one reduction, after the last member's backward, and the sharded gradients are made by it. An
  explicit prefetch of N issues a unit's gather when the unit N before it starts and frees the
  output at the unit's copy-out (FSDP2 holds it longer only for its implicit forward prefetch);
  ``none`` not before the unit itself. A moved gather's temporaries (copy-in, a backend's staging
  buffers) live as long as they did.

Under gradient accumulation every micro-batch (a forward and a backward) is moved on its own: a
block belongs to the pass of the micro-batch whose windows it was made in, and is kept, gathered
again, prefetched or merged within that micro-batch's windows (FSDP2 reshards after each backward
and gathers again in the next forward). The sharded gradients stay as recorded: the first
micro-batch's reductions make them, the later ones add to them (their outputs are buffers, freed at
once). An earlier step's block still alive in this one, and a buffer the trace never saw freed (on
CPU, gloo's threads free an asynchronous collective's tensors where the profiler does not look),
stay as recorded. A setting that can only add memory is never predicted below the recorded peak
(:mod:`fsdpviz.whatif.bounds`).

The level under the setting at any instant is the recorded level plus what the setting changes
there; its peak over the step is the prediction. With the recorded setting nothing changes, so
the replay is exact. Left as recorded: a merged unit's reduction buffers (per member), activations
(a setting does not change them), the caching allocator's rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.naming import ROOT_UNIT

_PARAMS: Final = mcat.UNSHARDED_PARAMS
_BUFFERS: Final = mcat.COMM_BUFFERS
_GRADS: Final = mcat.UNSHARDED_GRADS
_REDUCED: Final = mcat.GRADIENTS  # sharded gradients a unit's reduction made
_MOVED: Final = (_PARAMS, _BUFFERS, _GRADS, _REDUCED)  # the categories of the units' own blocks

Pass = tuple[str, str, int]  # (unit, phase, micro-batch)


@dataclass(slots=True)
class Block:
    """One unsharded-parameter or all-gather-buffer block of a unit, in one step (ns)."""

    unit: str
    category: str  # unsharded_params / comm_buffers / unsharded_grads
    phase: str  # the pass whose gather made it
    alloc: int
    free: int
    bytes: int
    micro: int = 0  # the micro-batch whose pass made it
    own: bool = True  # made in this step (False: an earlier step's block still alive, left as recorded)


@dataclass(slots=True)
class StepMemory:
    """One rank's step as memory: its samples by category, its units' blocks and windows."""

    rank: int
    step: int
    t: np.ndarray  # sample times in the step, the first the level the step opens at
    levels: np.ndarray  # (samples, categories) bytes, memory_categories.CATEGORIES
    blocks: list[Block]
    windows: dict[Pass, tuple[int, int]]  # (unit, phase, micro) -> its window in the step
    computed: dict[Pass, int]  # (unit, phase, micro) -> where its compute region ends

    @property
    def allocated(self) -> np.ndarray:
        return self.levels.sum(axis=1)

    @property
    def peak_bytes(self) -> int:
        return int(self.allocated.max()) if len(self.t) else -1

    @property
    def peak_categories(self) -> dict[str, int]:
        """What the step's (first) highest sample holds, by category."""
        j = int(np.argmax(self.allocated))
        return {c: int(self.levels[j, n]) for n, c in enumerate(mcat.CATEGORIES)}

    @property
    def start_bytes(self) -> int:
        """The level the step opens at."""
        return int(self.allocated[0]) if len(self.t) else -1


@dataclass(slots=True)
class MemoryChange:
    """What a setting does to one step's memory: the new level's peak and what it holds."""

    peak_bytes: int
    categories: dict[str, int]  # at the new peak
    curve: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))  # ns from the step's start, bytes


@dataclass(frozen=True, slots=True)
class MemorySetting:
    """What the memory model needs of a setting (:func:`predict_step`)."""

    group: dict[str, str]  # recorded unit -> the unit holding it
    order: list[str]  # recorded units, forward order
    reshard: dict[str, bool]  # per recorded unit: reshard after forward under the setting
    recorded_reshard: dict[str, bool]
    prefetch: str  # "recorded", "implicit", "none" or N
    scale: float  # sharded categories' factor: recorded world / new world
    drop_gather_buffers: bool  # FSDP2 at one rank
    notes: list[str] = field(default_factory=list)


def step_memory(rank: int, step: int, t0: int, t1: int, t: np.ndarray, cats: mcat.Categorised,
                split: mcat.Split, windows: pd.DataFrame) -> StepMemory | None:
    """The :class:`StepMemory` of one rank's step ``[t0, t1]`` from its categorised samples (``t``:
    their times; ``split``: the persistent share divided, memory_categories.split_persistent) and the
    step's unit windows (windows.WINDOWS rows). None without samples."""
    if not len(t):
        return None
    a = max(int(np.searchsorted(t, t0, side="right")) - 1, 0)  # the level the step opens at
    b = int(np.searchsorted(t, t1, side="right"))
    if b <= a:
        return None
    levels = mcat.split_levels(cats.levels[a:b], cats.persistent, split)
    times = t[a:b].copy()
    times[0] = max(int(times[0]), t0)
    spans: dict[Pass, tuple[int, int]] = {}
    computed: dict[Pass, int] = {}
    micros = windows["micro"].to_numpy(np.int64) if "micro" in windows.columns else np.zeros(len(windows), np.int64)
    for u, ph, m, s, e, r in zip(windows["unit"].astype(str), windows["phase"].astype(str), micros,
                                 windows["start_ns"].to_numpy(np.int64), windows["end_ns"].to_numpy(np.int64),
                                 windows["region_end_ns"].to_numpy(np.int64)):
        key = (u, ph, int(m))
        old = spans.get(key)
        spans[key] = (int(s), int(e)) if old is None else (min(old[0], int(s)), max(old[1], int(e)))
        computed[key] = max(computed.get(key, int(r)), int(r))
    pass_of = _pass_finder(spans, t1)
    rows = cats.blocks
    live = rows[((rows["alloc_ns"] < t1) & (rows["free_ns"] > t0)).to_numpy()] if len(rows) else rows
    blocks = []
    for u, c, al, fr, n in (zip(live["unit"], live["category"], live["alloc_ns"], live["free_ns"], live["bytes"])
                            if len(live) else ()):
        phase, micro = pass_of(int(al))
        blocks.append(Block(unit=str(u), category=str(c), phase=phase, alloc=int(al), free=int(fr), bytes=int(n),
                            micro=micro, own=int(al) >= t0))
    return StepMemory(rank=rank, step=step, t=times, levels=levels, blocks=blocks, windows=spans, computed=computed)


def _pass_finder(spans: dict[Pass, tuple[int, int]], t1: int) -> Callable[[int], tuple[str, int]]:
    """Which pass made an allocation at a time: the micro-batch whose first window opened last before
    it (the first micro-batch before every window), and in it forward until its first backward
    window opens."""
    micros = sorted({m for (_, _, m) in spans}) or [0]
    opens = np.array([min((s for (_, _, mm), (s, _) in spans.items() if mm == m), default=t1) for m in micros],
                     dtype=np.int64)
    backward = {m: min((s for (_, ph, mm), (s, _) in spans.items() if mm == m and ph == vocabulary.BACKWARD),
                       default=t1) for m in micros}

    def find(at: int) -> tuple[str, int]:
        m = micros[max(int(np.searchsorted(opens, at, side="right")) - 1, 0)]
        return (vocabulary.BACKWARD if at >= backward[m] else vocabulary.FORWARD), m

    return find


def predict_step(sm: StepMemory, setting: MemorySetting) -> MemoryChange:
    """The step's peak under ``setting`` (see the module docstring)."""
    new = _moved_blocks(sm, setting)
    extra_t = np.array(sorted({b.alloc for b in new}), dtype=np.int64)
    t = np.union1d(sm.t, extra_t[(extra_t >= sm.t[0]) & (extra_t <= sm.t[-1])])
    at = np.clip(np.searchsorted(sm.t, t, side="right") - 1, 0, len(sm.t) - 1)
    levels = sm.levels[at].astype(np.float64)
    k = mcat.CODE
    for c in mcat.SHARDED:
        levels[:, k[c]] *= setting.scale
    for c in _MOVED:
        moved = _alive(new, c, t) - _alive(sm.blocks, c, t)
        levels[:, k[c]] += moved * (setting.scale if c in mcat.SHARDED else 1.0)
    total = levels.sum(axis=1)
    i = int(np.argmax(total))
    return MemoryChange(peak_bytes=round(float(total[i])),
                        categories={c: round(float(levels[i, n])) for n, c in enumerate(mcat.CATEGORIES)},
                        curve=((t - sm.t[0]).astype(np.float64), total))


def _alive(blocks: Sequence[Block], category: str, t: np.ndarray) -> np.ndarray:
    """Bytes of ``category``'s blocks allocated and not yet freed at each time."""
    mine = [b for b in blocks if b.category == category]
    if not mine:
        return np.zeros(len(t))
    alloc = np.array([b.alloc for b in mine], dtype=np.int64)
    free = np.array([b.free for b in mine], dtype=np.int64)
    size = np.array([b.bytes for b in mine], dtype=np.float64)
    oa, of = np.argsort(alloc, kind="stable"), np.argsort(free, kind="stable")
    made = np.concatenate([[0.0], np.cumsum(size[oa])])[np.searchsorted(alloc[oa], t, side="right")]
    gone = np.concatenate([[0.0], np.cumsum(size[of])])[np.searchsorted(free[of], t, side="right")]
    return made - gone


def _copy(b: Block, **change: int | str) -> Block:
    return replace(b, **change)  # type: ignore[arg-type]


def _moved_blocks(sm: StepMemory, s: MemorySetting) -> list[Block]:
    """The step's unit blocks as the setting would make them; an earlier step's blocks still alive
    stay as recorded."""
    earlier = [b for b in sm.blocks if not b.own]
    blocks = [_copy(b) for b in sm.blocks if b.own and not (s.drop_gather_buffers and b.category == _BUFFERS)]
    out: list[Block] = []
    by_unit: dict[str, list[Block]] = {}
    for b in blocks:
        by_unit.setdefault(b.unit, []).append(b)
    for unit, mine in by_unit.items():
        out.extend(b for b in mine if b.category in (_GRADS, _REDUCED))
        gathered = [b for b in mine if b.category not in (_GRADS, _REDUCED)]
        for micro in sorted({b.micro for b in gathered}):
            out.extend(_resharded(sm, s, unit, micro, [b for b in gathered if b.micro == micro]))
    # prefetch depth counts recorded units (a merged unit's members move together afterwards)
    return earlier + _merged(sm, s, _prefetched(sm, s, out))


def _resharded(sm: StepMemory, s: MemorySetting, unit: str, micro: int, mine: list[Block]) -> list[Block]:
    """A unit's blocks of one micro-batch when its reshard after forward changes (the root never
    reshards)."""
    before, after = s.recorded_reshard.get(unit, True), s.reshard.get(unit, True)
    if unit == ROOT_UNIT or before == after:
        return mine
    fwd = [b for b in mine if b.phase == vocabulary.FORWARD]
    bwd_window = sm.windows.get((unit, vocabulary.BACKWARD, micro))
    fwd_window = sm.windows.get((unit, vocabulary.FORWARD, micro))
    if not after:  # kept from forward until its backward ends; no gather in backward
        end = max([b.free for b in mine if b.phase == vocabulary.BACKWARD and b.category == _PARAMS]
                  + ([bwd_window[1]] if bwd_window else []), default=None)
        computed = sm.computed.get((unit, vocabulary.FORWARD, micro))
        if end is None or computed is None:
            return mine
        # the parameters its forward computed with (the reshard frees them), not the copy-out's temporaries
        return [_copy(b, free=end if b.category == _PARAMS and b.free >= computed else b.free) for b in fwd]
    # Freed at the end of its forward and gathered again in backward, issued when the unit before
    # it in backward starts (one ahead): the all-gather output lives from the issue to the unit's
    # copy-out as it starts, the copy-in buffer as long as in forward, the parameters from the
    # copy-out to the end of its backward.
    if fwd_window is None or bwd_window is None:
        return mine
    issue = _issue_time(sm, unit, vocabulary.BACKWARD, micro, 1, s.order)
    copy_out = max(bwd_window[0], issue)
    output = max((b.bytes for b in fwd if b.category == _BUFFERS), default=0)
    out = []
    for b in fwd:
        out.append(_copy(b, free=min(b.free, fwd_window[1]) if b.category == _PARAMS else b.free))
        if b.category == _PARAMS:
            out.append(_copy(b, phase=vocabulary.BACKWARD, alloc=copy_out, free=max(bwd_window[1], copy_out)))
        elif b.bytes == output:
            out.append(_copy(b, phase=vocabulary.BACKWARD, alloc=issue, free=copy_out))
        else:
            out.append(_copy(b, phase=vocabulary.BACKWARD, alloc=issue, free=min(copy_out, issue + b.free - b.alloc)))
    return out


def _issue_time(sm: StepMemory, unit: str, phase: str, micro: int, ahead: int, order: list[str]) -> int:
    """When a unit's gather is issued ``ahead`` units early in ``phase`` of micro-batch ``micro``: at
    the start of the window of the unit that many before it in that phase's order (its own window's
    start when none)."""
    # FSDP2 prefetches between the root's children: the root neither issues nor is a target
    ordered = [u for u in (order if phase == vocabulary.FORWARD else list(reversed(order)))
               if (u, phase, micro) in sm.windows and u != ROOT_UNIT]
    own = sm.windows.get((unit, phase, micro), (int(sm.t[0]), int(sm.t[-1])))[0]
    if unit not in ordered:
        return own
    i = ordered.index(unit)
    j = max(0, i - ahead)
    return min(own, sm.windows[(ordered[j], phase, micro)][0]) if ahead > 0 else own


def _first_made(blocks: list[Block], category: str) -> dict[Pass, int]:
    """Per (unit, phase, micro), when its first block of ``category`` was made: for the parameters
    its copy-out, for the all-gather buffers the issue of its gather."""
    out: dict[Pass, int] = {}
    for b in blocks:
        if b.category == category:
            key = (b.unit, b.phase, b.micro)
            out[key] = min(out.get(key, b.alloc), b.alloc)
    return out


def _moved_buffer(b: Block, issued: int, new_issue: int, copy_out: int | None, new_copy_out: int) -> Block:
    """A gather's buffer when the gather is issued at ``new_issue`` instead of ``issued`` and copied
    out at ``new_copy_out``: made as long after the issue as before; a temporary (freed before the
    recorded copy-out: the copy-in, a backend's staging buffer) lives as long as it did, the output
    until the new copy-out."""
    alloc = new_issue + (b.alloc - issued)
    if copy_out is not None and b.free < copy_out:
        return _copy(b, alloc=alloc, free=alloc + (b.free - b.alloc))
    return _copy(b, alloc=alloc, free=max(alloc, new_copy_out))


def _merged(sm: StepMemory, s: MemorySetting, blocks: list[Block]) -> list[Block]:
    """Units gathered together, per new unit, phase and micro-batch: the members' gathers issued when
    the first member's was (their buffers as :func:`_moved_buffer` moves them, the outputs until the
    merged copy-out: the first member's), every member's parameters made at that copy-out and freed
    when the last member's are, its members' unsharded gradients waiting for its one reduction, and
    the sharded gradients that reduction leaves made when the last member's were."""
    copy_outs, issued = _first_made(blocks, _PARAMS), _first_made(blocks, _BUFFERS)
    groups: dict[tuple[str, str, int], list[Block]] = {}
    for b in blocks:
        groups.setdefault((s.group.get(b.unit, b.unit), b.phase, b.micro), []).append(b)
    out = []
    for (new, _, _), members in groups.items():
        if len({b.unit for b in members}) < 2:
            out.extend(members)
            continue
        params = [b for b in members if b.category == _PARAMS]
        buffers = [b for b in members if b.category == _BUFFERS]
        grads = [b for b in members if b.category == _GRADS]
        reductions = [b for b in members if b.category == _REDUCED]
        copy_out = min((b.alloc for b in params), default=min(b.alloc for b in members))
        params_end = max((b.free for b in params), default=copy_out)
        issue = min((b.alloc for b in buffers), default=copy_out)
        reduced = max((b.free for b in grads), default=copy_out)  # the merged unit's reduction
        out += [_copy(b, unit=new, alloc=copy_out, free=max(copy_out, params_end)) for b in params]
        for b in buffers:
            key = (b.unit, b.phase, b.micro)
            moved = _moved_buffer(b, issued[key], issue, copy_outs.get(key), copy_out)
            out.append(_copy(moved, unit=new))
        out += [_copy(b, unit=new, free=max(b.alloc, reduced)) for b in grads]
        # its one reduction comes after the last member's: their sharded gradients are made then
        last = max((b.alloc for b in reductions), default=0)
        out += [_copy(b, unit=new, alloc=last, free=max(last, b.free)) for b in reductions]
    return out


def _prefetched(sm: StepMemory, s: MemorySetting, blocks: list[Block]) -> list[Block]:
    """An explicit prefetch of N: each unit's gather issued at the start of the unit N before it in
    its micro-batch (earlier only), its buffers moved with it (:func:`_moved_buffer`; the output freed
    at the unit's copy-out: FSDP2 holds it longer only for its implicit forward prefetch); ``none``:
    not before the unit's own window. The unsharded parameters stay where they
    were made: at the unit's copy-out, in its own window."""
    if s.prefetch in ("recorded", "implicit"):
        return blocks
    copy_outs, issued = _first_made(blocks, _PARAMS), _first_made(blocks, _BUFFERS)
    out = []
    for b in blocks:
        if b.category != _BUFFERS:  # parameters at the copy-out, gradients by backward: unmoved
            out.append(b)
            continue
        key = (b.unit, b.phase, b.micro)
        own = sm.windows.get(key)
        first = issued[key]
        copy_out = copy_outs.get(key)
        if s.prefetch == "none":
            new_issue = max(first, own[0]) if own else first
            out.append(_moved_buffer(b, first, new_issue, copy_out, max(b.free, new_issue)))
            continue
        new_issue = min(first, _issue_time(sm, b.unit, b.phase, b.micro, int(s.prefetch), s.order))
        # a buffer the trace never saw freed (its free fell on a thread the profiler did not follow)
        # stays so: the recorded level holds it, whatever the setting
        end = min(b.free, own[0]) if own and b.free != mcat.NOT_FREED else b.free
        out.append(_moved_buffer(b, first, new_issue, copy_out, max(end, copy_out or end)))
    return out
