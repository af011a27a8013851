"""Which framework sharded (or replicated) the model: decided once, from the traces and run.json.

- ``fsdp2``: FSDP2's own labels (``FSDP::...``), in any trace.
- ``fsdp1``: FSDP1's ranges (``FullyShardedDataParallel._pre_forward``, ...).
- ``zero3``: the ranges ``fsdpviz record`` puts around DeepSpeed's engine calls, or run.json says
  ``zero3`` next to fsdpviz's unit labels (DeepSpeed leaves no labels of its own).
- ``ddp``: ``DistributedDataParallel.forward`` ranges (DDP wraps every forward in one), or run.json
  says the recorder found a ``DistributedDataParallel`` model. DDP replicates the model and all-reduces
  gradients in buckets: there are no FSDP units. Users who asked a launcher for FSDP (the HF Trainer's
  ``fsdp=...``, ``accelerate launch --use_fsdp``) get DDP silently when accelerate runs without GPUs,
  so fsdpviz says so.
- ``unknown``: none of these.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure.records import DDP, NO_TRAINING, UNCONNECTED_RANKS, Note
from fsdpviz.trace.tables import TraceSet

FSDP2_PREFIX: Final = "FSDP::"
FSDP1_PREFIX: Final = "FullyShardedDataParallel."
FSDPVIZ_PREFIX: Final = "fsdpviz::"
FSDPVIZ_ENGINE_PREFIX: Final = "fsdpviz::engine_"
DDP_FORWARD: Final = "DistributedDataParallel.forward"

DDP_NOTE: Final = ("the model was wrapped in DistributedDataParallel, not FSDP: every rank holds the whole model "
                   "and all-reduces its gradients in buckets, so there are no FSDP units (launchers asked for "
                   "FSDP fall back to DDP without GPUs, e.g. the HF Trainer's fsdp=... or accelerate launch "
                   "--use_fsdp on CPU); whole-step numbers are still valid")


def _names(events: pd.DataFrame) -> list[str]:
    """The distinct event names present (categories no row uses are left out)."""
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        codes = names.cat.codes.to_numpy()
        used = np.bincount(codes[codes >= 0], minlength=len(names.cat.categories)) > 0
        return [str(n) for n, u in zip(names.cat.categories.tolist(), used) if u]
    return [str(n) for n in names.unique()]


def framework_evidence(events: pd.DataFrame) -> list[str]:
    """The event names :func:`decide_from_names` reads: one name per label family present, so that
    a rank's evidence is a handful of strings however many events it has."""
    found: dict[str, str] = {}
    for name in _names(events):
        for prefix in (FSDP2_PREFIX, FSDP1_PREFIX, FSDPVIZ_ENGINE_PREFIX, FSDPVIZ_PREFIX):
            if name.startswith(prefix):
                found.setdefault(prefix, name)
        if name == DDP_FORWARD:
            found[DDP_FORWARD] = name
    return list(found.values())


def decide_framework(traces: TraceSet) -> str:
    """``fsdp2`` / ``fsdp1`` / ``zero3`` / ``ddp`` / ``unknown`` (see the module docstring)."""
    return decide_from_names(_names(traces.events), traces.run.framework if traces.run is not None else None)


def decide_from_names(names: list[str], recorded: str | None) -> str:
    """The decision of :func:`decide_framework` from the event names present in any rank
    (:func:`framework_evidence` of each is enough) and run.json's framework (None without one)."""
    recorded = recorded or vocabulary.UNKNOWN
    if any(n.startswith(FSDP2_PREFIX) for n in names):
        return vocabulary.FSDP2
    if any(n.startswith(FSDP1_PREFIX) for n in names):
        return vocabulary.ZERO3 if recorded == vocabulary.ZERO3 else vocabulary.FSDP1
    if any(n.startswith(FSDPVIZ_ENGINE_PREFIX) for n in names):
        return vocabulary.ZERO3
    if recorded in vocabulary.FRAMEWORKS and recorded != vocabulary.DDP and any(n.startswith(FSDPVIZ_PREFIX) for n in names):
        return recorded
    if recorded == vocabulary.DDP or DDP_FORWARD in names:
        return vocabulary.DDP
    return vocabulary.UNKNOWN


def framework_notes(framework: str) -> list[Note]:
    """What the framework means for the numbers: DDP has no FSDP units."""
    return [Note(DDP, DDP_NOTE)] if framework == vocabulary.DDP else []


def unconnected_ranks_note(traces: TraceSet) -> Note | None:
    """A warning when a job of several ranks shows no collective in any trace: its processes trained
    alone (``accelerate launch`` without GPUs can start unconnected processes). Traces without a
    backward pass get a note that they hold no training instead."""
    world = traces.world_size
    counts = traces.ranks
    if world < 2 or not int(counts["n_events"].sum()) or int(counts["n_comm_events"].sum()):
        return None
    if "n_backward_events" in counts and not int(counts["n_backward_events"].sum()):
        # no backward pass either: the traces hold no training to communicate about (a trace of a
        # script's exit, of inference), which says nothing about how its processes were connected
        return Note(NO_TRAINING, "the traces hold no backward pass, so no training step: they cannot tell whether the "
                    "ranks communicated (a profiler started after the training ended, or a trace of inference)")
    return Note(UNCONNECTED_RANKS, f"no rank communicated: the traces hold no collective although the world size "
                f"is {world}, so the processes trained independently of each other, not as one distributed job; "
                "check how the launcher connected them (e.g. accelerate launch without GPUs and without --multi_cpu)")
