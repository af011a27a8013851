"""Out of sample: where the replay took the profiler's share out, phase by phase, against the timers.

The replay without the profiler (:mod:`.calibration` on CPU, :mod:`.hostcost` on GPU) is put on the
run's clock by the clean steps' length alone. On CPU it scales with the one factor, so its miss of the
clean step (``clock.replay_error_pct``) is its miss of the traced steps, whatever the clean steps were.
What the clean steps can check that the trace cannot is *where* the profiler's share sat: the
recorder's timers time the step's phases (the root module's forward, autograd's backward, the
optimizer's step) in the profiled steps and, where it ran them, in unprofiled ones
(:func:`fsdpviz.structure.profiler_cost.phase_times`).

Per rank and phase, the profiler's cost the replay takes out (the traced replay's phase less the
replay's without the profiler) against the cost the timers saw leave it (the profiled steps' phase
less the unprofiled ones'), on the same profiled steps: a replayed step whose phases the timers did
not time (a first step timed only at its ends) is left out. Both sides bound a phase alike (:func:`sim_phases`: from its first span to
its last, as the timers run from hook to hook), but for the optimizer's end: the replay's optimizer
starts at the optimizer's own step, as the timers' hook does (on CPU, where the trace holds it), and
runs to the step's end, where the timers' stops at the optimizer's step (DeepSpeed: ``engine.step``)
returning; the recorder's and the profiler's end-of-step work between is the replay's alone (0.6 ms of
the ZeRO-3 sample's profiled steps, 0.06 ms of the committed ZeRO-3 example's). Each side leaves out
the time between its phases (the data, the loss, the gradients zeroed), where the profiler's share may
differ: the three misses need not add up to zero. The miss is in % of the rank's unprofiled step;
the run's is the median over ranks, and its error the largest phase's. Nothing in the replay was
fitted to a phase. A step of several micro-batches (gradient accumulation) runs a forward and a
backward per micro-batch; the timers add each phase's intervals up, and so does the replay's side. A
recorder older than the backward's timer timed the forward and the optimizer alone (the shared H100
FSDP2 recordings): those two are checked, and the backward with the time between phases misses by their
misses negated, give or take both replays' misses of their steps (the traced replay's of the profiled
steps, the clean one's of the clean steps), which no phase isolates.

On the bundled FSDP2 sample one factor per rank takes 7.7 % of the step more out of the backward than
the timers saw leave it; on the H200 recording of model B with memory recorded, the per-event cost
takes about a quarter of the step out of a backward the profiler did not slow (docs/whatif.md, "One
clock"), and that recording's predictions of three settings are still within 0.048 of bare runs. So
the check is said beside the clock (its note, whatif's replay line) and decides it only past
:data:`.clock.PHASE_LIMIT_PCT`: a phase missed says where the de-profiler erred, not that a setting's
ratio is off. With two ranks and a few steps it also holds the timers' noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from fsdpviz.replay.recorded import StepProgram
from fsdpviz.replay.simulate import SimResult, SimSpan
from fsdpviz.structure.profiler_cost import STEP_PHASES, STEP_TIMER_PHASE, PhaseTimes
from fsdpviz.vocabulary import BACKWARD, FORWARD, OPTIMIZER, UNIT_COLLECTIVES

# Why the check is not made (the clock's note says it). The recorder times every CPU step's phases; a
# GPU's clean steps time only their ends (one CUDA event pair), as did a CPU's in a recording made before.
# Its unit-timed steps time phases but also its units, a cost the clean steps the replay is put on do not
# pay: they would count the unit timers as the profiler's.
NOT_TIMED: Final = ("no clean step timed its phases: a GPU run's clean steps time only their ends, one CUDA event "
                    "pair, as do those of a folder recorded before fsdpviz timed a CPU clean step's phases, and "
                    "its unit-timed steps also pay for the unit timers, which the clean steps do not")
NOT_REPLAYED: Final = ("no rank that timed its phases is replayed without the profiler: a rank without a clean "
                       "step of its own is replayed as traced")
NOT_THE_STEPS: Final = "the profiled steps whose phases the timers timed are not among the steps replayed"
# Where the backward is not checked (PhaseCheck.unchecked): with the time between phases it misses by the
# other two phases' misses negated, give or take both replays' misses of their steps (traced and clean)
_REST: Final = ("it and the time between phases miss together by the other two's misses negated, give or take both "
                "replays' misses of their steps")
NO_BACKWARD_TIMER: Final = f"the backward is not checked: its recorder timed none; {_REST}"
NOT_EVERY_BACKWARD: Final = f"the backward is not checked: not every rank checked timed it; {_REST}"
MICRO_BATCHES: Final = ("its steps run several micro-batches (gradient accumulation), whose forwards and backwards "
                        "do not fall one after the other in its replay")


@dataclass(slots=True)
class PhaseCheck:
    """The out-of-sample check of a replay without the profiler (``clock.phase_miss_pct``)."""

    miss_pct: dict[str, float]
    """Per phase the timers timed: the profiler's cost the replay took out less the cost the timers saw,
    in % of the unprofiled step (median over ranks). A recorder older than the backward's timer timed the
    forward and the optimizer alone (the shared H100 FSDP2 recordings)."""
    steps: int
    """The fewest unprofiled steps that timed their phases, over the ranks checked."""
    unchecked: str = ""
    """Which of :data:`STEP_PHASES` is not checked, and why ("" where none)."""

    @property
    def error_pct(self) -> float:
        """The largest phase's miss, in % of the unprofiled step."""
        return max(abs(v) for v in self.miss_pct.values())


def sim_phases(sim: SimResult, lead_ns: float = 0.0, micro: int = 1) -> dict[str, float] | None:
    """A replayed step's phases (ns), bounded as the timers bound theirs: forward from its first forward
    span to its last, backward likewise, the optimizer its optimizer spans (the step's last segment: the
    host's work on CPU, its kernels on GPU) less ``lead_ns``, the segment's time before the optimizer's
    own step, where the timers' optimizer phase starts (CPU: :attr:`.recorded.Segment.lead_ns`), or,
    where the replay has none, the rest of the step after the backward.

    A step of ``micro`` micro-batches (gradient accumulation) runs that many forwards and backwards, one
    after the other, and the timers add each phase's intervals up: so does this, each micro-batch's
    forward (backward) from its first span to its last, the spans taken in the order they start. None
    where the replay's spans do not fall into ``micro`` forwards and backwards that way."""
    extents = _extents(sim.spans, micro)
    if extents is None:
        return None
    forward, backward = extents[FORWARD], extents[BACKWARD]
    # the optimizer's segment: its work and the collectives it waited for (CPU)
    spans = [s.end - s.start for s in sim.spans
             if s.kind == OPTIMIZER or (s.phase == OPTIMIZER and s.kind in UNIT_COLLECTIVES)]
    last = max((end for _, end in backward or forward), default=0.0)
    optimizer = max(0.0, (sum(spans) if spans else sim.step_ns - last) - lead_ns)
    return {"forward": sum(end - start for start, end in forward),
            "backward": sum(end - start for start, end in backward), "optimizer": optimizer}


def _extents(spans: Sequence[SimSpan], micro: int) -> dict[str, list[tuple[float, float]]] | None:
    """Per phase (forward, backward), each micro-batch's (first start, last end) of its spans: with one
    micro-batch all of them (none: an empty list); with several, the runs of one phase among the forward
    and backward spans in the order they start, which must be ``micro`` runs of each (else None), each
    ending where the next run begins at the latest (a collective running on past it: the timers' phases
    do not overlap)."""
    if micro <= 1:
        out: dict[str, list[tuple[float, float]]] = {}
        for phase in (FORWARD, BACKWARD):
            of = [s for s in spans if s.phase == phase]
            out[phase] = [(min(s.start for s in of), max(s.end for s in of))] if of else []
        return out
    runs: list[tuple[str, list[SimSpan]]] = []
    for span in sorted((s for s in spans if s.phase in (FORWARD, BACKWARD)), key=lambda s: s.start):
        if not runs or runs[-1][0] != span.phase:
            runs.append((span.phase, []))
        runs[-1][1].append(span)
    bounds = [(phase, min(s.start for s in run), max(s.end for s in run)) for phase, run in runs]
    out = {FORWARD: [], BACKWARD: []}
    for i, (phase, start, end) in enumerate(bounds):
        out[phase].append((start, min(end, bounds[i + 1][1]) if i + 1 < len(bounds) else end))
    return out if all(len(of) == micro for of in out.values()) else None


def per_rank_phases(steps: Sequence[StepProgram], sims: Sequence[SimResult]) -> dict[int, dict[str, float]] | None:
    """Per rank: the median over its replayed steps of each phase (:func:`sim_phases`) and of the step
    (``step``), ms; None where a step's micro-batches do not separate in its replay."""
    by_rank: dict[int, list[dict[str, float]]] = {}
    for step, sim in zip(steps, sims):
        phases = sim_phases(sim, step.post.lead_ns, len(step.micro))
        if phases is None:
            return None
        by_rank.setdefault(step.rank, []).append({**phases, STEP_TIMER_PHASE: sim.step_ns})
    return {rank: {p: statistics.median(s[p] for s in of) / 1e6 for p in (*STEP_PHASES, STEP_TIMER_PHASE)}
            for rank, of in by_rank.items()}


def phase_check(steps: Sequence[StepProgram], traced: Sequence[SimResult], net: Sequence[StepProgram],
                clean: Sequence[SimResult], timed: dict[int, PhaseTimes],
                ranks: set[int] | None = None) -> tuple[PhaseCheck | None, str]:
    """The check (module docstring) of the replay of ``steps`` (``traced``) against its replay without
    the profiler (``net``'s, ``clean``), on the ranks ``timed`` holds (and of ``ranks``, where given: a
    CPU rank without a factor is replayed as traced), on the phases every one of them timed, and "" --
    or None and why it is not made."""
    if not timed:
        return None, NOT_TIMED
    # the ranks that timed their phases (and have a factor, where given), read alone: another rank's steps
    # do not decide whether these are checked
    wanted = set(timed) & (ranks if ranks is not None else set(timed))

    def read(programs: Sequence[StepProgram], sims: Sequence[SimResult]) -> dict[int, dict[str, float]] | None:
        # the steps the timers' profiled side is read from, where it says which: a replayed step whose
        # phases the timers did not time (a first step timed only at its ends) is no part of the check
        pairs = [(p, r) for p, r in zip(programs, sims) if p.rank in wanted
                 and (not timed[p.rank].profiled_steps or p.step in timed[p.rank].profiled_steps)]
        return per_rank_phases([p for p, _ in pairs], [r for _, r in pairs])

    before, after = read(steps, traced), read(net, clean)
    if before is None or after is None:
        return None, MICRO_BATCHES
    checked = sorted(set(before) & set(after))
    if not checked:
        replayed = {p.rank for p in steps if p.rank in wanted} & {p.rank for p in net if p.rank in wanted}
        return None, NOT_THE_STEPS if replayed else NOT_REPLAYED
    miss: dict[str, float] = {}
    for phase in (p for p in STEP_PHASES if all(p in timed[r].unprofiled for r in checked)):
        miss[phase] = round(float(statistics.median(
            100.0 * ((before[r][phase] - after[r][phase])
                     - (timed[r].profiled[phase] - timed[r].unprofiled[phase])) / timed[r].unprofiled[STEP_TIMER_PHASE]
            for r in checked)), 2)
    unchecked = ""
    if BACKWARD not in miss:
        some = any(BACKWARD in timed[r].unprofiled for r in checked)
        unchecked = NOT_EVERY_BACKWARD if some else NO_BACKWARD_TIMER
    return PhaseCheck(miss_pct=miss, steps=min(timed[r].steps for r in checked), unchecked=unchecked), ""
