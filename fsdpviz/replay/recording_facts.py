"""What a recording was set to and where it ran, as the what-if model reads it: the units in forward
order with their parameter bytes, modules and element counts, whether each resharded after forward
(declared in run.json, then as the trace shows: :func:`observed_reshard`), the ranks per host and the
CPUs. The programs of its steps are :mod:`.recording`'s; these are the facts around them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.naming import unit_modules as module_names
from fsdpviz.replay.recorded import StepProgram
from fsdpviz.structure import label_rules as rules
from fsdpviz.structure.categorical import as_str
from fsdpviz.structure.windows import first_backward_ns


def unit_order(result: RunResult) -> list[str]:
    units = result.analysis.units
    if units.empty:
        return []
    return [str(u) for u in units.sort_values("order")["unit"]]


def unit_bytes(result: RunResult, units: list[str]) -> dict[str, int]:
    table = result.analysis.units.set_index("unit")
    return {u: int(table.at[u, "param_bytes"]) if u in table.index else -1 for u in units}


def unit_modules(units: list[str]) -> dict[str, list[str]]:
    """Per unit, the modules it covers (by its name)."""
    return {u: module_names(u) for u in units}


def declared_reshard(result: RunResult, units: list[str]) -> dict[str, bool]:
    run = result.traces.run
    recorded = {u.unit: u.reshard_after_forward for u in run.units} if run is not None else {}
    return {u: bool(recorded.get(u, u != ROOT_UNIT)) if recorded.get(u) is not None else u != ROOT_UNIT
            for u in units}


def fsdp1_strategy(result: RunResult) -> str | None:
    """FSDP1's ``ShardingStrategy`` name as run.json's units say it: their ``reshard_after_forward``
    (the recorder's: the strategy reshards and the unit is not the outermost, which FSDP1 never reshards
    after forward) and a shard group smaller than the world (hybrid). None where they do not tell: no
    unit but the root, units that disagree or do not say, a shard group of one rank (FSDP1 then shards
    nothing, NO_SHARD, whatever it was told, and no unit reshards), a run that is not FSDP1's."""
    run = result.traces.run
    if run is None or run.framework != vocabulary.FSDP1:
        return None
    inner = {u.reshard_after_forward for u in run.units if u.unit != ROOT_UNIT}
    if len(inner) != 1 or None in inner:
        return None
    shards = {u.shard_size for u in run.units if u.shard_size is not None}
    if run.world_size == 1 or (shards and max(shards) <= 1):
        return None
    reshard = bool(inner.pop())
    world = run.world_size
    replicas = run.parallelism.dp_replicate if run.parallelism is not None else None
    hybrid = (world is not None and any(s < world for s in shards)) or (replicas is not None and replicas > 1)
    if hybrid:
        return "HYBRID_SHARD" if reshard else "_HYBRID_SHARD_ZERO2"
    return "FULL_SHARD" if reshard else "SHARD_GRAD_OP"


def reshard_sizes(result: RunResult) -> dict[str, int]:
    """Per unit run.json records with FSDP2's ``reshard_after_forward=<int>``: that int."""
    run = result.traces.run
    if run is None:
        return {}
    return {u.unit: u.reshard_after_forward_size for u in run.units if u.reshard_after_forward_size is not None}


def gather_label_phases(labels: pd.DataFrame, windows: pd.DataFrame, out: dict[str, set[str]]) -> None:
    """Add to ``out`` the phases in which each unit's own gather labels opened (in backward: at or
    after the first backward window of its rank, step and micro-batch: under gradient accumulation the
    next micro-batch's forward gathers come after the first one's backward), so that a unit's
    resharding is seen also where no collective ran (torch's fake process group)."""
    rows = labels[rules.gather(labels)]
    if rows.empty or windows.empty:
        return
    passes = pd.MultiIndex.from_frame(rows[["rank", "step", "micro"]])
    first_backward = first_backward_ns(windows).reindex(passes).to_numpy(dtype=np.float64)
    late = np.nan_to_num(first_backward, nan=np.inf) <= rows["start_ns"].to_numpy(np.float64)
    for unit, is_backward in zip(as_str(rows["unit"]), late.tolist()):
        for u in unit.split(","):
            out.setdefault(u, set()).add(vocabulary.BACKWARD if is_backward else vocabulary.FORWARD)


def observed_reshard(declared: dict[str, bool], programs: list[StepProgram],
                      label_phases: dict[str, set[str]] | None = None) -> dict[str, bool]:
    """What the trace shows wins over what was declared: a unit gathered in forward and never in
    backward kept its parameters (ZeRO-3's persisted or still-available parameters, FSDP1's
    ``SHARD_GRAD_OP``); one gathered in backward again resharded. Gathers are the collectives, and
    the units' gather labels (``label_phases``) where no collective ran."""
    phases: dict[str, set[str]] = {u: set(p) for u, p in (label_phases or {}).items()}
    for program in programs:
        for g in program.gathers:
            phases.setdefault(g.unit, set()).add(g.phase)
    out = dict(declared)
    for unit, seen in phases.items():
        if unit in out and vocabulary.FORWARD in seen:
            out[unit] = vocabulary.BACKWARD in seen
    return out


def unit_numels(result: RunResult) -> dict[str, int]:
    run = result.traces.run
    return {u.unit: u.param_numel for u in run.units if u.param_numel >= 0} if run is not None else {}


def unit_params(result: RunResult) -> dict[str, tuple[int, ...]]:
    """Per unit, its parameters' unsharded elements in the order the framework holds them, where
    run.json lists them (ZeRO-3 gathers parameters, not units: :mod:`.zero3_fetch`)."""
    run = result.traces.run
    return {u.unit: tuple(n for _, n in u.params) for u in run.units if u.params} if run is not None else {}


def unit_param_names(result: RunResult) -> dict[str, tuple[str, ...]]:
    """Per unit, its own parameters' names as run.json lists them (from the model's root); where run.json
    lists any unit's, a unit with none listed holds none (its parameters all in units nested in it)."""
    run = result.traces.run
    if run is None or not any(u.params for u in run.units):
        return {}
    return {u.unit: tuple(str(name) for name, _ in u.params) for u in run.units}


def ranks_per_host(result: RunResult) -> int:
    run = result.traces.run
    if run is None or not run.hosts:
        return max(1, result.analysis.world_size)
    return max(1, result.analysis.world_size // max(1, len(run.hosts)))


def cpu_count(result: RunResult) -> int:
    run = result.traces.run
    counts = [r.cpu_count for r in run.ranks if r.cpu_count] if run is not None else []
    return max(counts) if counts else 0
