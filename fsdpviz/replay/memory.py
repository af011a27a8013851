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
  all-gather output from then, the parameters from the unit's copy-out). A merged unit (the root
  unit of ``--wrap root`` too) gathers all its members at once: issued when its first member's
  gather was (in backward: when the new unit before it in backward starts, and on CPU, where gloo's
  collectives run to their end on the host, not before that unit's copy-out, which its pre-backward
  does first), copied out not before the first member's
  copy-out, nor before the last of the members' staging buffers is freed (one transfer carries them
  all; each moved with its own offset from the issue, so this is the earliest the merged transfer
  can end); its all-gather output is freed at that copy-out (in forward FSDP2 keeps it
  until the next unit's copy-out: when the last member's was); its parameters are freed when the
  last member's would have been. It reduces once, after its last member's backward: the
  reduce-scatter input of all its members (in the reduce dtype: fp32 under a bf16 policy) is made
  then and kept until the next reduction starts, its members' unsharded gradients until the
  copy-in is done, and the sharded gradients are made after it. A merged FSDP1 unit is one flat
  parameter: gathered straight into it at the issue (the low-precision input shard of each member
  lives as long as it did), one flat gradient, one fp32 copy of it (the reduce-scatter input, made
  in the post-backward hook after the last member's backward and freed in the reduction, which
  makes the sharded gradient while the input is alive). Autograd makes the one flat gradient
  when the last member's backward ends: until then the members' parameters' own gradients wait
  (freed when the last member's were), and their flat gradients are made then. An
  explicit prefetch of N issues a unit's gather when the unit N before it starts; FSDP2 frees the
  output where it did (its ``wait_for_unshard`` keeps a forward gather's output until the next
  unit's copy-out whatever the prefetch, and frees a backward one at its own copy-out); ``none`` not
  before the unit itself. A moved gather's temporaries (copy-in, a backend's staging
  buffers) live as long as they did. A gather that ``none`` issues later keeps its unit's parameters
  at the recorded copy-out, so its staging can then outlive that copy-out: left so, with no recording
  of ``none`` to check a later copy-out on.

ZeRO-3 under another prefetch bucket gathers other sets of parameters in forward: DeepSpeed's fetch
and prefetch queue is replayed on the units' parameters (:mod:`.zero3_fetch`), each gather's flat
buffer living from its issue to the fetch that waits for its last parameter.

Under gradient accumulation every micro-batch (a forward and a backward) is moved on its own: a
block belongs to the pass of the micro-batch whose windows it was made in, and is kept, gathered
again, prefetched, merged or reduced together within that micro-batch's windows (FSDP2 reshards
after each backward and gathers again in the next forward; a merged unit reduces once in each
micro-batch's backward). The sharded gradients are made as recorded (a merged unit's after its
reduction): the first micro-batch's reductions make them, the later ones add to them (their outputs
are buffers, freed at once). An earlier step's block still alive in this one, and a buffer the
trace never saw freed (on CPU, gloo's threads free an asynchronous collective's tensors where the
profiler does not look), stay as recorded, but for the recorded bucket's flat buffers under another
ZeRO-3 bucket, which that bucket does not make. A setting that can only add memory is never predicted
below the recorded peak (:mod:`fsdpviz.whatif.bounds`).

The level under the setting at any instant is the recorded level plus what the setting changes
there; its peak over the step is the prediction. With the recorded setting nothing changes, so
the replay is exact. Left as recorded: activations (a setting does not change them), the caching
allocator's rounding.

Why one module of ~700 lines: the rules above move the same blocks (:class:`Block`) in one order
(:func:`_moved_blocks`: reshard, prefetch, then for merged units the flat gradients, the reductions
and the merge), and each reads what the one before it moved (a merged unit's members are merged where
the prefetch moved them). Apart, each rule would need the others' block lists and times to be read.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.memory_split import Split, split_levels
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.replay import zero3_fetch

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
    reduction: bool = False  # a buffer of its gradient reduction (the reduce-scatter input, copy-in temporaries)
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
    # categories that cannot be known on this rank, with why (memory_split.Split.unknown), and
    # the bytes of them the levels hold by assumption (analysis.memory.ASSUMED_OPTIMIZER_STATES)
    unknown: dict[str, str] = field(default_factory=dict)
    assumed: dict[str, int] = field(default_factory=dict)

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
    recorded_prefetch: str = "implicit"  # the recording's: "implicit" or N
    notes: list[str] = field(default_factory=list)
    # FSDP1 gathers straight into one flat parameter per unit (its other gather blocks: the
    # low-precision input shard, freed in the gather), and makes a reduction's sharded gradient
    # inside it, while the reduce-scatter input is alive (FSDP2: after its copy-in)
    framework: str = vocabulary.FSDP2
    # ZeRO-3 under another prefetch bucket (elements; None: the recorded one): its forward gathers
    # carry other parameters (:mod:`.zero3_fetch`), read from each unit's parameters' elements, over
    # ``shards`` ranks, ``element_bytes`` each; FSDP1's merged units hold back their members'
    # parameter-sized gradients (:func:`_flat_gradients`)
    zero3_bucket: int | None = None
    zero3_recorded: tuple[int, int] | None = None  # the recording's bucket and shards (None: not recorded)
    unit_params: dict[str, tuple[int, ...]] = field(default_factory=dict)
    shards: int = 1
    element_bytes: int = 0
    # CPU (gloo): the host runs each collective to its end, so a gather's copy-out is where its transfer
    # ended, and a prefetch the next pre-backward issues after that copy-out starts after it (on a GPU
    # the host issues it while the device still copies, and the copy-out's host time says nothing of
    # when the transfer ends)
    synchronous: bool = False


def step_memory(rank: int, step: int, t0: int, t1: int, t: np.ndarray, cats: mcat.Categorised,
                split: Split, windows: pd.DataFrame) -> StepMemory | None:
    """The :class:`StepMemory` of one rank's step ``[t0, t1]`` from its categorised samples (``t``:
    their times; ``split``: the persistent share divided, memory_split.split_persistent) and the
    step's unit windows (windows.WINDOWS rows). None without samples."""
    if not len(t):
        return None
    a = max(int(np.searchsorted(t, t0, side="right")) - 1, 0)  # the level the step opens at
    b = int(np.searchsorted(t, t1, side="right"))
    if b <= a:
        return None
    levels = split_levels(cats.levels[a:b], cats.persistent, split)
    times = t[a:b].copy()
    times[0] = max(int(times[0]), t0)
    spans: dict[Pass, tuple[int, int]] = {}
    computed: dict[Pass, int] = {}
    micros = windows["micro"].to_numpy(np.int64) if "micro" in windows.columns else np.zeros(len(windows), np.int64)
    for u, ph, m, s, e, r in zip(windows["unit"].astype(str).tolist(), windows["phase"].astype(str).tolist(), micros,
                                 windows["start_ns"].to_numpy(np.int64), windows["end_ns"].to_numpy(np.int64),
                                 windows["region_end_ns"].to_numpy(np.int64)):
        key = (u, ph, int(m))
        old = spans.get(key)
        spans[key] = (int(s), int(e)) if old is None else (min(old[0], int(s)), max(old[1], int(e)))
        computed[key] = max(computed.get(key, int(r)), int(r))
    pass_of = _pass_finder(spans, t1)
    rows = cats.blocks
    live = rows[((rows["alloc_ns"] < t1) & (rows["free_ns"] > t0)).to_numpy()] if len(rows) else rows
    reduction = live["reduction"] if "reduction" in live else pd.Series(False, index=live.index)
    blocks = []
    for u, c, al, fr, n, r in (zip(live["unit"], live["category"], live["alloc_ns"], live["free_ns"], live["bytes"],
                                   reduction.fillna(False)) if len(live) else ()):
        phase, micro = pass_of(int(al))
        blocks.append(Block(unit=str(u), category=str(c), phase=phase, alloc=int(al), free=int(fr), bytes=int(n),
                            reduction=bool(r), micro=micro, own=int(al) >= t0))
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


def _copy(b: Block, **change: int | str | bool) -> Block:
    return replace(b, **change)  # type: ignore[arg-type]


def _moved_blocks(sm: StepMemory, s: MemorySetting) -> list[Block]:
    """The step's unit blocks as the setting would make them; an earlier step's blocks still alive
    stay as recorded (but a recorded ZeRO-3 flat buffer under another bucket: :func:`_held_over`)."""
    earlier = [b for b in sm.blocks if not b.own]
    if s.zero3_bucket is not None:
        earlier = _held_over(sm, s, earlier)
    blocks = [_copy(b) for b in sm.blocks
              if b.own and not (s.drop_gather_buffers and b.category == _BUFFERS and not b.reduction)]
    if s.zero3_bucket is not None:
        blocks = _rebucketed(sm, s, blocks)
    out: list[Block] = []
    by_unit: dict[str, list[Block]] = {}
    for b in blocks:
        by_unit.setdefault(b.unit, []).append(b)
    for unit, mine in by_unit.items():
        out.extend(b for b in mine if not _gathered(b))
        gathered = [b for b in mine if _gathered(b)]
        for micro in sorted({b.micro for b in gathered}):
            out.extend(_resharded(sm, s, unit, micro, [b for b in gathered if b.micro == micro]))
    # prefetch depth counts recorded units (a merged unit's members move together afterwards)
    moved = _prefetched(sm, s, out)
    if all(s.group.get(u, u) == u for u in {b.unit for b in moved}):
        return earlier + moved
    reduced: list[Block] = []
    for micro in sorted({b.micro for b in moved if not _gathered(b)}):  # a merged unit reduces in each backward
        mine = [b for b in moved if not _gathered(b) and b.micro == micro]
        if s.framework == vocabulary.FSDP1:  # its parameters' gradients wait for the flat one; the reduction does not see them
            mine, waiting = _flat_gradients(s, mine)
            reduced += waiting
        reduced += _reduced_together(s, mine)
    return earlier + _merged(sm, s, [b for b in moved if _gathered(b)]) + reduced


def _rebucketed(sm: StepMemory, s: MemorySetting, blocks: list[Block]) -> list[Block]:
    """ZeRO-3's forward gathers under another prefetch bucket, per micro-batch
    (:func:`.zero3_fetch.forward_gathers`): the recorded forward gathers' blocks freed before backward
    (their flat buffers, the collective's staging) go; each new gather of several parameters holds a
    flat buffer from its issuer's fetch (the issuer's window start) to the fetch that waits for its
    last parameter. The parameters DeepSpeed copies out of a buffer (``torch.cat`` in the first wait,
    kept until their backward release) stay as recorded: they are made at another fetch under another
    bucket, and every one is alive from the forward's last fetch to its backward either way. A
    gather of one parameter gathers into the parameter itself: no buffer (the recorded one alive
    into backward stays: it is that parameter).

    A recorded block the size of one of the recorded bucket's flat buffers goes even when it was
    freed in backward: on CPU, gloo's worker thread drops its reference to a collective's tensors
    after the wait has returned, and under load that can be milliseconds late. Not where a single
    parameter has that size too (:func:`_recorded_flat_sizes`): then its free alone tells them apart."""
    out = list(blocks)
    for micro in sorted({m for (_, _, m) in sm.windows}):
        starts = {u: w[0] for (u, ph, m), w in sm.windows.items() if ph == vocabulary.FORWARD and m == micro}
        backward = min((w[0] for (_, ph, m), w in sm.windows.items() if ph == vocabulary.BACKWARD and m == micro),
                       default=int(sm.t[-1]))
        order = sorted(starts, key=starts.__getitem__)
        flat = _recorded_flat_sizes(s, order)
        out = [b for b in out if not (_gathered(b) and b.phase == vocabulary.FORWARD and b.micro == micro
                                      and (b.free < backward or b.bytes in flat))]
        for g in zero3_fetch.forward_gathers(order, s.unit_params, s.zero3_bucket or 0, s.shards):
            if g.buffer_elements:
                alloc = starts[g.issuer]
                out.append(Block(unit=", ".join(dict.fromkeys(u for u, _ in g.params)), category=_PARAMS,
                                 phase=vocabulary.FORWARD, alloc=alloc, free=max(alloc, starts[g.freed_by]),
                                 bytes=g.buffer_elements * s.element_bytes, micro=micro))
    return out


def _held_over(sm: StepMemory, s: MemorySetting, earlier: list[Block]) -> list[Block]:
    """An earlier step's blocks still alive in this one, under another ZeRO-3 bucket: less the recorded
    bucket's flat buffers among them. On CPU gloo's worker thread can hold a collective's last tensors
    into the next step (the allocator counts them alive throughout); such a buffer is the recorded
    bucket's, which the other bucket does not make, and whether one of its own is held so is the
    machine's timing, not the setting's."""
    starts = {u: w[0] for (u, ph, m), w in sm.windows.items() if ph == vocabulary.FORWARD and m == 0}
    flat = _recorded_flat_sizes(s, sorted(starts, key=starts.__getitem__))
    return [b for b in earlier if not (_gathered(b) and b.bytes in flat)]


def _recorded_flat_sizes(s: MemorySetting, order: list[str]) -> set[int]:
    """The sizes (bytes) of the recording's forward flat buffers (:func:`_rebucketed`), less any a single
    parameter also has (gathered alone into itself, or copied out of a buffer): a block of such a size
    may be a parameter kept into backward, so only its free can tell."""
    if s.zero3_recorded is None:
        return set()
    bucket, shards = s.zero3_recorded
    sizes = {g.buffer_elements * s.element_bytes
             for g in zero3_fetch.forward_gathers(order, s.unit_params, bucket, shards) if g.buffer_elements}
    params = {n * s.element_bytes for ns in s.unit_params.values() for n in ns}
    params |= {math.ceil(n / shards) * shards * s.element_bytes for ns in s.unit_params.values() for n in ns}
    return sizes - params


def _gathered(b: Block) -> bool:
    """A block a unit's gather made (its unsharded parameters, its all-gather buffers)."""
    return b.category in (_PARAMS, _BUFFERS) and not b.reduction


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
        # freed where its backward gather's parameters were (its post-backward reshard, before the
        # reduction); without a backward gather, at the end of its backward window
        end = max([b.free for b in mine if b.phase == vocabulary.BACKWARD and b.category == _PARAMS],
                  default=bwd_window[1] if bwd_window else None)
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
    issue = _issue_time(sm, unit, vocabulary.BACKWARD, micro, 1, s.order, s.framework)
    copy_out = max(bwd_window[0], issue)
    output = max((b.bytes for b in fwd if b.category == _BUFFERS), default=0)
    out = []
    for b in fwd:
        out.append(_copy(b, free=min(b.free, fwd_window[1]) if b.category == _PARAMS else b.free))
        if b.category == _PARAMS:
            # freed by its post-backward reshard (before the reduction), where the recording freed them
            end = b.free if bwd_window[0] <= b.free <= bwd_window[1] else bwd_window[1]
            out.append(_copy(b, phase=vocabulary.BACKWARD, alloc=copy_out, free=max(end, copy_out)))
        elif b.bytes == output:
            out.append(_copy(b, phase=vocabulary.BACKWARD, alloc=issue, free=copy_out))
        else:
            out.append(_copy(b, phase=vocabulary.BACKWARD, alloc=issue, free=min(copy_out, issue + b.free - b.alloc)))
    return out


def _issue_time(sm: StepMemory, unit: str, phase: str, micro: int, ahead: int, order: list[str],
                framework: str = vocabulary.FSDP2) -> int:
    """When a unit's gather is issued ``ahead`` units early in ``phase`` of micro-batch ``micro``: in
    the window of the unit that many before it in that phase's order (its own window's start when
    none) -- FSDP2 prefetches from a unit's pre-forward and pre-backward after that unit's own
    ``wait_for_unshard``, so after its copy-out (its parameters made there and, outside forward's
    deferred free, its all-gather output freed; the window's start where the trace shows none)."""
    # FSDP2 prefetches between the root's children: the root neither issues nor is a target
    ordered = [u for u in (order if phase == vocabulary.FORWARD else list(reversed(order)))
               if (u, phase, micro) in sm.windows and u != ROOT_UNIT]
    own = sm.windows.get((unit, phase, micro), (int(sm.t[0]), int(sm.t[-1])))[0]
    if unit not in ordered:
        return own
    i = ordered.index(unit)
    j = max(0, i - ahead)
    if ahead <= 0:
        return own
    issuer = ordered[j]
    start, end = sm.windows[(issuer, phase, micro)]
    if framework == vocabulary.FSDP2:
        mine = [b for b in sm.blocks if b.own and b.unit == issuer and b.phase == phase and b.micro == micro
                and not b.reduction]
        # its copy-out made its parameters and, unless deferred (forward), freed its all-gather output
        copied = [b.alloc for b in mine if b.category == _PARAMS and start <= b.alloc <= end]
        copied += [b.free for b in mine if b.category == _BUFFERS and copied and min(copied) <= b.free <= end]
        start = max(copied, default=start)
    return min(own, start)


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
    until the new copy-out. One the trace never saw freed (its free fell on a thread the profiler did
    not follow) stays so: the recorded level holds it, whatever the setting."""
    alloc = new_issue + (b.alloc - issued)
    if b.free == mcat.NOT_FREED:
        return _copy(b, alloc=alloc)
    if copy_out is not None and b.free < copy_out:
        return _copy(b, alloc=alloc, free=alloc + (b.free - b.alloc))
    return _copy(b, alloc=alloc, free=max(alloc, new_copy_out))


def _merged(sm: StepMemory, s: MemorySetting, blocks: list[Block]) -> list[Block]:
    """Units gathered together (``blocks``: what the gathers made), per new unit, phase and
    micro-batch: the members' gathers issued when the first member's was -- in backward, with FSDP2's
    one-ahead prefetch, when the new unit before it in that micro-batch's backward starts, and on CPU
    not before that unit's copy-out (its pre-backward runs its own gather to the end and copies it out
    before it issues the prefetch) -- (their buffers as :func:`_moved_buffer` moves them); FSDP2's merged
    copy-out not before the first member's, nor before the last of the members' staging buffers is
    freed (one transfer carries every member: its staging goes when it ends, and the copy-out follows);
    the all-gather output freed at that copy-out -- in forward, where FSDP2 keeps a gather's output
    until the next unit's copy-out, when the last member's was --, every member's parameters made at
    that copy-out and freed when the last member's are."""
    copy_outs, issued = _first_made(blocks, _PARAMS), _first_made(blocks, _BUFFERS)
    groups: dict[Pass, list[Block]] = {}
    for b in blocks:
        groups.setdefault((s.group.get(b.unit, b.unit), b.phase, b.micro), []).append(b)
    implicit = s.prefetch == "implicit" or (s.prefetch == "recorded" and not s.recorded_prefetch.isdigit())
    ahead = _backward_issues(sm, s) if implicit else {}  # explicit: as _prefetched moved the members
    out = []
    fsdp1 = s.framework == vocabulary.FSDP1
    made_at: dict[Pass, int] = {}  # new unit, phase, micro -> its copy-out (a prefetch it issues follows it)
    firsts = {key: min(b.alloc for b in members) for key, members in groups.items()}
    # in the order the gathers were issued, so that the unit issuing a prefetch is placed before it
    for (new, phase, micro), members in sorted(groups.items(), key=lambda g: firsts[g[0]]):
        params = [b for b in members if b.category == _PARAMS]
        buffers = [b for b in members if b.category == _BUFFERS]
        first = firsts[(new, phase, micro)]
        copy_out = min((b.alloc for b in params), default=first)
        issue = min((b.alloc for b in buffers), default=copy_out)
        if phase == vocabulary.BACKWARD and (new, micro) in ahead:
            start, before = ahead[(new, micro)]
            issue = min(start, copy_out)
            if s.synchronous and not fsdp1:
                issue = max(issue, made_at.get((before, phase, micro), issue))
                copy_out = max(copy_out, issue)
        merged = len({b.unit for b in members}) > 1
        if not merged and issue == min((b.alloc for b in buffers), default=copy_out):
            made_at[(new, phase, micro)] = copy_out
            out.extend(members)
            continue
        if fsdp1:  # the gather writes the flat parameter: made at the issue; its temporaries live as long as they did
            flat: dict[Pass, Block] = {}
            for b in params:
                key = (b.unit, b.phase, b.micro)
                flat[key] = max(flat.get(key, b), b, key=lambda x: x.bytes)
            starts = _first_made(params, _PARAMS)
            issue = copy_out = min(issue, first)
            for b in params:
                if b is not flat[(b.unit, b.phase, b.micro)]:
                    made = issue + (b.alloc - starts[(b.unit, b.phase, b.micro)])
                    out.append(_copy(b, unit=new, alloc=made, free=made + (b.free - b.alloc)))
            params = list(flat.values())
        else:  # FSDP2: the copy-out after the one transfer, whose staging goes when it ends
            copy_out = max([copy_out] + [_moved_buffer(b, issued[(b.unit, b.phase, b.micro)], issue,
                                                       copy_outs.get((b.unit, b.phase, b.micro)), issue).free
                                         for b in buffers if _temporary(b, copy_outs)])
        made_at[(new, phase, micro)] = copy_out
        params_end = max((b.free for b in params), default=copy_out)
        output_end = copy_out
        outputs = [b for b in buffers if not _temporary(b, copy_outs)]
        if phase == vocabulary.FORWARD and outputs:  # the last member's output, where the trace saw it freed
            output_end = max(copy_out, max((b.free for b in outputs if b.free != mcat.NOT_FREED), default=copy_out))
        out += [_copy(b, unit=new, alloc=copy_out, free=max(copy_out, params_end)) for b in params]
        for b in buffers:
            key = (b.unit, b.phase, b.micro)
            out.append(_copy(_moved_buffer(b, issued[key], issue, copy_outs.get(key), output_end), unit=new))
    return out


def _temporary(b: Block, copy_outs: dict[Pass, int]) -> bool:
    """A gather's buffer freed before its unit's copy-out (the copy-in, a backend's staging buffer)."""
    copy_out = copy_outs.get((b.unit, b.phase, b.micro))
    return copy_out is not None and b.free < copy_out


def _backward_issues(sm: StepMemory, s: MemorySetting) -> dict[tuple[str, int], tuple[int, str]]:
    """Per new unit and micro-batch, when FSDP2's backward prefetch (one unit ahead) issues its
    gather, and the unit that issues it: when the new unit before it in that micro-batch's backward
    starts its backward (the root neither issues nor is a target; the first in backward is gathered by
    its own pre-backward: absent)."""
    starts: dict[int, dict[str, int]] = {}
    for (unit, phase, micro), (start, _) in sm.windows.items():
        new = s.group.get(unit, unit)
        if phase == vocabulary.BACKWARD and unit != ROOT_UNIT and new != ROOT_UNIT:
            mine = starts.setdefault(micro, {})
            mine[new] = min(mine.get(new, start), start)
    out: dict[tuple[str, int], tuple[int, str]] = {}
    for micro, mine in starts.items():
        order = sorted(mine, key=mine.__getitem__)
        out.update({(new, micro): (mine[before], before) for before, new in itertools.pairwise(order)})
    return out


def _flat_gradients(s: MemorySetting, blocks: list[Block]) -> tuple[list[Block], list[Block]]:
    """FSDP1's gradients of merged units in one micro-batch's backward: autograd makes a unit's flat
    gradient (its last unsharded-gradient block) from its parameters' own gradients (the others)
    when the unit's backward ends. A merged unit's members' parameter gradients wait until its last
    member's were freed (its flat gradient made); the one flat gradient is made when the last
    member's was and freed when it was, and reduced once: the members' sharded gradients are made
    where the last member's was. Returns the blocks
    without the merged members' parameter gradients, and those."""
    grads: dict[str, list[Block]] = {}
    for b in blocks:
        if b.category == _GRADS:
            grads.setdefault(b.unit, []).append(b)
    flat = {u: max(mine, key=lambda b: (b.alloc, b.bytes)) for u, mine in grads.items()}
    groups: dict[str, list[str]] = {}
    for u in flat:
        groups.setdefault(s.group.get(u, u), []).append(u)
    out = [b for b in blocks if b.category not in (_GRADS, _REDUCED) or (b.category == _REDUCED and b.unit not in flat)]
    waiting = []
    reduced = [b for b in blocks if b.category == _REDUCED and b.unit in flat]
    for us in groups.values():
        final = max(us, key=lambda u: flat[u].alloc)
        last = flat[final]
        # the merged gradient is made when the last member's was: its parameters' gradients freed then
        made = max((b.free for b in grads[final] if b is not last and b.free <= last.free), default=last.alloc)
        # one reduction, the last member's: the sharded gradients made where its own was
        output = min((b.alloc for b in reduced if b.unit == final and b.alloc >= last.alloc), default=None)
        for b in reduced:
            if b.unit in us and b.unit != final and output is not None and b.alloc >= flat[b.unit].alloc:
                out.append(_copy(b, alloc=output, free=max(output, b.free)))
            elif b.unit in us:
                out.append(b)
        for u in us:
            params = _parameter_gradients(s, u, flat[u], [b for b in grads[u] if b is not flat[u] and b.free <= flat[u].free])
            for b in grads[u]:
                if len(us) == 1 or b is last:
                    out.append(b)
                elif b is flat[u]:
                    out.append(_copy(b, alloc=last.alloc, free=max(last.alloc, last.free)))
                elif id(b) in params:
                    # a parameter's gradient, freed when the flat gradient was made
                    waiting.append(_copy(b, free=max(b.free, made)))
                else:
                    out.append(b)
    return out, waiting


UNSIZED_GRADIENTS_NOTE: Final = (
    "memory: a merged FSDP1 unit's members hold every gradient block their backward freed before their flat "
    "gradient until the merged one is made, not their parameters' gradients alone: the recording does not list "
    "its units' parameters (run.json, which fsdpviz record writes), so that part of the predicted peak may be too high")


def _parameter_gradients(s: MemorySetting, unit: str, flat: Block, freed_before: list[Block]) -> set[int]:
    """Which of a unit's gradient blocks freed before its flat gradient (``flat``; ``freed_before``) are
    its parameters' own gradients (ids): as many of each parameter's size as the unit has parameters of
    it, where run.json lists them, the last freed first (autograd frees them as it makes the flat
    gradient). The unit's backward frees other blocks before its flat gradient too, of any size (its
    modules' own gradient temporaries: an expert loop's, one the size of a weight), which do not wait
    for it. A size is the parameter's elements times the gradients' bytes per element, read off the flat
    gradient (the gradients' dtype, which a mixed-precision policy makes other than the parameters'), as
    the allocator reports it (a CUDA block rounded up to 512 bytes). Without run.json's sizes every
    such block counts."""
    sizes = s.unit_params.get(unit)
    if not sizes:
        if freed_before:
            s.notes.append(UNSIZED_GRADIENTS_NOTE)
        return {id(b) for b in freed_before}
    elements = sum(sizes)
    each = next((k for k in (1, 2, 4, 8) if elements * k <= flat.bytes <= _allocator_bytes(elements * k)),
                s.element_bytes)
    if not each:
        return {id(b) for b in freed_before}
    left = Counter(n * each for n in sizes)
    rounded = {_allocator_bytes(n): n for n in left}
    picked = set()
    for b in sorted(freed_before, key=lambda b: -b.free):
        size = b.bytes if left[b.bytes] > 0 else rounded.get(b.bytes, -1)
        if left[size] > 0:
            left[size] -= 1
            picked.add(id(b))
    return picked


def _allocator_bytes(n: int) -> int:
    """``n`` bytes as a CUDA caching allocator's block reports them: rounded up to 512."""
    return -(-n // 512) * 512


def _reduced_together(s: MemorySetting, blocks: list[Block]) -> list[Block]:
    """The reductions of merged units in one micro-batch's backward (``blocks``: the units'
    gradients and reduction buffers). A new unit reduces once, when its last member in backward
    reduced: its reduce-scatter input (the members' inputs, in the reduce dtype) is made then and
    freed when the next reduction starts (FSDP2 frees the last one at the end of backward); the
    copy-in fills it member after member, their temporaries with them, within the last member's own
    copy-in (the recorded times after it stay); the members' unsharded gradients are kept until the
    whole copy-in is done, and the sharded gradients made after it."""
    by_unit: dict[str, list[Block]] = {}
    for b in blocks:
        by_unit.setdefault(b.unit, []).append(b)
    inputs = {u: max((b for b in mine if b.reduction), key=lambda b: (b.bytes, -b.alloc))
              for u, mine in by_unit.items() if any(b.reduction for b in mine)}
    if not inputs:
        return blocks
    copied = {}  # unit -> when its copy-in ended (its unsharded gradients were freed)
    for u, rs in inputs.items():
        frees = [b.free for b in by_unit[u] if b.category == _GRADS and b.free >= rs.alloc]
        copied[u] = max(frees, default=rs.alloc)
    order = {u: i for i, u in enumerate(s.order)}
    groups: dict[str, list[str]] = {}
    for u in sorted(inputs, key=lambda u: order.get(u, len(order))):  # FSDP copies in forward order
        groups.setdefault(s.group.get(u, u), []).append(u)
    start = {g: max(inputs[u].alloc for u in us) for g, us in groups.items()}
    # The recorded steps are not moved in time: the merged copy-in fits in the last member's own
    # (the host went on to the next unit's backward then), each member's share as long as its copy-in was.
    shift, done, scale = {}, {}, {}
    for g, us in groups.items():
        last = max(us, key=lambda u: inputs[u].alloc)
        total = sum(copied[u] - inputs[u].alloc for u in us)
        done[g] = copied[last]
        factor = min(1.0, (done[g] - start[g]) / total) if total > 0 else 1.0
        at = float(start[g])
        for u in us:
            shift[u], scale[u] = at, factor
            at += factor * (copied[u] - inputs[u].alloc)
    # FSDP1: the merged reduction's output is made where the last member's was (inside it)
    made_inside = {g: min((b.alloc for b in by_unit[max(us, key=lambda u: inputs[u].alloc)] if b.category == _REDUCED
                           and b.alloc >= start[g]), default=start[g]) for g, us in groups.items()}
    by_start = sorted(start, key=start.__getitem__)
    recorded = sorted(inputs.values(), key=lambda b: b.alloc)
    freed = {}
    for g, after in zip(by_start, [*by_start[1:], None]):
        if s.framework == vocabulary.FSDP1:  # FSDP1 frees it in the reduction: when the last member's was
            freed[g] = inputs[max(groups[g], key=lambda u: inputs[u].alloc)].free
            continue
        if after is None:  # the last reduction's input: freed when the recorded last one was
            freed[g] = max(inputs[u].free for u in groups[g])
            continue
        # freed when the next reduction starts: as the input recorded just before it was
        earlier = [b for b in recorded if b.alloc < start[after]]
        freed[g] = earlier[-1].free if earlier else start[after]
    out = []
    for u, mine in by_unit.items():
        if u not in shift:
            out.extend(mine)
            continue
        g, opened = s.group.get(u, u), inputs[u].alloc
        for b in mine:
            if b is inputs[u]:
                out.append(_copy(b, unit=g, category=_BUFFERS, alloc=start[g], free=max(start[g], freed[g])))
            elif b.reduction:
                made = round(shift[u] + scale[u] * (b.alloc - opened))
                free = b.free if b.free == mcat.NOT_FREED else made + round(scale[u] * (b.free - b.alloc))
                out.append(_copy(b, unit=g, alloc=made, free=free))
            elif b.category == _GRADS and b.free >= inputs[u].alloc:
                out.append(_copy(b, unit=g, free=max(b.alloc, done[g])))
            elif b.category == _REDUCED and b.alloc >= inputs[u].alloc:
                made = made_inside[g] if s.framework == vocabulary.FSDP1 else done[g] + max(0, b.alloc - copied[u])
                out.append(_copy(b, unit=g, alloc=made, free=max(made, b.free)))
            else:
                out.append(b)
    return out


def _prefetched(sm: StepMemory, s: MemorySetting, blocks: list[Block]) -> list[Block]:
    """An explicit prefetch of N: each unit's gather issued at the start of the unit N before it in
    its micro-batch (earlier only, unless the recording prefetched an explicit number of units too;
    back to FSDP2's implicit prefetch from such a recording: none ahead in forward, one in backward),
    its buffers moved with it (:func:`_moved_buffer`; FSDP2 frees a forward output where it did -- at
    the next unit's copy-out, whatever the prefetch -- and a backward one at the unit's copy-out);
    ``none``: not before the unit's own window. The unsharded parameters stay where they were made: at the unit's copy-out, in its own
    window."""
    explicit = s.recorded_prefetch.isdigit()  # the recording's issues are N ahead: move them either way
    if s.prefetch == "recorded" or (s.prefetch == "implicit" and not explicit):
        return blocks
    copy_outs, issued = _first_made(blocks, _PARAMS), _first_made(blocks, _BUFFERS)
    out = []
    for b in blocks:
        if not _gathered(b) or b.category != _BUFFERS:  # parameters at the copy-out, gradients by backward: unmoved
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
        # implicit: FSDP2 gathers a unit in its own pre-forward, and one unit ahead in backward
        ahead = int(s.prefetch) if s.prefetch.isdigit() else int(b.phase == vocabulary.BACKWARD)
        new_issue = _issue_time(sm, b.unit, b.phase, b.micro, ahead, s.order, s.framework)
        if not explicit:
            new_issue = min(first, new_issue)
        # a buffer the trace never saw freed (its free fell on a thread the profiler did not follow)
        # stays so: the recorded level holds it, whatever the setting
        end = min(b.free, own[0]) if own and b.free != mcat.NOT_FREED else b.free
        if s.framework == vocabulary.FSDP2:
            # wait_for_unshard frees the output where the recording did, whatever the prefetch: a
            # forward one at the next unit's copy-out (deferred), a backward one after its own copy
            end = b.free
        out.append(_moved_buffer(b, first, new_issue, copy_out, max(end, copy_out or end)))
    return out
