"""One name per unit: run.json's names of FSDP2's units of several modules, spelled as the trace spells them.

FSDP2 names a unit of several modules in its labels by the modules in the order ``named_modules()``
walks them (``FSDP::all_gather (transformer.wte, transformer.ln_f, lm_head)``; torch's
``FSDPState._init_fqns``), and fsdpviz's tables name the unit ``[transformer.wte, transformer.ln_f,
lm_head]`` from those labels. ``fsdpviz record`` writes run.json's ``units`` and the timers in the order
the script passed the modules to ``fully_shard``: accelerate passes a model's tied tail as ``(final
norm, input embedding, output embedding)``. Read as they are, the two names are two units: the run.json
one without work, the traced one without its parameters, and no code written for it.

The set of modules is the unit; a run.json name whose modules the trace names in another order takes
the trace's spelling, in the units, their prefetch lists and the timers, before anything reads them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import msgspec

from fsdpviz.naming import unit_from_label, unit_modules

if TYPE_CHECKING:
    import pandas as pd

    from fsdpviz.runfolder import RunInfo, UnitInfo

# FSDP2's own record_function labels: ``FSDP::all_gather (blocks.3) [pg=2]``, ``FSDP::forward_prefetch for
# blocks.4`` (fsdpviz.structure.labels parses every label by these two; ``fqn``: the unit's modules, as written)
FSDP2_LABEL_RE: Final = re.compile(r"^FSDP::(?P<action>\w+)(?: \((?P<fqn>[^)]*)\))?(?: \[pg=\d+\])?$")
FSDP2_PREFETCH_RE: Final = re.compile(r"^FSDP::(?P<action>forward_prefetch|backward_prefetch) for ?(?P<fqn>.*)$")


def _listed(name: str) -> str:
    """The modules an FSDP2 label names, as written ("" where it names no unit of several)."""
    if "," not in name:
        return ""
    match = FSDP2_PREFETCH_RE.match(name) or FSDP2_LABEL_RE.match(name)
    listed = (match.group("fqn") or "") if match is not None else ""
    return listed if "," in listed else ""


def names_units(name: str) -> bool:
    """Whether an event name is an FSDP2 label of a unit of several modules (kept where a rank's event
    names are dropped: trace/digest.py)."""
    return bool(_listed(name))


def traced_spellings(names: Iterable[str]) -> dict[frozenset[str], str]:
    """The trace's name of each unit of several modules that an FSDP2 label names, by its set of modules."""
    out: dict[frozenset[str], str] = {}
    for name in names:
        if listed := _listed(name):
            unit = unit_from_label(listed)
            out.setdefault(frozenset(unit_modules(unit)), unit)
    return out


def traced_names(run: RunInfo | None, names: Iterable[str]) -> tuple[RunInfo | None, dict[str, str]]:
    """``run`` with its units of several modules named as the trace's FSDP2 labels name them, and the
    renames (run.json's name -> the trace's); ``run`` itself where none differs."""
    if run is None or not any(u.unit.startswith("[") for u in run.units):
        return run, {}
    spelled = traced_spellings(names)
    renamed = {u.unit: spelled[key] for u in run.units
               if (key := frozenset(unit_modules(u.unit))) in spelled and len(key) > 1 and spelled[key] != u.unit}
    if not renamed:
        return run, {}
    units = [_renamed(u, renamed) for u in run.units]
    return msgspec.structs.replace(run, units=units), renamed


def _renamed(unit: UnitInfo, renamed: dict[str, str]) -> UnitInfo:
    def listed(prefetch: object) -> object:
        return [renamed.get(p, p) for p in prefetch] if isinstance(prefetch, list) else prefetch

    return msgspec.structs.replace(unit, unit=renamed.get(unit.unit, unit.unit),
                                   parent=renamed.get(unit.parent, unit.parent),
                                   forward_prefetch=listed(unit.forward_prefetch),
                                   backward_prefetch=listed(unit.backward_prefetch))


def renamed_timers(timers: pd.DataFrame, renamed: dict[str, str]) -> pd.DataFrame:
    """The TIMERS table with its units named as :func:`traced_names` renamed them."""
    if not renamed or timers.empty:
        return timers
    return timers.assign(unit=timers["unit"].replace(renamed))
