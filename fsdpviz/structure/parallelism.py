"""The run's parallelism: over how many ranks FSDP shards (``dp_shard``), how many replicas all-reduce
(``dp_replicate``, HSDP) and the tensor-parallel degree (``tp``).

Sources, best first:

1. run.json ``parallelism``: the recorder asked FSDP2 in the process (its ``mesh_info`` and the
   DTensor parameters it was handed), see ``record/units.py: fsdp2_parallelism``;
2. the traces' distributedInfo ``pg_config`` (``RANKS.process_groups``): a ``DeviceMesh`` names
   each dimension's group ``mesh_<dim>``, and the dimension names say the role (``tp``,
   ``dp_replicate`` / ``replicate``, ``dp_shard`` / ``shard`` / ``dp`` / ``fsdp``). A trace whose
   groups all span the world (the default group, the unnamed 1-D meshes ``fully_shard`` makes) ran
   every collective over it: ``dp_shard`` = world size, ``dp_replicate`` = ``tp`` = 1 for a framework
   with units.

A field no source can tell is None, and a note says why; 0 is never "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import msgspec

from fsdpviz import vocabulary
from fsdpviz.structure.records import PARALLELISM_UNKNOWN, Note
from fsdpviz.trace.tables import TraceSet

MESH_PREFIX: Final = "mesh_"
DEFAULT_GROUP: Final = "default_pg"
TP_DIMS: Final = frozenset({"tp", "tensor", "tensor_parallel", "model", "mp"})
REPLICATE_DIMS: Final = frozenset({"dp_replicate", "replicate", "ddp", "hsdp_replicate", "rep"})
SHARD_DIMS: Final = frozenset({"dp_shard", "shard", "dp", "fsdp", "data_parallel"})
SOURCE_RUN_JSON: Final = "run.json"
SOURCE_TRACE: Final = "trace"


class Parallelism(msgspec.Struct, kw_only=True):
    """``summary --json``'s ``parallelism``: None where unknown."""

    dp_shard: int | None = None
    dp_replicate: int | None = None
    tp: int | None = None
    source: str | None = None
    """``run.json`` (the recorder asked FSDP2), ``trace`` (the process groups), None: nothing said."""

    @property
    def is_2d(self) -> bool:
        """More than one dimension of known size > 1 besides FSDP's sharding, or a replicate/TP dim."""
        return (self.tp or 1) > 1 or (self.dp_replicate or 1) > 1


def parallelism_text(p: Parallelism) -> str:
    """The parallelism in words for the terminal and the page, "-" for an unknown size."""
    def size(v: int | None) -> str:
        return "-" if v is None else str(v)

    return f"dp_shard {size(p.dp_shard)} x dp_replicate {size(p.dp_replicate)} x tp {size(p.tp)}"


@dataclass(frozen=True, slots=True)
class Group:
    """One process group of distributedInfo: its description, size and name."""

    desc: str
    size: int
    name: str


@dataclass(slots=True)
class RunParallelism:
    """The parallelism, the names of the tensor-parallel process groups, and notes."""

    parallelism: Parallelism
    tp_groups: frozenset[str] = frozenset()
    notes: list[Note] = field(default_factory=list)
    unknown_dims: tuple[str, ...] = ()
    """Device-mesh dimensions whose name is in none of the tables (``TP_DIMS``, ``REPLICATE_DIMS``,
    ``SHARD_DIMS``), so their role is unknown; a size left None by them is not 1."""

    @property
    def roles_unknown(self) -> bool:
        """The mesh has dimensions of unknown role and no other source said every size."""
        p = self.parallelism
        return bool(self.unknown_dims) and None in (p.dp_shard, p.dp_replicate, p.tp)


def known_dims() -> str:
    """The dimension names whose role fsdpviz knows, per role, for messages."""
    return "; ".join(f"{role}: {', '.join(sorted(names))}" for role, names in
                     (("tp", TP_DIMS), ("dp_replicate", REPLICATE_DIMS), ("dp_shard", SHARD_DIMS)))


def parse_groups(text: str) -> list[Group]:
    """``RANKS.process_groups`` (``desc:size:name`` joined by ``;``) as groups."""
    out = []
    for entry in filter(None, text.split(";")):
        desc, _, rest = entry.partition(":")
        size, _, name = rest.partition(":")
        if size.isdigit():
            out.append(Group(desc, int(size), name))
    return out


def _from_groups(groups: list[Group], world: int, framework: str
                 ) -> tuple[Parallelism, frozenset[str], str, tuple[str, ...]]:
    """Parallelism from one rank's process groups; the third value says why a field is unknown (""),
    the fourth names the mesh dimensions of unknown role."""
    # every group spans the whole world (the default group, 1-D meshes FSDP2 makes per fully_shard call):
    # there is no second dimension, every collective ran over the world
    if groups and world > 0 and all(g.size in (1, world) for g in groups):
        if framework in vocabulary.FRAMEWORKS_WITH_UNITS:
            return Parallelism(dp_shard=world, dp_replicate=1, tp=1, source=SOURCE_TRACE), frozenset(), "", ()
        return Parallelism(tp=1, source=SOURCE_TRACE), frozenset(), "the framework shards nothing", ()
    mesh = {g.desc[len(MESH_PREFIX):]: g for g in groups if g.desc.startswith(MESH_PREFIX)}
    if not mesh:
        why = "the traces list no process groups" if not groups else (
            "the traces' process groups are not a DeviceMesh's (no mesh_<dim> group), so their roles are unknown")
        return Parallelism(), frozenset(), why, ()
    roles: dict[str, int | None] = {"dp_shard": 1, "dp_replicate": 1, "tp": 1}
    unknown = [dim for dim in mesh if dim not in TP_DIMS | REPLICATE_DIMS | SHARD_DIMS]
    tp_groups = _tp_group_names(groups)
    for dim, group in mesh.items():
        role = "tp" if dim in TP_DIMS else "dp_replicate" if dim in REPLICATE_DIMS else "dp_shard" \
            if dim in SHARD_DIMS else None
        if role is not None:
            roles[role] = (roles[role] or 1) * group.size
    why = ""
    if unknown:  # a dimension of unknown role could be any of the three
        roles = {k: None for k in roles}
        why = f"the device mesh has dimensions of unknown role ({', '.join(sorted(unknown))})"
    return Parallelism(**roles, source=SOURCE_TRACE), tp_groups, why, tuple(sorted(unknown))


def _tp_group_names(groups: list[Group]) -> frozenset[str]:
    """Names of the tensor-parallel groups among one rank's process groups."""
    return frozenset(g.name for g in groups if g.desc.startswith(MESH_PREFIX) and g.name
                     and g.desc[len(MESH_PREFIX):] in TP_DIMS)


def run_parallelism(traces: TraceSet, framework: str) -> RunParallelism:
    """The run's parallelism from run.json, completed from the traces' process groups."""
    world = traces.world_size
    texts = traces.ranks["process_groups"].astype(str).tolist() if "process_groups" in traces.ranks else []
    listed = [parse_groups(t) for t in texts]
    groups = next((g for g in listed if g), [])
    found, tp_groups, why, unknown_dims = _from_groups(groups, world, framework)
    # each rank lists its own groups: rank 2's TP group is not rank 0's
    tp_groups = tp_groups.union(*(_tp_group_names(g) for g in listed))
    recorded = traces.run.parallelism if traces.run is not None else None
    if recorded is not None:
        merged = Parallelism(
            dp_shard=recorded.dp_shard if recorded.dp_shard is not None else found.dp_shard,
            dp_replicate=recorded.dp_replicate if recorded.dp_replicate is not None else found.dp_replicate,
            tp=recorded.tp if recorded.tp is not None else found.tp, source=SOURCE_RUN_JSON)
        found, why = merged, why if None in (merged.dp_shard, merged.dp_replicate, merged.tp) else ""
    notes = [Note(PARALLELISM_UNKNOWN, f"parallelism: {why}; the unknown sizes are null")] if why else []
    if not why and None in (found.dp_shard, found.dp_replicate, found.tp):
        notes.append(Note(PARALLELISM_UNKNOWN, "parallelism: neither run.json nor the traces' process groups "
                          "say it; the unknown sizes are null"))
    return RunParallelism(found, tp_groups, notes, unknown_dims)
