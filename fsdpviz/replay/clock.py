"""One clock per run: which timeline its figures and predictions read, said once (``summary --json`` ``clock``).

A recording holds two clocks: the trace, which the profiler slowed, and the recorder's timers on the
unprofiled steps. Where the model can replay the recording without the profiler (:mod:`.calibration`
on CPU, :mod:`.hostcost` on GPU), the run is ``replayed``: its step is the timers' clean step, which
the replay reproduces within ``replay_error_pct`` (:data:`RELIABLE_REPLAY_PCT`), and, where the timers
time the phases of unprofiled steps, the replay took the profiler's share out of each phase within
:data:`PHASE_LIMIT_PCT` of where the timers saw it leave (``phase_error_pct``, out of sample); every
prediction moves that step by the share the same replay moves it under the setting. A CPU replay is
scaled onto the clean steps (one factor per rank), so its miss of them is no check: without its phases
checked it is not called ``replayed``. A GPU replay is not scaled: the profiler's share is taken out of
the host's events, and how much of it the step loses is the simulation's (the device may not wait for
the host), so its miss of the clean steps is a check of its own. Elsewhere it is ``traced``, and the
note says why.

:func:`fsdpviz.whatif.gains.completed_summary` is the summary every view shows, with this clock.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from fsdpviz.analysis.summary import CALIBRATION_FACTOR, CALIBRATION_HOST_COST, ClockSummary

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult
    from fsdpviz.replay.calibration import Calibration
    from fsdpviz.replay.phases import PhaseCheck

BASIS_REPLAYED: Final = "replayed"
BASIS_TRACED: Final = "traced"
# A replay that misses the run by more than this explains too little of it for its predictions to be
# read as figures: marked unreliable, said before any figure, and never ranked by the advisor.
RELIABLE_REPLAY_PCT: Final = 10.0
# Out of sample (:mod:`.phases`): a replay whose de-profiler took the profiler's share out of some phase
# more than this far (in % of the unprofiled step) from where the timers saw it leave is not called
# ``replayed``: said before any figure, its predictions marked unreliable and never ranked. The largest
# miss of any recording whose predictions were held to bare runs is 24.9 % (H200 B, the backward; root,
# pairs and no resharding within 0.048 of bare: docs/whatif.md, "Out of sample"); past it, nothing
# measured says that the replay's ratios still hold.
PHASE_LIMIT_PCT: Final = 25.0


@dataclass(slots=True)
class Replayed:
    """What a model read of a recording replays without the profiler (``replay.model.model_clock``)."""

    net_replays_ms: list[float] | None
    """The replayed steps without the profiler (None: the model has no such replay)."""
    calibration: Calibration | None
    """CPU: how that replay was put on the timers' clean steps."""
    ranks: list[int] | None
    """The ranks read, where not every rank of the world was (too many to read, or some untraced)."""
    phases: PhaseCheck | None = None
    """Out of sample: where that replay took the profiler's share out, phase by phase, against the
    timers (:mod:`.phases`); None where it cannot be checked (``phases_why``)."""
    phases_why: str = ""
    """Why the phases are not checked ("" where they are)."""


def clock_of(run: RunResult, replayed: Replayed | None, why_not: str = "") -> ClockSummary:
    """The clock of ``run`` as its model replays it (``replayed``; None: no model, ``why_not``)."""
    summary = run.summary
    cost = summary.profiler
    # the one profiler share (``bound.profiler_share_ms`` reads the same ``share_ms``)
    share = cost.share_ms if cost is not None else None
    share = None if share is None else round(share, 3)
    step_from = ("the step time is the timers' clean unprofiled steps" if summary.step_time_source == "timers"
                 else "the step time is the traced steps'")
    if replayed is None or replayed.net_replays_ms is None or cost is None or not cost.headline:
        if replayed is None:
            why = why_not
        elif cost is None or not cost.headline:
            why = (cost.note if cost is not None else None) or "no timed unprofiled steps to put the replay on"
        else:
            why = ("the profiler's cost per host event is not measured: its excess is under the timers' noise "
                   "or most of the traced step")
        return ClockSummary(basis=BASIS_TRACED, profiler_share_ms=share, ranks=None if replayed is None else replayed.ranks,
                            note=f"traced: {why}; {step_from}, the other figures and predictions are as traced")
    calibrated = replayed.calibration
    on_clean = False  # ... and whose replay runs them as timed (its miss says 0.0 %)
    put = ""  # what it is put on, there
    calibration: Literal["factor", "host_cost"]  # FACTOR: a CPU replay put on the clean steps by one factor per rank
    if calibrated is not None and calibrated.scale and calibrated.error_pct is not None:
        calibration = CALIBRATION_FACTOR
        error, clean = round(float(calibrated.error_pct), 2), calibrated.clean_steps
        scale = float(statistics.median(calibrated.scale.values()))
        how = (f"the traced step's work and waits scaled {scale:.2f}x (median over ranks: each rank's clean step over "
               f"its traced one, as the bound's figures)")
        # The replay runs each traced CPU step as traced, so the factor puts it on the clean step: said as
        # that, not as a match of two equal numbers; a replay that does not reproduce its steps is a miss.
        on_clean = on_clean_step(error, calibration)
        put = f"the timers' clean step, {calibrated.target_ms:.3f} ms"
        if not on_clean:
            how += f"; the replay runs {calibrated.replay_ms:.3f} ms against {calibrated.target_ms:.3f} ms timed"
    else:
        calibration = CALIBRATION_HOST_COST
        ms = float(statistics.median(replayed.net_replays_ms))
        error = net_error_pct(replayed.net_replays_ms, cost.unprofiled_step_ms)
        clean = cost.fewest_unprofiled_steps
        how = (f"the profiler's measured excess taken out of every traced host event ({ms:.3f} ms replayed, "
               f"{cost.unprofiled_step_ms:.3f} ms timed)")
    error = round(float(error), 2)
    checked = _phases(replayed.phases)
    paced = cost.replay_adds_time  # the replay put time into the traced steps, not a share out of them
    phases_said = phase_words(replayed, paced)
    phase_error = checked["phase_error_pct"]
    why_unreliable = unreliable(error, phase_error)
    why = ""
    if why_unreliable == PHASES_MISSED:
        on_step = (f" is put on {put}, by that factor, but out of sample" if on_clean
                   else f" runs the timers' clean step within {error:.1f} %, but out of sample")
        took = (f"the time it added to the phases was up to {phase_error:.1f} % of the step away from what the "
                f"timers saw them gain" if paced
                else f"it took the profiler's share out of the phases up to {phase_error:.1f} % of the step away "
                     f"from where the timers saw it leave")
        why = (f"the replay without the profiler ({how}){on_step} {took} "
               f"(more than {PHASE_LIMIT_PCT:g} %); {step_from}, the bound splits "
               f"it, and predictions on that replay are marked unreliable and not ranked; {phases_said}")
    elif why_unreliable == STEP_MISSED:
        why = (f"the replay without the profiler ({how}) misses the timers' clean step by {error:.1f} % (more than "
               f"{RELIABLE_REPLAY_PCT:g} %); {step_from}, the bound splits it, and predictions on that replay are "
               f"marked unreliable and not ranked; {phases_said}")
    elif calibration == CALIBRATION_FACTOR and replayed.phases is None:
        # one factor per rank puts the replay on the clean steps by construction: its miss of them checks
        # nothing, and with no phase timed there is nothing else it was not scaled to
        scaled_to = (f" is put on {put}, by that factor, and nothing it was" if on_clean
                     else " is scaled onto the timers' clean steps, and nothing it was")
        why = (f"the replay without the profiler ({how}){scaled_to} not scaled to checks it: {phases_said}; "
               f"{step_from}, the bound splits it, and predictions move it by the replay's shares, unchecked")
    if why:
        return ClockSummary(basis=BASIS_TRACED, profiler_share_ms=share, replay_error_pct=error, clean_steps=clean,
                            ranks=replayed.ranks, **checked, calibration=calibration, note=f"traced: {why}")
    return ClockSummary(basis=BASIS_REPLAYED, profiler_share_ms=share, replay_error_pct=error,
                        clean_steps=clean, ranks=replayed.ranks, **checked, calibration=calibration,
                        note=(f"replayed without the profiler: {how}{f', which puts the replay on {put}' if on_clean else ''}"
                              f", on {clean} clean step(s) per rank; "
                              f"{phases_said}"))


def on_clean_step(error_pct: float, calibration: str | None) -> bool:
    """Whether a replay is put on the timers' clean steps by its factor: a CPU replay
    (:data:`CALIBRATION_FACTOR`) whose miss of them reads 0.0 % as printed, which the clock and whatif's
    replay line say as that, not as a 0.0 % match. A GPU replay (:data:`CALIBRATION_HOST_COST`) is never
    put on them: a miss that small is its own, a match."""
    return calibration == CALIBRATION_FACTOR and f"{error_pct:.1f}" == "0.0"


STEP_MISSED: Final = "step"
PHASES_MISSED: Final = "phases"


def net_error_pct(net_replays_ms: list[float], clean_ms: float) -> float:
    """A GPU replay without the profiler's miss of the timers' clean step: its steps' median against it,
    in % (rounded as the clock gives it)."""
    return round(100.0 * abs(float(statistics.median(net_replays_ms)) - clean_ms) / clean_ms, 2)


def unreliable(error_pct: float, phase_error_pct: float | None) -> str:
    """Why a replay without the profiler is not the run's clock: :data:`STEP_MISSED` (it misses the clean
    step by more than :data:`RELIABLE_REPLAY_PCT`), :data:`PHASES_MISSED` (out of sample, a phase by more
    than :data:`PHASE_LIMIT_PCT`), or "" where it is. What the clock and the bound's split
    (:mod:`.split`) both decide by."""
    if error_pct > RELIABLE_REPLAY_PCT:
        return STEP_MISSED
    if phase_error_pct is not None and round(phase_error_pct, 2) > PHASE_LIMIT_PCT:
        return PHASES_MISSED
    return ""


def _phases(check: PhaseCheck | None) -> dict[str, Any]:
    """The clock's out-of-sample fields of ``check`` (all None without one)."""
    if check is None:
        return {"phase_error_pct": None, "phase_miss_pct": None, "phase_steps": None}
    return {"phase_error_pct": round(check.error_pct, 2), "phase_miss_pct": dict(check.miss_pct),
            "phase_steps": check.steps}


def phase_words(replayed: Replayed, paced: bool = False) -> str:
    """The out-of-sample check in words, as the clock's note says it. ``paced``: the profiled steps ran
    faster than the clean ones (``ProfilerCost.replay_adds_time``), so the replay put time into the phases rather
    than taking a profiler's share out of them, and the words say so."""
    check = replayed.phases
    if check is None:
        return f"its phases are not checked out of sample ({replayed.phases_why})"
    parts = ", ".join(f"{phase} {miss:+.1f} %" for phase, miss in check.miss_pct.items())
    unchecked = f"; {check.unchecked}" if check.unchecked else ""
    # the same figures (phases.py: the replay's drop less the timers'), read the way round the words go
    moved = ("what the timers saw each phase gain less the time it added to it (the clean steps ran slower than "
             "the profiled ones, so it added time) is" if paced
             else "the profiler's share it took out of each phase misses the timers' by")
    return (f"out of sample, {moved} up to "
            f"{check.error_pct:.1f} % of the step ({parts}; {check.steps} unprofiled step(s) timed their phases"
            f"{unchecked})")
