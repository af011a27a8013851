"""Settings that can only add memory, and the floor they put under a predicted peak.

Some changes hold more at once and free nothing earlier, whatever the run: gathering earlier (a
deeper prefetch than recorded), gathering and reducing more at once (coarser units: ``merge:K``,
``root``, ``match:``; a merged unit holds its members' parameters together and one reduce-scatter
input for all of them, its members' unsharded gradients until it is filled) and sharding over fewer
ranks. Under such a setting the peak cannot be lower than the recorded one. The memory model moves
recorded blocks to where the setting would make and free them, and the floor is a guard on it:
where the model's level stays below the recorded peak, the recorded peak is the prediction and a note
says so. ``tests/unit/test_whatif_floor.py`` runs whatif's settings over the suite's recordings and
holds that the guard never fires.

Keeping parameters gathered from forward to backward (``--reshard-after-forward false``, the last
units kept) is not such a change: it gathers nothing in backward, so the backward all-gather's output
and copy-in buffers are never made. Where the recorded peak sits on a backward gather -- on CPU, where
the gathered parameters, the all-gather output and its copy-in are each a unit's size -- the kept
parameters hold less than the gather did (measured on the suite's CPU recordings: one unit's
all-gather output and copy-in against its kept parameters). A setting with any change that can lower
memory (no prefetch, fewer units kept, more ranks, parameters kept) has no floor.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from fsdpviz.replay.memory import MemoryChange, StepMemory
from fsdpviz.replay.recorded import Recording
from fsdpviz.replay.settings import GIVEN, Settings
from fsdpviz.vocabulary import ZERO3

# How the note of a raised prediction begins (:func:`floored`).
FLOOR_NOTE: Final = "peak memory: the model's level under this setting stayed below the recorded peak"


def only_adds(settings: Settings, rec: Recording) -> list[str]:
    """The given changes of ``settings`` (filled in) when every one of them can only add memory
    (each in words); empty when none is given or one of them could lower it."""
    given = {k for k, v in settings.sources.items() if v == GIVEN} - {"gpus_per_node", "inter_node_gbps"}
    why: list[str] = []
    for key in sorted(given):
        if key == "wrap" and settings.wrap.kind != "recorded":
            why.append(f"wrap {settings.wrap} gathers and reduces recorded units together")
        elif key == "prefetch" and rec.framework == ZERO3:
            # ZeRO-3's prefetch is a bucket of elements, and a gather's buffer lives until its last
            # parameter is waited for (replay/zero3_fetch.py): where the buckets' boundaries fall, not
            # their size, decides what is alive, so a larger bucket can hold less at an instant
            return []
        elif key == "prefetch" and _deeper(settings.prefetch, rec.prefetch):
            why.append(f"prefetch {settings.prefetch} gathers no later than the recorded {rec.prefetch}")
        elif key == "world_size" and 0 < settings.world_size < rec.world_size:
            why.append(f"world size {settings.world_size} holds larger shards than {rec.world_size}")
        elif key == "world_size" and settings.world_size == rec.world_size:
            continue
        else:
            return []
    return why


def _deeper(new: str, recorded: str) -> bool:
    """An explicit prefetch at least as deep as the recorded one (FSDP2's implicit prefetch gathers
    one unit ahead in backward and none in forward)."""
    if not new.isdigit():
        return False
    return int(new) >= (int(recorded) if recorded.isdigit() else 1)


def floored(memory: list[MemoryChange | None], steps: list[StepMemory | None],
            reasons: list[str]) -> tuple[list[MemoryChange | None], str | None]:
    """``memory`` (per step, the model's answer) with each step's peak at least its recorded one when
    ``reasons`` says the setting can only add memory, and the note that says where it was raised."""
    if not reasons:
        return memory, None
    out: list[MemoryChange | None] = []
    raised = 0
    for change, recorded in zip(memory, steps, strict=True):
        if change is None or recorded is None or change.peak_bytes >= recorded.peak_bytes:
            out.append(change)
            continue
        raised += 1
        out.append(replace(change, peak_bytes=recorded.peak_bytes, categories=recorded.peak_categories))
    if not raised:
        return out, None
    return out, (f"{FLOOR_NOTE} on {raised} "
                 f"of {len(steps)} step(s), which the setting cannot give ({'; '.join(reasons)}): "
                 "the recorded peak is predicted there")
