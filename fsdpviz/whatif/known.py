"""What a predicted peak can know: the categories the recording could not measure, and the
assumption a world-size change rests on.

``summary`` shows a memory category it cannot know as null, with why
(:attr:`fsdpviz.analysis.memory_split.Split.unknown`): on a plain torch.profiler trace on CPU the
level counts only what was allocated since the trace began, so the sharded parameters and an
optimizer state made before it are in no sample; on a GPU trace without the recorder's measurement
the optimizer state is somewhere in what was allocated before the trace. whatif shows the same
categories as null, for the recorded peak and the predicted one.

Most settings move only the units' own blocks, so an unknown sharded category does not matter to
them. A world-size change scales exactly the sharded categories (parameters, gradients, optimizer
state, by N / N'), so the predicted peak is only as good as they are:

- an optimizer state the recording did not measure, on a level that holds it (GPU: it is part of
  what was allocated before the trace), is assumed to be Adam's two states per sharded element
  (:data:`fsdpviz.analysis.memory.ASSUMED_OPTIMIZER_STATES`) and scaled; the predicted categories
  hold the assumed bytes, ``memory_assumed`` names them, and the prediction's ``assumed`` says so
  where the assumption moves the peak (the recorded peak's categories stay null, as summary's, and so
  do those of a setting that does not ask for a world size, which applies no assumption);
- a sharded category that is unknown and not assumed (a CPU level that never counted it, no units
  to size the shards by) leaves the predicted peak null, and a note says why: a peak predicted
  unchanged would be a guess presented as a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.memory import ASSUMED_OPTIMIZER_STATES
from fsdpviz.formatting import mib_text
from fsdpviz.replay.memory import MemoryChange, StepMemory
from fsdpviz.structure.records import NO_MEMORY

if TYPE_CHECKING:
    from fsdpviz.replay.model import Model


@dataclass(slots=True)
class PeakMemory:
    """A peak and what it holds, with the categories that cannot be known as None."""

    peak_bytes: int | None
    categories: dict[str, int | None] | None
    unknown: dict[str, str] = field(default_factory=dict)  # category -> why it is None
    assumed: list[str] = field(default_factory=list)  # what the predicted peak assumes (the headline)
    assumed_categories: dict[str, str] = field(default_factory=dict)  # category -> what its bytes assume
    notes: list[str] = field(default_factory=list)


def _known(categories: dict[str, int], unknown: dict[str, str]) -> dict[str, int | None]:
    return {c: None if c in unknown else v for c, v in categories.items()}


def recorded_peak(top: StepMemory | None) -> PeakMemory:
    """The recorded step with the highest peak (``top``), as ``summary`` shows its categories."""
    if top is None:
        return PeakMemory(None, None)
    return PeakMemory(top.peak_bytes, _known(top.peak_categories, top.unknown), dict(top.unknown))


def predicted_peak(change: MemoryChange | None, step: StepMemory | None, scale: float, world: str,
                   sized: bool = False) -> PeakMemory:
    """The predicted peak (``change``, of the recorded ``step`` it was predicted from) when the
    sharded categories scale by ``scale`` (recorded world / new world; ``world``: the change in
    words, ``8 -> 2``). Where they scale, or the world size was asked for (``sized``), an assumed
    category holds its assumed bytes, named in ``assumed_categories`` (and ``other`` its remainder,
    when only the assumed ones left it unknown); the rest of the unknown ones are None."""
    if change is None or step is None:
        return PeakMemory(None, None)
    unknown = dict(step.unknown)
    blind = [c for c in mcat.SHARDED if c in unknown and not step.assumed.get(c)]
    if scale != 1.0 and blind:
        titles = [mcat.TITLES[c] for c in blind]
        words = " and ".join([", ".join(titles[:-1]), titles[-1]] if len(titles) > 1 else titles)
        why = "; ".join(dict.fromkeys(unknown[c] for c in blind))
        note = (f"peak memory at world size {world}: not predicted: the {words}, which a world-size change "
                f"scales, cannot be known ({why})")
        return PeakMemory(None, _known(change.categories, unknown), unknown, notes=[note])
    # an assumption is applied only where the shards scale or their size is asked for; elsewhere the
    # categories stay as the recording's (null, with why): the recorded setting predicts the summary's
    applied = scale != 1.0 or sized
    resolved = {c: why for c, why in unknown.items() if step.assumed.get(c)} if applied else {}
    state = step.assumed.get(mcat.OPTIMIZER_STATE) if applied else None
    if state:
        resolved[mcat.OPTIMIZER_STATE] = (
            f"{resolved[mcat.OPTIMIZER_STATE]}: assumed {ASSUMED_OPTIMIZER_STATES} states per sharded parameter "
            f"element (Adam), {mib_text(state)} on rank {step.rank} at world size {world.split(' ')[0]}")
        if mcat.OTHER in unknown and all(c in resolved for c in unknown if c != mcat.OTHER):
            resolved[mcat.OTHER] = "what was allocated before the trace, less the assumed optimizer state"
    unknown = {c: why for c, why in unknown.items() if c not in resolved}
    assumed = []
    if state and scale != 1.0:  # the assumption moves the peak: said in the headline
        assumed.append(f"the optimizer state, which the recording did not measure: {ASSUMED_OPTIMIZER_STATES} "
                       f"states per sharded parameter element (Adam), {mib_text(state)} on rank {step.rank} at "
                       f"world size {world.split(' ')[0]}, scaled with the shards in the predicted peak")
    return PeakMemory(change.peak_bytes, _known(change.categories, unknown), unknown, assumed=assumed,
                      assumed_categories=resolved)


def peak_unknown_note(summary_notes: Sequence[str], summary_peak: int | None, ranks: list[int]) -> str:
    """Why whatif's recorded peak is null: the summary's ``no_memory`` note where the run has no peak
    (run.json's ``--no-memory``, or traces without memory samples), else that the ranks the model reads
    (``ranks``) hold no samples in the steps it reads while others do."""
    said = next((n for n in summary_notes if getattr(n, "code", None) == NO_MEMORY), None)
    if said is not None:
        return str(said)
    if summary_peak is None:
        return "the peak memory is null: the analysed steps hold no memory samples"
    return (f"peak memory unknown: the model's rank(s) ({', '.join(map(str, ranks))}) hold no memory samples in "
            f"the steps it reads, though the summary's peak "
            f"({mib_text(summary_peak)}) holds other ranks' samples")


def model_peak_note(model: Model) -> str:
    """:func:`peak_unknown_note` of a model: its summary's notes and peak, and the ranks it reads."""
    summary = model.result.summary
    return peak_unknown_note(summary.notes, summary.memory.peak_allocated_bytes,
                             sorted({s.rank for s in model.recording.steps}))
