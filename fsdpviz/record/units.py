"""The unit table: which modules FSDP2, FSDP1 or ZeRO-3 gather together, named as the user wrote them.

A unit is what one parameter gather covers: an FSDP2 parameter group (one per ``fully_shard``
call), an FSDP1 ``FullyShardedDataParallel`` instance, or what DeepSpeed ZeRO-3 fetches for one
module (the module's own parameters, or all of a ZeRO-3 "leaf" module's). Units are named by the
module FQN relative to the sharded root (``fsdpviz.naming``: wrapper components removed, ``(root)``
for the root's own unit, ``[norm, output]`` for an FSDP2 unit of several modules).

ZeRO-3 fetches per submodule, so the code a block runs between its submodules (attention scores,
residual adds) and the model's own code around its blocks belong to no fetched unit. The ZeRO-3
table therefore also lists the root module and each parent block as units holding no parameters of
their own (``param_numel`` 0): the recorder labels their forward and backward too, and their own
code becomes their compute.

The builders only read attributes of the framework's objects; they never change them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from fsdpviz.naming import ROOT_UNIT, clean_fqn, group_name

CONTAINER_TYPES: Final = ("ModuleList", "ModuleDict", "Sequential")


def find_parent_block(fqn: str, container_element_fqns: Iterable[str]) -> str:
    """The nearest proper ancestor of ``fqn`` that is an element of a module container, or "".

    ``blocks.3.attn.qkv`` -> ``blocks.3`` when ``blocks`` is a ``ModuleList``: it groups the small
    units ZeRO-3 fetches into the blocks a user thinks in.
    """
    elements = set(container_element_fqns)
    parts = fqn.split(".")
    for end in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in elements:
            return candidate
    return ""


@dataclass(slots=True)
class Unit:
    """One row of run.json's ``units`` (see docs/run-folder.md)."""

    unit: str
    param_numel: int
    param_bytes: int
    dtype: str
    parent: str = ""
    reshard_after_forward: bool | None = None
    # HSDP's reshard_after_forward=<int>: the ranks its parameters stay sharded over after forward
    reshard_after_forward_size: int | None = None
    forward_prefetch: Any = None
    backward_prefetch: Any = None
    order: int = -1  # forward order, known after the first step
    shard_size: int | None = None  # ranks its parameters are sharded over (HSDP: the shard group)
    param_scope: str = ""  # "local": sizes after tensor parallelism (DTensor parameters); "global"; "" unknown
    params: list[tuple[str, int]] = field(default_factory=list)  # (FQN, unsharded numel) of each parameter
    modules: tuple[Any, ...] = field(default=(), repr=False)  # the nn.Modules (not serialised)
    key: Any = field(default=None, repr=False)  # the framework object behind the unit

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "order": self.order,
            "param_numel": self.param_numel,
            "param_bytes": self.param_bytes,
            "dtype": self.dtype,
            "parent": self.parent,
            "reshard_after_forward": self.reshard_after_forward,
            "reshard_after_forward_size": self.reshard_after_forward_size,
            "forward_prefetch": self.forward_prefetch,
            "backward_prefetch": self.backward_prefetch,
            "shard_size": self.shard_size,
            "param_scope": self.param_scope,
            "params": [[fqn, numel] for fqn, numel in self.params],
        }


def assign_order(units: list[Unit], first_seen: list[str]) -> None:
    """Order units by when their forward first ran; units never seen keep module order after them."""
    rank = {name: i for i, name in enumerate(dict.fromkeys(first_seen))}
    ordered = sorted(units, key=lambda u: (rank.get(u.unit, len(rank)), units.index(u)))
    for i, unit in enumerate(ordered):
        unit.order = i


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _group_size(group: Any) -> int | None:
    """Ranks in a process group (the group a unit is sharded over), None if it cannot be read."""
    import torch.distributed as dist

    try:
        return int(dist.get_world_size(group)) if dist.is_initialized() else None
    except (RuntimeError, ValueError, TypeError, AttributeError):
        return None


def _container_elements(root: Any) -> list[str]:
    names: list[str] = []
    for name, module in root.named_modules():
        if any(c.__name__ in CONTAINER_TYPES and c.__module__.startswith("torch.nn")
               for c in type(module).__mro__):
            names.extend(clean_fqn(f"{name}.{child}" if name else child) for child, _ in module.named_children())
    return names


def fsdp2_param_groups(state: Any) -> list[Any]:
    """The parameter groups of one FSDP2 state, on every torch that has ``fully_shard``.

    torch 2.13 keeps a list (``_fsdp_param_groups``: a module may have several groups); before it,
    one optional group (``_fsdp_param_group``). Read by what the state has, not by version.
    """
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [group] if group is not None else []


def _join(prefix: str, name: str) -> str:
    return clean_fqn(f"{prefix}.{name}" if prefix and prefix != ROOT_UNIT else name)


def fsdp2_param_fqns(group: Any, names: dict[Any, str]) -> list[tuple[str, int]]:
    """(FQN under the sharded root, unsharded numel) of each parameter of an FSDP2 group, from the
    module and attribute name FSDP2 registered it under; [] where this torch keeps them elsewhere."""
    out = []
    for fp in group.fsdp_params:
        info = getattr(fp, "_module_info", None)
        if info is None or info.module not in names:
            return []
        out.append((_join(clean_fqn(names[info.module]), info.param_name), int(fp._orig_size.numel())))
    return out


def build_fsdp2_units(root: Any) -> list[Unit]:
    """One unit per FSDP2 parameter group under ``root`` (the outermost ``fully_shard`` module)."""
    names = {module: name for name, module in root.named_modules()}
    state_names: dict[int, str] = {}
    units: list[Unit] = []
    states = []
    for module in root.modules():
        if hasattr(module, "_get_fsdp_state"):
            state = module._get_fsdp_state()
            if id(state) not in state_names:
                states.append(state)
                state_names[id(state)] = ""
    groups_of = {id(state): fsdp2_param_groups(state) for state in states}
    for state in states:
        for group in groups_of[id(state)]:
            name = group_name([clean_fqn(names.get(m, "")) for m in group.modules])
            state_names[id(state)] = name
            mp_dtype = group.mp_policy.param_dtype
            numel = sum(fp._orig_size.numel() for fp in group.fsdp_params)
            dtype = mp_dtype or (group.fsdp_params[0].sharded_param.dtype if group.fsdp_params else None)
            param_bytes = sum(
                fp._orig_size.numel() * (mp_dtype or fp.sharded_param.dtype).itemsize for fp in group.fsdp_params
            )
            units.append(Unit(unit=name, param_numel=numel, param_bytes=param_bytes, dtype=_dtype_name(dtype),
                              reshard_after_forward=group.post_forward_mesh_info is not None,
                              reshard_after_forward_size=_post_forward_size(group),
                              shard_size=int(getattr(group.mesh_info, "shard_mesh_size", 1)),
                              # FSDP2 shards a tensor-parallel DTensor's local part: sizes are that part
                              param_scope="local" if any(fp.is_dtensor for fp in group.fsdp_params) else "global",
                              params=fsdp2_param_fqns(group, names), modules=tuple(group.modules), key=group))
    for state, unit in ((s, u) for s in states for u in units if any(u.key is g for g in groups_of[id(s)])):
        forward = [state_names[id(t)] for t in state._states_to_forward_prefetch]
        backward = [state_names[id(t)] for t in state._states_to_backward_prefetch]
        unit.forward_prefetch = forward or "default"
        unit.backward_prefetch = backward or "default"
    return units


def _post_forward_size(group: Any) -> int | None:
    """An FSDP2 group's ``reshard_after_forward=<int>``: the size of the mesh its parameters are
    resharded to after forward, where that is not its own shard mesh (FSDP2 builds another mesh info
    for an int; ``True`` reuses the group's); None for ``True`` / ``False``."""
    post, own = group.post_forward_mesh_info, group.mesh_info
    if post is None or post is own:
        return None
    size = getattr(post, "shard_mesh_size", None)
    return int(size) if size is not None else None


def fsdp2_parallelism(units: list[Unit]) -> dict[str, int | None] | None:
    """The FSDP2 mesh and tensor-parallel degree of the units' parameter groups, as FSDP2 holds them:
    the shard and replicate mesh sizes of ``mesh_info``, and the size of the mesh of the DTensor
    parameters it was handed (tensor parallelism's). None without FSDP2 groups; a field is None
    where the groups disagree."""
    groups = [u.key for u in units if u.key is not None and hasattr(u.key, "mesh_info")]
    if not groups:
        return None

    def agreed(values: list[int | None]) -> int | None:
        return values[0] if values and all(v == values[0] for v in values) else None

    def tp_of(group: Any) -> int:
        sizes = [int(spec.mesh.size()) for fp in group.fsdp_params if fp.is_dtensor
                 for spec in [getattr(fp, "_unsharded_dtensor_spec", None)] if spec is not None]
        if getattr(group.mesh_info, "is_spmd_mesh", False):  # one mesh of DP and TP dims: TP is the rest
            dp = int(getattr(group.mesh_info, "shard_mesh_size", 1)) * int(
                getattr(group.mesh_info, "replicate_mesh_size", 1))
            sizes = [size // dp for size in sizes]
        return max(sizes, default=1)

    return {
        "dp_shard": agreed([int(getattr(g.mesh_info, "shard_mesh_size", 1)) for g in groups]),
        "dp_replicate": agreed([int(getattr(g.mesh_info, "replicate_mesh_size", 1)) for g in groups]),
        # units without DTensor parameters (a root of embeddings and head) are replicated over TP
        "tp": max(tp_of(g) for g in groups),
    }


def refresh_fsdp2_settings(units: list[Unit]) -> None:
    """Re-read what FSDP2 decided at its lazy init (the root's first forward): it keeps the root's
    parameters unsharded after forward whatever ``reshard_after_forward`` said (backward needs them
    at once), so run.json records the behaviour that ran, not the argument."""
    for unit in units:
        group = unit.key
        if group is not None and hasattr(group, "post_forward_mesh_info"):
            unit.reshard_after_forward = group.post_forward_mesh_info is not None


def build_fsdp1_units(root: Any) -> list[Unit]:
    """One unit per ``FullyShardedDataParallel`` instance (with parameters) under ``root``."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    resharding = {ShardingStrategy.FULL_SHARD, ShardingStrategy.HYBRID_SHARD}
    units = []
    instances = [name for name, module in root.named_modules() if isinstance(module, FullyShardedDataParallel)]
    for name, module in root.named_modules():
        if not isinstance(module, FullyShardedDataParallel) or module._handle is None:
            continue
        # an outermost instance is a root (FSDP1's lazy init), and FSDP1 never frees a root's parameters
        # after forward, whatever its sharding strategy (backward needs them at once): run.json records
        # the behaviour that ran
        outermost = not any(name.startswith(f"{other}.") or (other == "" and name) for other in instances
                            if other != name)
        handle = module._handle
        flat_param = handle.flat_param
        numel = sum(flat_param._numels)
        dtype = getattr(handle, "_fwd_bwd_param_dtype", None) or flat_param.dtype
        backward = module.backward_prefetch
        # the flat parameter's original parameters, named relative to the module FSDP1 wraps
        fqns = getattr(flat_param, "_fqns", None) or ()
        numels = list(getattr(flat_param, "_numels", ()) or ())
        params = [(_join(clean_fqn(name), fqn), int(n)) for fqn, n in zip(fqns, numels)] \
            if len(fqns) == len(numels) else []
        units.append(Unit(
            unit=clean_fqn(name), param_numel=numel, param_bytes=numel * dtype.itemsize, dtype=_dtype_name(dtype),
            reshard_after_forward=module.sharding_strategy in resharding and not outermost,
            forward_prefetch=bool(module.forward_prefetch),
            backward_prefetch=backward.name if backward is not None else None,
            shard_size=_group_size(handle.process_group), params=params, modules=(module,), key=handle,
        ))
    return units


def fsdp1_parallelism(units: list[Unit]) -> dict[str, int | None] | None:
    """FSDP1's shard group size and, under hybrid sharding, its replica group's (``_inter_node_pg``).
    FSDP1 flattens the parameters it is handed, so the TP degree is not read here (None: the traces'
    process groups may tell it). None without FSDP1 units; a size is None where the units disagree."""
    modules = [u.modules[0] for u in units if u.modules]
    if not modules:
        return None
    shard = {u.shard_size for u in units}
    replicate = set()
    for module in modules:
        hybrid = "HYBRID" in getattr(module.sharding_strategy, "name", "")
        group = getattr(module, "_inter_node_pg", None) if hybrid else None
        replicate.add((_group_size(group) if group is not None else None) if hybrid else 1)
    return {"dp_shard": shard.pop() if len(shard) == 1 else None,
            "dp_replicate": replicate.pop() if len(replicate) == 1 else None, "tp": None}


def build_zero3_units(engine: Any) -> list[Unit]:
    """One unit per module DeepSpeed ZeRO-3 fetches on its own, with its parent block; then the
    root module and the parent blocks that are not already units, with no parameters of their own.

    DeepSpeed fetches a module's direct parameters when the module runs, or all parameters of a
    module marked as a ZeRO-3 leaf (``set_z3_leaf_modules``), whose submodules it does not hook.
    """
    model = engine.module
    prefetch = engine.zero_prefetch_bucket_size()
    elements = _container_elements(model)
    modules = {clean_fqn(name): module for name, module in model.named_modules()}
    units = []
    leaf_prefixes: list[str] = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix + ".") for prefix in leaf_prefixes):
            continue
        is_leaf = bool(getattr(module, "_z3_leaf", False))
        if is_leaf:
            leaf_prefixes.append(name)
        named_params = list(module.named_parameters(recurse=is_leaf))
        params = [p for _, p in named_params]
        if not params:
            continue
        numel = sum(int(getattr(p, "ds_numel", p.numel())) for p in params)
        nbytes = sum(int(getattr(p, "ds_numel", p.numel())) * p.dtype.itemsize for p in params)
        fqn = clean_fqn(name)
        units.append(Unit(
            unit=fqn, param_numel=numel, param_bytes=nbytes, dtype=_dtype_name(params[0].dtype),
            parent=find_parent_block(fqn, elements) if fqn != ROOT_UNIT else "",
            forward_prefetch=prefetch, backward_prefetch=prefetch,
            shard_size=_group_size(getattr(params[0], "ds_process_group", None)),
            params=[(_join(fqn, n), int(getattr(p, "ds_numel", p.numel()))) for n, p in named_params],
            modules=(module,), key=module,
        ))
    named = {unit.unit for unit in units}
    groups = [ROOT_UNIT] + sorted({unit.parent for unit in units if unit.parent}, key=list(modules).index)
    for fqn in groups:
        if fqn not in named and fqn in modules:
            units.append(Unit(unit=fqn, param_numel=0, param_bytes=0, dtype="",
                              parent=find_parent_block(fqn, elements) if fqn != ROOT_UNIT else "",
                              modules=(modules[fqn],), key=modules[fqn]))
    return units
