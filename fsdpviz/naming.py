"""How fsdpviz names FSDP units: one home for the rules the recorder and the analysis share.

A unit is named by the module FQN the user wrote, relative to the sharded root:

- wrapper components that frameworks insert between a module and its children are removed
  (``_fsdp_wrapped_module.blocks.3`` and ``blocks.3._checkpoint_wrapped_module`` -> ``blocks.3``);
- the root module's own unit is ``(root)`` (FSDP2's labels for it carry no name);
- a unit of several modules (FSDP2's ``fully_shard([model.norm, model.output])``) is one name in
  brackets, ``[norm, output]``: FSDP2 itself labels it ``norm, output``, which reads as two units
  next to the other names.

Dependency-free: imported on the rank side (no pandas) and by the analysis (no torch).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

ROOT_UNIT: Final = "(root)"
# Module names that wrappers insert between a module and its children.
WRAPPER_COMPONENTS: Final = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def clean_fqn(fqn: str) -> str:
    """The FQN the user wrote: wrapper components removed, ``(root)`` for the root itself."""
    parts = [part for part in fqn.split(".") if part and part not in WRAPPER_COMPONENTS]
    return ".".join(parts) or ROOT_UNIT


def group_name(fqns: Sequence[str]) -> str:
    """The name of a unit covering ``fqns`` (already cleaned): the FQN, or ``[a, b]`` for several."""
    names = list(dict.fromkeys(fqns))
    return names[0] if len(names) == 1 else f"[{', '.join(names)}]"


def unit_from_label(fqn: str) -> str:
    """The unit an FSDP2 label names (``FSDP::pre_forward (norm, output)`` -> ``[norm, output]``)."""
    parts = [part.strip() for part in fqn.split(",")]
    return group_name([clean_fqn(part) for part in parts if part] or [ROOT_UNIT])


def unit_modules(name: str) -> list[str]:
    """The module FQNs a unit name covers (``[norm, output]`` -> ``norm``, ``output``)."""
    if name.startswith("[") and name.endswith("]"):
        return [part.strip() for part in name[1:-1].split(",") if part.strip()]
    return [name]


def list_units(names: Iterable[str], limit: int | None = None) -> str:
    """Unit names for one line of text; beyond ``limit`` the rest is counted, never cut silently."""
    names = list(names)
    if limit is None or len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"
