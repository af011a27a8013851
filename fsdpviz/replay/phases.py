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
less the unprofiled ones'). Each side reads the phase by its own definition -- the replay's forward
runs from the step's start to its last forward span, its backward to its last backward span, its
optimizer the rest; the timers' from hook to hook -- and the definitions cancel in each difference.
The miss is in % of the rank's unprofiled step; the run's is the median over ranks, and its error the
largest phase's. Nothing in the replay was fitted to a phase.

On the bundled samples one factor per rank puts up to 9 % of a step in the wrong phase; on the H200
recording of model B with memory recorded, the per-event cost takes a quarter of the step out of a
backward the profiler did not slow (docs/whatif.md, "One clock"), and that recording's predictions of
three settings are still within 0.05 of bare runs. So the check is said beside the clock (its note, whatif's replay
line) and does not decide it: a phase missed says where the de-profiler erred, not that a setting's
ratio is off.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from fsdpviz.replay.recorded import StepProgram
from fsdpviz.replay.simulate import SimResult
from fsdpviz.structure.profiler_cost import STEP_PHASES, STEP_TIMER_PHASE, PhaseTimes
from fsdpviz.vocabulary import BACKWARD, FORWARD

# Why the check is not made on a recording whose timers timed no unprofiled step's phases: with the
# recorder's defaults the one unit-timed step follows the trace export (not a clean step) and the other
# unprofiled steps time only their ends.
NOT_TIMED: Final = "no unprofiled step timed its phases: record with --unit-timer-steps 2 or more"


@dataclass(slots=True)
class PhaseCheck:
    """The out-of-sample check of a replay without the profiler (``clock.phase_miss_pct``)."""

    miss_pct: dict[str, float]
    """Per phase: the profiler's cost the replay took out less the cost the timers saw, in % of the
    unprofiled step (median over ranks)."""
    steps: int
    """The fewest unprofiled steps that timed their phases, over the ranks checked."""

    @property
    def error_pct(self) -> float:
        """The largest phase's miss, in % of the unprofiled step."""
        return max(abs(v) for v in self.miss_pct.values())


def sim_phases(sim: SimResult) -> dict[str, float]:
    """A replayed step's phases (ns): forward to the end of its last forward span, backward to the end
    of its last backward span, the optimizer the rest of the step."""
    forward = max((s.end for s in sim.spans if s.phase == FORWARD), default=0.0)
    backward = max((s.end for s in sim.spans if s.phase == BACKWARD), default=forward)
    return {"forward": forward, "backward": backward - forward, "optimizer": sim.step_ns - backward}


def _per_rank(steps: Sequence[StepProgram], sims: Sequence[SimResult]) -> dict[int, dict[str, float]]:
    """Per rank: the median over its replayed steps of each phase, ms."""
    by_rank: dict[int, list[dict[str, float]]] = {}
    for step, sim in zip(steps, sims):
        by_rank.setdefault(step.rank, []).append(sim_phases(sim))
    return {rank: {p: statistics.median(s[p] for s in of) / 1e6 for p in STEP_PHASES} for rank, of in by_rank.items()}


def phase_check(steps: Sequence[StepProgram], traced: Sequence[SimResult], net: Sequence[StepProgram],
                clean: Sequence[SimResult], timed: dict[int, PhaseTimes]) -> PhaseCheck | None:
    """The check (module docstring) of the replay of ``steps`` (``traced``) against its replay without
    the profiler (``net``'s, ``clean``), on the ranks ``timed`` holds; None where none is."""
    before, after = _per_rank(steps, traced), _per_rank(net, clean)
    ranks = sorted(set(before) & set(after) & set(timed))
    if not ranks:
        return None
    miss: dict[str, float] = {}
    for phase in STEP_PHASES:
        miss[phase] = round(float(statistics.median(
            100.0 * ((before[r][phase] - after[r][phase])
                     - (timed[r].profiled[phase] - timed[r].unprofiled[phase])) / timed[r].unprofiled[STEP_TIMER_PHASE]
            for r in ranks)), 2)
    return PhaseCheck(miss_pct=miss, steps=min(timed[r].steps for r in ranks))
