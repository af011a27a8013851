"""The recording without the profiler, on CPU: every traced duration scaled by the one de-profiler's factor.

On a CPU rank the training thread is the device: every op, hook and copy is host work, and the
profiler slows all of it (1.0-1.4x with ``--no-memory``, 1.3-1.8x with ``--stack`` on the example
trainer); gloo's collectives, which the training thread waits out, then wait for a slowed peer as well. The recorder's timers time the same
rank's steps without the profiler (:func:`fsdpviz.structure.profiler_cost.clean_step_ms`, its clean
unprofiled steps).

Per rank, one factor ``k`` scales every duration of its traced steps (the programs of
:mod:`.recording`: the host's work between, before, in and after each pass, the gathers' and
reductions' host work and collectives, the segments before, between and after the passes). ``k`` is
the de-profiler's (:mod:`fsdpviz.structure.deprofile`): the rank's clean step over its traced step,
both measured, the factor the bound and the overlap table move the same rank's figures by. It is not
fitted to the replay, but the replay scales with it: the replay of the scaled programs (:mod:`.simulate`)
against the clean step (:attr:`Calibration.error_pct`) is the replay's miss of the traced steps carried
to the clean clock, whatever the clean steps were, so it does not check the factor. What does is where
the profiler's share came out, phase by phase, against the timers' phases in unprofiled steps
(:mod:`.phases`, ``clock.phase_miss_pct``): on the bundled FSDP2 sample one factor takes 7.7 % of the
step more out of the backward than the timers saw leave it.

What it assumes: that the profiler slowed the step's parts in proportion to their time, so that a
setting moves the step by the same share on either clock. Against bare runs of three settings
measured in one process, from recordings whose slowdowns differ 2x (benchmarks/bench_replay_clock.py,
docs/whatif.md "One clock"), 115 of 126 medians of three to six recordings were within 0.10 of the
bare ratio over seven runs on three models, and the two loads agreed within 0.10 on 62 of 63 settings;
pooled over the runs every median is within 0.10 of bare (model A's pairs from the spun recordings the
furthest, +0.09) and the loads within 0.06 of each other; the bare truth itself moves by up to 0.14
between runs. Measured with three times the bare rounds and each setting's median step (four later
runs), that truth moved by 0.025 between consecutive runs at the median (0.103 at most), 70 of 72 medians
were within 0.10 of it, and the loads within 0.093 of each other on all 36 settings. Where a core was shared through the profiled window, gloo's collectives slow more than
the compute (2.0x against 1.35x on model B in one run), and one root unit, which drops most
collectives, was predicted 0.06 lower from such recordings than from lightly profiled ones (pooled). Scaling the host's work alone and keeping the
collectives' traced times misses further the same way. A cost per traced event fitted by kind on the
units' timed windows explained their excess under torch's fake group (R² 0.98) but not on two real
ranks (R² about 0: there a unit's window holds its wait for the peer); factors per kind read from the
unit-timed steps' timers moved some predictions toward bare and others further away than the
benchmark's own spread (docs/whatif.md, "One clock"). Taking the profiler out per traced event, as
on a GPU (:func:`fsdpviz.replay.model.net_of_events`), moved model A's root onto bare but model B's
and C's further off, and its replay missed the clean steps of the spun recordings by 16-91 %
(benchmarks/bench_profiler_events.py). The timers' optimizer phase, which runs no collective on FSDP2, does
not give the compute's own slowdown either: under a shared core it slowed as much as the whole step or more
(model B 2.43-3.69x against 2.33-2.58x) and by up to 1.4x apart on two ranks of one recording
(docs/whatif.md, "One clock"). Two factors per rank, the collectives' a multiple of the host work's
fitted so that the replayed phases lose what the timers saw each phase lose, took multiples from one end
of the range tried (0.2-2.0) to the other, on two ranks of one recording too, and moved the window
recordings' root further from bare on two models of three, as it did with the optimizer's segment on a
factor of its own (benchmarks/bench_phase_factors.py; docs/whatif.md, "One clock").
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fsdpviz.analysis.bound import BASIS_UNPROFILED
from fsdpviz.replay.recorded import Recording, StepProgram
from fsdpviz.trace.schema import OVERLAP_CPU

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult



@dataclass(slots=True)
class Calibration:
    """How the replay was put on the run's own clock (``clock`` in ``summary --json``)."""

    scale: dict[int, float] = field(default_factory=dict)
    """rank -> the factor its traced durations were scaled by."""
    target_ms: float | None = None
    """The median over the calibrated ranks of their clean unprofiled step (timers)."""
    replay_ms: float | None = None
    """The median over those ranks of their replayed step (the mean over the rank's steps, as its traced step),
    scaled by the measured factor (not fitted to it)."""
    clean_steps: int = 0
    """The fewest clean unprofiled steps a calibrated rank timed."""

    @property
    def error_pct(self) -> float | None:
        """How far the calibrated replay misses the timers, in % of them (None: not calibrated)."""
        if self.target_ms is None or self.replay_ms is None or not self.target_ms:
            return None
        return 100.0 * abs(self.replay_ms - self.target_ms) / self.target_ms


def scaled_step(step: StepProgram, k: float) -> StepProgram:
    """``step`` (a CPU rank's) with every duration scaled by ``k`` (its recorded totals as traced)."""
    # the step's memory (its samples and blocks: no durations) is shared, not copied: it was most of
    # the copy's time, and nothing writes to it once the recording is read
    out = copy.deepcopy(step, memo={id(step.memory): step.memory})
    for mb in out.micro:
        for segment in (mb.pre, mb.mid):
            _scale_segment(segment, k)
        for p in (*mb.forward, *mb.backward):
            for name in ("gap_ns", "pre_ns", "compute_ns", "post_ns", "reduce_after_ns", "reshard_ns",
                         "post_framework_ns", "reduce_host_ns", "pre_framework_ns", "post_ranges_ns"):
                setattr(p, name, getattr(p, name) * k)
            p.launches = [(at * k, ns * k) for at, ns in p.launches]
    _scale_segment(out.post, k)
    for g in out.gathers:
        for name in ("host_ns", "copy_in_ns", "comm_ns", "copy_out_host_ns", "copy_out_ns"):
            setattr(g, name, getattr(g, name) * k)
    for r in out.reduces:
        for name in ("comm_ns", "ar_ns", "host_ns", "prep_ns"):
            setattr(r, name, getattr(r, name) * k)
    return out


def _scale_segment(segment: object, k: float) -> None:
    segment.busy_ns *= k  # type: ignore[attr-defined]
    segment.device_ns *= k  # type: ignore[attr-defined]
    segment.sync_at = [t * k for t in segment.sync_at]  # type: ignore[attr-defined]
    segment.comm_ns = [t * k for t in segment.comm_ns]  # type: ignore[attr-defined]
    segment.lead_ns *= k  # type: ignore[attr-defined]


def scaled(rec: Recording, scale: dict[int, float]) -> Recording:
    """``rec`` with each rank's steps scaled by its factor (ranks without one as traced)."""
    out = copy.copy(rec)
    out.steps = [scaled_step(s, scale[s.rank]) if s.rank in scale else s for s in rec.steps]
    return out


def rank_factors(result: RunResult) -> dict[int, float]:
    """Per rank of a CPU run whose step time is the timers' (``bound.basis`` ``unprofiled``): the one
    de-profiler's factor (:mod:`fsdpviz.structure.deprofile`, ``bound.per_rank[r].device_scale``), the
    rank's clean step over its traced one. Empty elsewhere."""
    bound = result.summary.bound
    if bound is None or bound.basis != BASIS_UNPROFILED or bound.device != OVERLAP_CPU:
        return {}
    return {int(rank): b.device_scale for rank, b in bound.per_rank.items() if b.traced_step_ms}


def calibrate(rec: Recording, factors: dict[int, float], clean: dict[int, tuple[float, int]],
              replay_ns: Callable[[list[StepProgram]], list[float]]) -> Calibration:
    """Per rank of ``rec`` with a factor (:func:`rank_factors`) and a clean step in ``clean`` (rank ->
    (ms, count)): its steps scaled by the factor and replayed (``replay_ns``), against the clean step.
    The factor is measured (clean over traced), and the replay scales with it, so the miss
    (:attr:`Calibration.error_pct`) is the replay's of the traced steps, on the clean clock. An empty calibration for a GPU recording,
    whose kernels the profiler does not slow (:mod:`.hostcost` takes the profiler out there)."""
    if rec.device != "cpu":
        return Calibration()
    by_rank: dict[int, list[StepProgram]] = {}
    for s in rec.steps:
        if s.rank in clean and s.rank in factors:
            by_rank.setdefault(s.rank, []).append(s)
    scale: dict[int, float] = {}
    replayed: dict[int, float] = {}
    for rank, steps in sorted(by_rank.items()):
        k = factors[rank]
        scale[rank] = k
        # the mean over the rank's steps, as its traced step (the factor's divisor) is: a median here set
        # against a mean there read the traced steps' own spread (one fast step of three) as the replay's miss
        replayed[rank] = statistics.fmean(replay_ns([scaled_step(s, k) for s in steps]))
    if not scale:
        return Calibration()
    return Calibration(scale=scale,
                       target_ms=statistics.median(clean[r][0] for r in scale),
                       replay_ms=statistics.median(replayed[r] / 1e6 for r in scale),
                       clean_steps=min(clean[r][1] for r in scale))
