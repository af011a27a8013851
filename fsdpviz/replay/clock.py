"""One clock per run: which timeline its figures and predictions read, said once (``summary --json`` ``clock``).

A recording holds two clocks: the trace, which the profiler slowed, and the recorder's timers on the
unprofiled steps. Where the model can replay the recording without the profiler (:mod:`.calibration`
on CPU, :mod:`.hostcost` on GPU), the run is ``replayed``: its step is the timers' clean step, which
the replay reproduces within ``replay_error_pct``, and every prediction moves that step by the share
the same replay moves it under the setting. Elsewhere it is ``traced``, and the note says why.

:func:`fsdpviz.whatif.gains.completed_summary` is the summary every view shows, with this clock.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from fsdpviz.analysis.summary import ClockSummary

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult
    from fsdpviz.replay.calibration import Calibration

BASIS_REPLAYED: Final = "replayed"
BASIS_TRACED: Final = "traced"
# A replay that misses the run by more than this explains too little of it for its predictions to be
# read as figures: marked unreliable, said before any figure, and never ranked by the advisor.
RELIABLE_REPLAY_PCT: Final = 10.0


@dataclass(slots=True)
class Replayed:
    """What a model read of a recording replays without the profiler (``replay.model.model_clock``)."""

    net_replays_ms: list[float] | None
    """The replayed steps without the profiler (None: the model has no such replay)."""
    calibration: Calibration | None
    """CPU: how that replay was put on the timers' clean steps."""
    ranks: list[int] | None
    """The ranks read, where not every rank was."""


def clock_of(run: RunResult, replayed: Replayed | None, why_not: str = "") -> ClockSummary:
    """The clock of ``run`` as its model replays it (``replayed``; None: no model, ``why_not``)."""
    summary = run.summary
    cost = summary.profiler
    # the one profiler share: the traced step less the headline's (``bound.profiler_share_ms``)
    share = round(cost.extra_ms, 3) if cost is not None else None
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
    if calibrated is not None and calibrated.scale and calibrated.error_pct is not None:
        error, clean = calibrated.error_pct, calibrated.clean_steps
        scale = float(statistics.median(calibrated.scale.values()))
        how = (f"the traced step's work and waits scaled {scale:.2f}x (median over ranks: each rank's clean step over "
               f"its traced one, as the bound's figures); the replay runs {calibrated.replay_ms:.3f} ms against "
               f"{calibrated.target_ms:.3f} ms timed")
    else:
        ms = float(statistics.median(replayed.net_replays_ms))
        error = 100.0 * abs(ms - cost.unprofiled_step_ms) / cost.unprofiled_step_ms
        clean = cost.fewest_unprofiled_steps
        how = (f"the profiler's measured excess taken out of every traced host event ({ms:.3f} ms replayed, "
               f"{cost.unprofiled_step_ms:.3f} ms timed)")
    error = round(float(error), 2)
    if error > RELIABLE_REPLAY_PCT:
        return ClockSummary(
            basis=BASIS_TRACED, profiler_share_ms=share, replay_error_pct=error, clean_steps=clean,
            ranks=replayed.ranks,
            note=(f"traced: the replay without the profiler ({how}) misses the timers' clean step by {error:.1f} % "
                  f"(more than {RELIABLE_REPLAY_PCT:g} %); {step_from}, the bound splits it, and predictions on that "
                  "replay are marked unreliable and not ranked"))
    return ClockSummary(basis=BASIS_REPLAYED, profiler_share_ms=share, replay_error_pct=error,
                        clean_steps=clean, ranks=replayed.ranks,
                        note=f"replayed without the profiler: {how}, on {clean} clean step(s) per rank")
