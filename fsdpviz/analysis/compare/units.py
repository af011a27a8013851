"""Which units of different runs hold the same parameters: unit groups for a per-unit comparison.

Two runs of one model with different wrap policies name their units differently: per-block wrapping
has ``blocks.0`` and ``blocks.1``, pairs of blocks have ``blocks.0+1``, ZeRO-3 fetches submodules
(``blocks.0.qkv`` with parent block ``blocks.0``). Comparing them unit by unit needs groups of units
that hold the same parameters in every run, so that each group's numbers can be summed per run and
set side by side. This module finds those groups from unit names alone (the runs' parameter
names are not recorded), with these rules:

- a unit's *keys* are the modules it covers: its name; each module of an FSDP2 group of several
  modules (``"[a, b]"``, also ``"a, b"`` as older recordings name it); each part of a last name component joined by ``+`` (``blocks.0+1`` ->
  ``blocks.0``, ``blocks.1``: how the example's ``--wrap pair`` names its ``BlockPair`` containers);
  its ``parent`` when that is a grouping block and not itself a unit of the run (ZeRO-3 submodules);
- units sharing a key are one group; a key inside another run's unit (``blocks.0.qkv`` when
  another run has a unit ``blocks.0`` and none ``blocks.0.qkv``) joins that unit's group;
- a run without a unit for a group holds those parameters in an enclosing unit: the unit named
  by the longest dotted prefix of the group's keys, else its root unit ``(root)``. The group then
  joins that unit's group (``tok_emb`` of ZeRO-3 joins FSDP2's ``(root)``), except in a run made
  of one unit only (root wrapping), which would fold every group into one: such a run is shown as
  holding the whole model and compared on the totals.

Groups whose parameter bytes differ between runs are flagged: the runs then differ in their
model, or the names misled the matching.

Names are the last resort. :func:`match_units` matches, in this order:

1. by the parameters each unit holds (run.json ``units[].params``, recorded by ``fsdpviz record``):
   by FQN when every run names the same parameters, else by position and size in forward order
   (a model restructured between runs: ``blocks.0+1.0.qkv.weight`` is ``blocks.0.qkv.weight``) when
   every run holds the same sequence of parameter sizes. Units sharing a parameter are one group,
   so a group holds the same parameters in every run by construction. A unit without parameters
   (ZeRO-3's parent blocks and root) joins the group of the first unit inside it;
2. by names, as above, when that gives groups of equal parameter bytes in every run;
3. by unit sizes in forward order: group boundaries where every run's running total of unit bytes
   coincides (``blocks.0`` + ``blocks.1`` of one run against ``layers.0`` of a run whose first layer
   holds two blocks), when every run's unit bytes are known and the totals agree;
4. by names with the differing groups flagged, when nothing else fits.

A group is named by a unit that covers exactly its parameters in every run (checked against the
parameters' FQNs where recorded, else against the other runs' unit names); otherwise by the units
of the run that splits it finest (``blocks.0 + blocks.1``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from fsdpviz.naming import ROOT_UNIT, unit_modules

T = TypeVar("T")


def all_known(values: Sequence[T | None]) -> list[T] | None:
    """``values`` when none is missing (None), else None: a sum over units exists only when every
    unit has the number."""
    known = [v for v in values if v is not None]
    return known if len(known) == len(values) else None

# Per-unit numbers of the summary's ``units`` entries that a group sums over its units.
SUM_METRICS: Final = ("param_bytes", "all_gather_ms", "forward_ms", "backward_ms", "reduce_scatter_ms",
                      "exposed_comm_ms", "forward_exposed_all_gather_ms", "backward_exposed_all_gather_ms",
                      "exposed_reduce_scatter_ms")
MAX_METRICS: Final = ("peak_allocated_bytes",)  # a group's peak is the highest of its units' peaks
# The exposed times of a unit whose collectives carried other units too (ZeRO-3's buckets) count for the
# one unit that waited on each collective: a group has them only where it holds each of its buckets whole.
EXPOSED_METRICS: Final = ("exposed_comm_ms", "forward_exposed_all_gather_ms", "backward_exposed_all_gather_ms",
                          "exposed_reduce_scatter_ms")
# A unit index entry's key (:func:`fsdpviz.analysis.compare.model.unit_index`): every unit its collectives
# carried, with the units those carried in turn (absent where each of its collectives carried it alone).
BUCKET_KEY: Final = "bucketed_with"


@dataclass(frozen=True, slots=True)
class RunUnit:
    """One unit of one run, as the matching needs it."""

    name: str
    order: int
    param_bytes: int | None  # unsharded parameter bytes, None if unknown
    parent: str = ""
    params: tuple[tuple[str, int], ...] = ()  # (FQN, numel) of each parameter, () if not recorded


@dataclass(kw_only=True, slots=True)
class UnitGroup:
    """Units of every run that hold the same parameters (see the module docstring)."""

    name: str  # how the page names the group
    order: int  # forward order of its first unit
    members: dict[str, list[str]]  # run label -> its units in this group (forward order), [] if none
    held_by: dict[str, str] = field(default_factory=dict)  # run label -> unit holding it when not a member
    param_bytes: dict[str, int | None] = field(default_factory=dict)  # run label -> sum over members
    bytes_differ: bool = False  # members' parameter bytes differ between runs

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "order": self.order, "members": self.members, "held_by": self.held_by,
                "param_bytes": self.param_bytes, "param_bytes_differ": self.bytes_differ}


@dataclass(kw_only=True, slots=True)
class UnitMatch:
    """The groups of a comparison, and the runs compared on totals only."""

    groups: list[UnitGroup]
    whole_model: dict[str, str]  # run label -> its only unit, for runs made of one unit
    keys: dict[str, dict[str, list[str]]]  # run label -> unit -> the modules it covers
    basis: str = "unit names"  # what matched the units: one of BASES
    # whether every run's units listed their parameters (run.json): a match by names or sizes then means
    # the runs' parameters differ, not that they are unknown
    params_listed: bool = False


def unit_keys(name: str) -> list[str]:
    """The modules a unit covers, read from its name (see the module docstring)."""
    keys: list[str] = []
    for module in (part.strip() for named in unit_modules(name) for part in named.split(",")):
        if not module:
            continue
        head, _, last = module.rpartition(".")
        parts = last.split("+")
        if len(parts) > 1 and all(parts):
            keys.extend(f"{head}.{p}" if head else p for p in parts)
        else:
            keys.append(module)
    return keys or [name]


def _is_inside(key: str, ancestor: str) -> bool:
    return key.startswith(ancestor + ".")


class _Groups:
    """Union-find over module keys."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _run_keys(units: Sequence[RunUnit]) -> dict[str, list[str]]:
    names = {u.name for u in units}
    out = {}
    for u in units:
        keys = unit_keys(u.name)
        if u.parent and u.parent not in names and u.parent != ROOT_UNIT:
            keys = [u.parent]  # a grouping block (ZeRO-3 submodule -> its block), not an enclosing unit
        out[u.name] = keys
    return out


def _holder(keys: Mapping[str, list[str]], wanted: Sequence[str]) -> str | None:
    """The unit of one run that holds ``wanted`` modules: longest dotted prefix, else the root."""
    best, best_len = None, -1
    for unit, unit_keys_ in keys.items():
        for k in unit_keys_:
            if any(_is_inside(w, k) for w in wanted) and len(k) > best_len:
                best, best_len = unit, len(k)
    if best is None and ROOT_UNIT in keys and not any(w == ROOT_UNIT for w in wanted):
        best = ROOT_UNIT
    return best


BY_FQN: Final = "parameter names"
BY_PARAM_SIZES: Final = "parameter sizes in forward order"
BY_NAMES: Final = "unit names"
BY_UNIT_SIZES: Final = "unit sizes in forward order"
BASES: Final = (BY_FQN, BY_PARAM_SIZES, BY_NAMES, BY_UNIT_SIZES)


def match_units(runs: Mapping[str, Sequence[RunUnit]]) -> UnitMatch:
    """Group the units of several runs (label -> units) into groups that hold the same parameters
    in every run (the module docstring says how)."""
    most = max((len(u) for u in runs.values()), default=0)
    whole = {label: units[0].name for label, units in runs.items() if len(units) == 1 and most > 1}
    by_params = _match_by_parameters(runs, whole)
    if by_params is not None:
        return by_params
    by_names = _match_by_names(runs, whole)
    chosen = by_names if not any(g.bytes_differ for g in by_names.groups) else \
        _match_by_unit_sizes(runs, whole) or by_names
    chosen.params_listed = _params_listed(runs, whole)
    return chosen


def _params_listed(runs: Mapping[str, Sequence[RunUnit]], whole: Mapping[str, str]) -> bool:
    """Whether every unit with parameters, of every run compared unit by unit, lists their names."""
    return not any(not u.params and (u.param_bytes is None or u.param_bytes > 0)
                   for label, units in runs.items() if label not in whole for u in units)


def _match_by_names(runs: Mapping[str, Sequence[RunUnit]], whole: Mapping[str, str]) -> UnitMatch:
    keys = {label: _run_keys(units) for label, units in runs.items()}
    uf = _Groups()
    for label, per_unit in keys.items():
        for unit_keys_ in per_unit.values():
            for k in unit_keys_:
                uf.union(unit_keys_[0], k)
    # A module that is a unit in one run but inside another run's unit joins that unit's group.
    all_keys = {k for label in keys if label not in whole for ks in keys[label].values() for k in ks}
    for label, per_unit in keys.items():
        if label in whole:
            continue
        own = {k for ks in per_unit.values() for k in ks}
        for k in all_keys - own:
            holder = _holder(per_unit, [k])
            if holder is not None and holder != ROOT_UNIT:
                uf.union(k, per_unit[holder][0])
    # Groups a run has no unit for: the run's enclosing unit (often its root) holds them.
    changed = True
    while changed:
        changed = False
        members = _members(keys, uf, whole)
        for root_key, by_run in members.items():
            wanted = sorted(k for k in all_keys if uf.find(k) == root_key)
            for label, per_unit in keys.items():
                if label in whole or by_run.get(label):
                    continue
                holder = _holder(per_unit, wanted)
                if holder is not None and uf.find(per_unit[holder][0]) != root_key:
                    uf.union(per_unit[holder][0], root_key)
                    changed = True
                    break
            if changed:
                break
    return UnitMatch(groups=_build_groups(runs, keys, uf, whole), whole_model=dict(whole), keys=keys)


def _inside(unit: str, other: str) -> bool:
    """Whether unit ``other`` lies inside the modules of unit ``unit`` (by name)."""
    if unit == ROOT_UNIT:
        return other != ROOT_UNIT
    return any(_is_inside(o, m) for m in unit_modules(unit) for o in unit_modules(other))


def _components(runs: Mapping[str, Sequence[RunUnit]], whole: Mapping[str, str],
                ids: Mapping[str, Mapping[str, list[str]]], basis: str,
                fqns: Mapping[str, Mapping[str, list[str]]] | None) -> UnitMatch:
    """Groups from parameter ids (run label -> unit -> ids of the parameters it holds): units that
    share an id are one group; units holding none join the group of the first unit inside them."""
    uf = _Groups()
    node = {label: {u: f"{label}\x00{u}" for u in per_unit} for label, per_unit in ids.items()}
    for label, per_unit in ids.items():
        for unit, unit_ids in per_unit.items():
            for pid in unit_ids:
                uf.union(node[label][unit], "\x01" + pid)
    for label, per_unit in ids.items():
        ordered = sorted(runs[label], key=lambda u: u.order)
        for unit, unit_ids in per_unit.items():
            if unit_ids:
                continue
            inner = next((u.name for u in ordered if per_unit.get(u.name) and _inside(unit, u.name)), None)
            if inner is not None:
                uf.union(node[label][unit], node[label][inner])
    info = {label: {u.name: u for u in units} for label, units in runs.items()}
    by_root: dict[str, dict[str, list[str]]] = {}
    for label, per_unit in ids.items():
        for unit in per_unit:
            by_root.setdefault(uf.find(node[label][unit]), {}).setdefault(label, []).append(unit)
    groups = []
    for by_run in by_root.values():
        if not any(ids[label][u] for label, units in by_run.items() for u in units):
            continue  # units of no parameters with nothing inside them
        members = {label: _forward_order(info[label], by_run.get(label, [])) for label in runs}
        held_by = {label: whole[label] for label in runs if label in whole}
        sizes, order = _sizes_and_order(info, members, runs)
        group = UnitGroup(name=_agreed_name(members, fqns), order=0, members=members, held_by=held_by,
                          param_bytes=sizes, bytes_differ=_bytes_differ(sizes))
        groups.append((order, group))
    groups.sort(key=lambda pair: (pair[0], pair[1].name))
    for i, (_, g) in enumerate(groups):
        g.order = i
    # colours: a unit's first parameter id stands for it, so units starting with one parameter share a slot
    keys = {label: {u: (list(unit_ids[:1]) or [u]) for u, unit_ids in per_unit.items()}
            for label, per_unit in ids.items()}
    return UnitMatch(groups=[g for _, g in groups], whole_model=dict(whole), keys=keys, basis=basis)


def _agreed_name(members: Mapping[str, list[str]], fqns: Mapping[str, Mapping[str, list[str]]] | None) -> str:
    """A unit name that covers exactly the group's parameters in every run, else the finest run's
    units joined (see the module docstring)."""
    present = {label: names for label, names in members.items() if names}
    lists = {tuple(names) for names in present.values()}
    if len(lists) == 1:
        same = list(next(iter(lists)))
        return same[0] if len(same) == 1 else _joined(same)
    for owner, names in present.items():
        if len(names) != 1:
            continue
        candidate = names[0]
        if all(_covers(candidate, other, fqns[label] if fqns is not None else None)
               for label, other in present.items() if label != owner):
            return candidate
    return _joined(max(present.values(), key=len))


def _covers(candidate: str, units: Sequence[str], fqns: Mapping[str, list[str]] | None) -> bool:
    """Whether a unit name covers what ``units`` of another run hold: their parameter FQNs all lie
    in its modules (or, without FQNs, their names do)."""
    if candidate == ROOT_UNIT:
        return ROOT_UNIT in units
    modules = unit_keys(candidate)
    held = [f for u in units for f in fqns.get(u, [])] if fqns is not None else \
        [k for u in units for k in unit_keys(u)]
    return bool(held) and all(any(h == m or _is_inside(h, m) for m in modules) for h in held)


def _joined(names: list[str]) -> str:
    return " + ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]} ({len(names)} units)"


def _match_by_parameters(runs: Mapping[str, Sequence[RunUnit]], whole: Mapping[str, str]) -> UnitMatch | None:
    """Step 1 of the module docstring; None when a run lacks its parameters or the runs' parameters
    differ in names and in sizes."""
    compared = {label: units for label, units in runs.items() if label not in whole}
    if len(compared) < 2 and not whole:
        return None
    if not _params_listed(compared, {}):
        return None  # a unit with parameters whose names were not recorded
    fqns = {label: {u.name: [f for f, _ in u.params] for u in units} for label, units in compared.items()}
    names = [sorted(f for per_unit in fqns[label].values() for f in per_unit) for label in compared]
    if all(n == names[0] for n in names) and len(set(names[0])) == len(names[0]):
        return _components(runs, whole, fqns, BY_FQN, fqns)
    sequences = {label: [n for u in sorted(units, key=lambda u: u.order) for _, n in u.params]
                 for label, units in compared.items()}
    first = next(iter(sequences.values()))
    if not all(seq == first for seq in sequences.values()):
        return None
    ids: dict[str, dict[str, list[str]]] = {}
    for label, units in compared.items():
        position = 0
        ids[label] = {}
        for u in sorted(units, key=lambda u: u.order):
            ids[label][u.name] = [str(position + i) for i in range(len(u.params))]
            position += len(u.params)
    return _components(runs, whole, ids, BY_PARAM_SIZES, fqns)


def _match_by_unit_sizes(runs: Mapping[str, Sequence[RunUnit]], whole: Mapping[str, str]) -> UnitMatch | None:
    """Step 3 of the module docstring; None when a run's unit bytes are unknown, the totals differ
    or no boundary but the end is shared."""
    compared = {label: sorted(units, key=lambda u: u.order) for label, units in runs.items() if label not in whole}
    if len(compared) < 2 or any(u.param_bytes is None for units in compared.values() for u in units):
        return None
    running: dict[str, list[int]] = {}
    for label, units in compared.items():
        total, ends = 0, []
        for u in units:
            total += int(u.param_bytes or 0)
            ends.append(total)
        running[label] = ends
    totals = {ends[-1] for ends in running.values() if ends}
    if len(totals) != 1:
        return None
    shared = sorted(set.intersection(*(set(ends) for ends in running.values())))
    ids: dict[str, dict[str, list[str]]] = {}
    for label, units in compared.items():
        ids[label] = {}
        for u, end in zip(units, running[label]):
            segment = next(i for i, b in enumerate(shared) if end <= b)
            ids[label][u.name] = [f"segment {segment}"] if u.param_bytes else []
    return _components(runs, whole, ids, BY_UNIT_SIZES, None)


def _members(keys: Mapping[str, Mapping[str, list[str]]], uf: _Groups,
             whole: Mapping[str, str]) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    for label, per_unit in keys.items():
        if label in whole:
            continue
        for unit, unit_keys_ in per_unit.items():
            out.setdefault(uf.find(unit_keys_[0]), {}).setdefault(label, []).append(unit)
    return out


def _sizes_and_order(info: Mapping[str, Mapping[str, RunUnit]], members: Mapping[str, list[str]],
                     runs: Iterable[str]) -> tuple[dict[str, int | None], tuple[int, ...]]:
    """A group's parameter bytes per run holding members (None where a member's size is unknown) and its
    sort key: its forward position in the first run that has it, then in the next runs."""
    sizes: dict[str, int | None] = {}
    for label, names in members.items():
        if names:
            known = all_known([info[label][n].param_bytes for n in names])
            sizes[label] = sum(known) if known is not None else None
    order = tuple(min((info[lb][n].order for n in members[lb]), default=1 << 30) for lb in runs)
    return sizes, order


def _bytes_differ(sizes: Mapping[str, int | None]) -> bool:
    """Whether the runs whose size is known hold different parameter bytes in the group."""
    return len({v for v in sizes.values() if v is not None}) > 1


def _forward_order(units: Mapping[str, RunUnit], names: Sequence[str]) -> list[str]:
    return sorted(names, key=lambda n: units[n].order)


def _build_groups(runs: Mapping[str, Sequence[RunUnit]], keys: Mapping[str, Mapping[str, list[str]]],
                  uf: _Groups, whole: Mapping[str, str]) -> list[UnitGroup]:
    info = {label: {u.name: u for u in units} for label, units in runs.items()}
    groups: list[UnitGroup] = []
    orders: dict[int, tuple[int, ...]] = {}
    for by_run in _members(keys, uf, whole).values():
        members = {label: _forward_order(info[label], by_run.get(label, [])) for label in runs}
        wanted = sorted(k for label in by_run for n in by_run[label] for k in keys[label][n])
        held_by = {}
        for label in runs:
            if members[label]:
                continue
            if label in whole:
                held_by[label] = whole[label]
            else:
                holder = _holder(keys[label], wanted)
                if holder is not None:
                    held_by[label] = holder
        sizes, order = _sizes_and_order(info, members, runs)
        groups.append(UnitGroup(name=_group_name(members), order=0, members=members, held_by=held_by,
                                param_bytes=sizes, bytes_differ=_bytes_differ(sizes)))
        orders[id(groups[-1])] = order
    groups.sort(key=lambda g: (orders[id(g)], g.name))
    for i, g in enumerate(groups):
        g.order = i
    return groups


def _group_name(members: Mapping[str, list[str]]) -> str:
    """The name of a run's unit that covers the whole group (the coarsest such unit), else a list."""
    present = [names for names in members.values() if names]
    single = [names[0] for names in present if len(names) == 1]
    if single:
        return max(single, key=lambda n: len(unit_keys(n)))  # max keeps the first of equals
    finest = max(present, key=len)
    return " + ".join(finest) if len(finest) <= 3 else f"{finest[0]} … {finest[-1]} ({len(finest)} units)"


def splits_bucket(names: Sequence[str], buckets: Mapping[str, Iterable[str]]) -> bool:
    """Whether a collective of ``names``' units carried a unit outside them too (``buckets``: per unit,
    every unit its collectives were bucketed with, :data:`BUCKET_KEY`): the group then has no exposed
    time of its own, since a bucket's exposed time counts for whichever of its units waited on it."""
    inside = set(names)
    return any(not inside.issuperset(buckets.get(n, ())) for n in names)


def group_values(group: UnitGroup, label: str, units: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """Sums (and peaks) of the summary's per-unit numbers over a group's units in one run.

    ``units``: unit name -> the summary's ``units`` entry of that run. A number is None when the
    run has no unit in the group or any of its units lacks it, and the exposed times are None where
    a collective of the group's units carried a unit outside it too (:data:`EXPOSED_METRICS`): its
    exposed time then counts for whichever unit of the bucket waited on it, perhaps outside the group.
    """
    names = group.members.get(label, [])
    out: dict[str, float | None] = {}
    split = splits_bucket(names, {n: units.get(n, {}).get(BUCKET_KEY, ()) for n in names})
    for metric in (*SUM_METRICS, *MAX_METRICS):
        values = all_known([units.get(n, {}).get(metric) for n in names])
        if not names or values is None or (split and metric in EXPOSED_METRICS):
            out[metric] = None
        elif metric in MAX_METRICS:
            out[metric] = max(values)
        else:
            out[metric] = round(sum(values), 3) if metric != "param_bytes" else int(sum(values))
    return out


def color_slots(match: UnitMatch, labels: Sequence[str]) -> dict[str, dict[str, int]]:
    """A colour slot per unit of each run, shared by the units that cover the same module.

    The modules of all runs are numbered in group order (then run order, then forward order), and
    each unit takes the number of its first module: ``blocks.2`` of one run and ``blocks.2+3`` of
    another get the same slot, neighbours ``blocks.2`` and ``blocks.3`` different ones.
    """
    slots: dict[str, int] = {}
    for group in match.groups:
        for label in labels:
            for unit in group.members.get(label, []):
                for key in match.keys[label][unit]:
                    slots.setdefault(key, len(slots))
    out: dict[str, dict[str, int]] = {}
    for label in labels:
        out[label] = {unit: slots.get(keys[0], len(slots)) for unit, keys in match.keys.get(label, {}).items()}
    return out
