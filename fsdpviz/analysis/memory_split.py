"""What was on the device before the trace and stayed, divided into the categories it holds.

:func:`fsdpviz.analysis.memory_categories.categorise` reads every allocation the trace holds; what was
allocated before the trace and never freed in it (the *persistent* share) it leaves in
``sharded_params``. This module divides that share once the units are known: the sharded parameters
(measured by ``fsdpviz record`` when the trace began, run.json ``ranks[].memory.trace_start``, else the
units' shards, :func:`sharded_state`), the gradients kept from step to step, the optimizer state
(measured), and the rest (``other``); what cannot be known is named, never 0 (:class:`Split`). It also
reads the recorder's measurements the memory model's K is made of (:func:`optimizer_bytes`,
:func:`master_bytes`). Apart from the categorisation because it reads the run folder's measurements,
not the trace's events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pandas as pd

from fsdpviz.analysis.memory_categories import (
    CATEGORIES,
    CODE,
    GRADIENTS,
    LEVEL_ALLOCATOR,
    LEVEL_MEASURED_BASELINE,
    LEVEL_SINCE_TRACE_START,
    OPTIMIZER_STATE,
    OTHER,
    SHARDED_PARAMS,
)
from fsdpviz.runfolder import RunInfo
from fsdpviz.trace.frames import CPU_DEVICE

_ELEMENT_SIZES: Final = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class ShardedState:
    """What the units' shards come to on one rank."""

    elements: float  # sum over units of numel / shard size
    bytes_per_element: int  # of the sharded parameters (and their gradients and optimizer states)
    measured: bool  # bytes per element from the sharded gradients (False: the units' own)


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


@dataclass(frozen=True, slots=True)
class Measured:
    """What the recorder measured in the training process when the trace began (run.json
    ``ranks[].memory.trace_start``); None where it could not measure."""

    sharded_param_bytes: int | None = None
    optimizer_state_bytes: int | None = None  # every optimizer's state, ZeRO-3's fp32 master copy included
    gradient_bytes_kept: int | None = None  # gradients alive then and still alive at the next step
    baseline_bytes: int = 0  # added to a level that starts at 0 with the trace (CPU)


@dataclass(frozen=True, slots=True)
class Split:
    """What was present before the trace, divided: ``parts`` per category (SHARDED_PARAMS,
    OPTIMIZER_STATE, GRADIENTS, OTHER; they add up to the persistent share), and the categories
    that cannot be known, each with why (their bytes, if any, stay in ``other``)."""

    parts: dict[str, int]
    unknown: dict[str, str]


SINCE_TRACE_START: Final = ("the CPU profiler counts only what was allocated since the trace began, and the "
                            "recording has no measurement of what was alive then")


def split_persistent(persistent: int, state: ShardedState | None, measured: Measured | None, *,
                     relative: bool, optimizer_made: bool, gradients_kept: bool = False) -> Split:
    """What was present before the trace and stayed (``persistent``), divided into the sharded
    parameters (measured by the recorder, else the units' shards ``state``), the gradients kept from
    step to step (``gradients_kept``: the reductions made none, ``zero_grad(set_to_none=False)``;
    measured, else as many as the parameters' shards), the optimizer state (measured; none when
    ``optimizer_made``: the optimizer made its state inside the trace) and the rest (``other``).

    ``relative``: the level starts at 0 with the trace (CPU); what the recorder measured alive then is
    part of it (the loader added it), else those categories are unknown. What cannot be known is
    named in ``Split.unknown`` and left in ``other``; ``other`` is then unknown too when bytes are
    left in it on an absolute level."""
    m = measured or Measured()
    unknown: dict[str, str] = {}
    remaining = persistent

    def take(category: str, value: int | None, why: str) -> int:
        nonlocal remaining
        if value is None:
            unknown[category] = why
            return 0
        got = min(remaining, max(0, value))
        remaining -= got
        return got

    one = round(state.elements * state.bytes_per_element) if state is not None else None
    no_units = "the units' parameter sizes are not known (no run.json units, no measurement by fsdpviz record)"
    params = take(SHARDED_PARAMS, m.sharded_param_bytes if m.sharded_param_bytes is not None
                  else (None if relative else one), SINCE_TRACE_START if relative else no_units)
    grads = 0
    if gradients_kept:
        unmeasured = ("fsdpviz record could not read this framework's gradients (ZeRO-3's partitions in a "
                      "recording made before fsdpviz read them, or an optimizer that offloads them)"
                      if measured is not None else SINCE_TRACE_START)
        grads = take(GRADIENTS, m.gradient_bytes_kept if m.gradient_bytes_kept is not None
                     else (None if relative else one),
                     unmeasured if relative else "the gradients kept from step to step are not measured")
    if optimizer_made and not m.optimizer_state_bytes:
        optimizer = 0
    else:
        optimizer = take(OPTIMIZER_STATE, m.optimizer_state_bytes, SINCE_TRACE_START if relative else
                         "the optimizer made its state before the trace and the recording has no measurement of "
                         "it (fsdpviz record measures it)")
    if unknown and remaining > 0:
        unknown[OTHER] = f"it holds what was allocated before the trace and cannot be divided ({', '.join(unknown)})"
    return Split(parts={SHARDED_PARAMS: params, OPTIMIZER_STATE: optimizer, GRADIENTS: grads, OTHER: remaining},
                 unknown=unknown)


def _moves(persistent: int, parts: Mapping[str, int]) -> dict[str, int]:
    """What each column gains when the persistent share (all in ``sharded_params``) is divided."""
    moved = {c: int(parts[c]) for c in (OPTIMIZER_STATE, GRADIENTS, OTHER)}
    moved[SHARDED_PARAMS] = int(parts[SHARDED_PARAMS]) - persistent
    return moved


def split_levels(levels: np.ndarray, persistent: int, split: Split) -> np.ndarray:
    """One rank's ``levels`` (samples x categories, ``sharded_params`` holding the persistent share as
    :func:`~fsdpviz.analysis.memory_categories.categorise` leaves it) with that share divided as ``split`` says."""
    out = levels.copy()
    for c, add in _moves(persistent, split.parts).items():
        out[:, CODE[c]] += add
    return out


def apply_split(frame: pd.DataFrame, persistent: Mapping[int, int], split: Mapping[int, Split]) -> pd.DataFrame:
    """``frame`` (category columns, ``sharded_params`` holding each rank's persistent share as
    :func:`~fsdpviz.analysis.memory_categories.categorise` leaves it) with each rank's share divided as ``split[rank]`` says."""
    if frame.empty or not split:
        return frame
    frame = frame.copy()
    ranks = frame["rank"].to_numpy()
    moves = {r: _moves(persistent[r], sp.parts) for r, sp in split.items()}
    for c in (SHARDED_PARAMS, OPTIMIZER_STATE, GRADIENTS, OTHER):
        share = pd.Series({r: m[c] for r, m in moves.items()}, dtype="int64")
        add = share.reindex(ranks).fillna(0).to_numpy(np.int64)  # one pass, whatever the number of ranks
        frame[c] = frame[c].to_numpy(np.int64) + add
    return frame


def with_unknown(frame: pd.DataFrame, unknown: Mapping[int, Mapping[str, str]]) -> pd.DataFrame:
    """``frame`` (category columns per rank) with each rank's unknown categories (``unknown``:
    :attr:`Split.unknown` per rank) as missing values (pandas ``Int64``), never 0."""
    if frame.empty or not unknown:
        return frame
    frame = frame.copy()
    ranks = frame["rank"].to_numpy()
    for c in CATEGORIES:
        missing = np.isin(ranks, [r for r, u in unknown.items() if c in u])
        if missing.any():
            frame[c] = frame[c].astype("Int64").mask(missing)
    return frame


def measured_of(run: RunInfo | None, rank: int) -> Measured | None:
    """What the recorder measured of ``rank`` when its trace began (run.json), None when nothing."""
    info = run.rank_info(rank) if run is not None else None
    start = info.memory.trace_start if info is not None and info.memory is not None else None
    if start is None:
        return None
    relative = start.device == CPU_DEVICE
    return Measured(sharded_param_bytes=start.sharded_param_bytes, optimizer_state_bytes=start.optimizer_bytes(),
                    gradient_bytes_kept=start.gradient_bytes_kept,
                    baseline_bytes=start.baseline_bytes() if relative else 0)


def split_of(fact: Mapping[Any, Any], state: ShardedState | None, run: RunInfo | None) -> Split:
    """The persistent share of one rank (a MEMORY_FACTS row) divided (:func:`split_persistent`)."""
    measured = measured_of(run, int(fact["rank"]))
    # kept from step to step: measured so, or the reductions made none
    kept = bool(measured is not None and measured.gradient_bytes_kept) or (
        int(fact["reductions"]) > 0 and int(fact["reduced_bytes"]) == 0)
    return split_persistent(int(fact["persistent_bytes"]), state, measured, relative=bool(fact["relative"]),
                            optimizer_made=bool(fact["optimizer_made"]), gradients_kept=kept)


def level_of(fact: Mapping[Any, Any], run: RunInfo | None) -> str:
    """What the allocated level of one rank (a MEMORY_FACTS row) counts (memory_categories.LEVEL_*)."""
    if not bool(fact["relative"]):
        return LEVEL_ALLOCATOR
    measured = measured_of(run, int(fact["rank"]))
    return LEVEL_MEASURED_BASELINE if measured is not None else LEVEL_SINCE_TRACE_START


def optimizer_bytes(split: dict[int, Split], states: dict[int, ShardedState | None], run: RunInfo | None,
                    made_in_trace: Mapping[int, bool]) -> int | None:
    """Optimizer bytes per sharded element (the memory model's K), from a rank whose shards are known:
    its optimizer state as the categories hold it (measured when the trace began), else, on a rank
    whose optimizer made its state inside the trace (``made_in_trace``: MEMORY_FACTS
    ``optimizer_made``), as the recorder measured it after the optimizers' last step (run.json
    ``ranks[].memory.optimizers``, ZeRO-3's master copy added); None otherwise."""
    for rank, sp in sorted(split.items()):
        state = states.get(rank)
        if OPTIMIZER_STATE not in sp.unknown and state is not None and state.elements > 0 \
                and sp.parts[OPTIMIZER_STATE] > 0:
            return round(sp.parts[OPTIMIZER_STATE] / state.elements)
    for rank, state in sorted(states.items()):
        info = run.rank_info(rank) if run is not None else None
        measured = info.memory if info is not None else None
        if (not made_in_trace.get(rank) or measured is None or not measured.optimizers or state is None
                or state.elements <= 0):
            continue
        master = measured.trace_start.master_param_bytes if measured.trace_start is not None else None
        return round((sum(o.state_bytes for o in measured.optimizers) + (master or 0)) / state.elements)
    return None


def master_bytes(run: RunInfo | None, states: dict[int, ShardedState | None]) -> int | None:
    """Of K, the bytes per sharded element of ZeRO-3's fp32 master copy of the parameters, as the
    recorder measured it on a rank whose shards are known; None where none was measured."""
    for rank, state in sorted(states.items()):
        info = run.rank_info(rank) if run is not None else None
        start = info.memory.trace_start if info is not None and info.memory is not None else None
        if start is not None and start.master_param_bytes and state is not None and state.elements > 0:
            return round(start.master_param_bytes / state.elements)
    return None
