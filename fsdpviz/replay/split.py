"""The bound, the replay's split: where a GPU run's step time is the timers' clean step, the parts of its
traced step that the host's pace decides lose what the replay without the profiler took out of them.

The model replays every step it reads twice (:mod:`.model`): as traced, and net of the profiler's cost
per traced host event (:mod:`.hostcost`). Both replays split their simulated step as the bound splits
a traced one (:class:`fsdpviz.replay.simulate.SimResult`: the model's compute, FSDP's copies, exposed
communication, the host wait, FSDP's hooks' share of it, other idle). Per rank, the traced replay's
part less the net replay's, averaged over the rank's replayed steps, is what the profiler cost that
part: the drop. The bound takes the drop of the device's waits on the host (host wait, FSDP's hooks'
share) out of the trace's own figures (the traced step, which the replay reproduces only
approximately, keeps its own), and where the run's collectives run on a host backend (gloo on CUDA
tensors: ``Recording.serial_collectives``; their labels hold the host, and most of their time is
exposed) the drop of its exposed communication too: there the collectives are the host's work, and a
slower host runs them longer. NCCL's are kernels the profiler does not slow, and their exposed time
keeps the trace's, as do the kernels' own time and other idle
(:func:`fsdpviz.structure.deprofile.replay_moved` says why). What the drops do not account for goes
to the rule: on the ten shared GPU recordings the replay can say for, at most 2.6 ms a step
(docs/whatif.md, "The bound, the replay's split").

Where the replay cannot say (no model, no replay without the profiler, or one the clock does not call
``replayed``: :func:`fsdpviz.replay.clock.unreliable`), the bound stays the rule's and its note says
why. A CPU run's bound moves each rank by one factor, which the replay's calibration reads from it
(:func:`.calibration.rank_factors`): one factor, one split, the rule's.

``whatif.gains.summary_model`` adopts the split into the run (``RunResult.adopt_bound``) once it reads
the run's model, so the summary, the report, ``compare``, ``export`` and ``whatif`` all read it; the
summary cache keeps it with the completed summary, and a run seeded from it adopts it
(:func:`fsdpviz.cache.seed`).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fsdpviz.analysis.bound import BY_REPLAY, BoundSummary, summarize_bound
from fsdpviz.replay.clock import (
    PHASE_LIMIT_PCT,
    PHASES_MISSED,
    RELIABLE_REPLAY_PCT,
    STEP_MISSED,
    net_error_pct,
    unreliable,
)
from fsdpviz.replay.model import model_clock
from fsdpviz.structure.deprofile import Parts
from fsdpviz.structure.profiler_cost import clean_step_ms
from fsdpviz.trace.schema import OVERLAP_GPU

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult
    from fsdpviz.replay.model import Model
    from fsdpviz.replay.recorded import StepProgram
    from fsdpviz.replay.simulate import SimResult


def sim_parts(sim: SimResult) -> Parts:
    """A replayed GPU step's split (ms), on the bound's parts (nothing is carried in from before a
    replayed step)."""
    return Parts(sim.compute_ns / 1e6, sim.exposed_comm_ns / 1e6, (sim.host_wait_ns or 0.0) / 1e6,
                 sim.other_idle_ns / 1e6, sim.fsdp_copy_ns / 1e6, sim.fsdp_host_ns / 1e6, 0.0)


def replay_drops(model: Model) -> tuple[dict[int, Parts] | None, str]:
    """Per replayed rank, the traced replay's parts less the net replay's (ms, mean over the rank's
    steps; module docstring), or None and why the model cannot say."""
    net = model.net
    if model.recording.device != "gpu":
        return None, "a CPU run's replay scales each rank by the rule's factor"
    if net is None:
        return None, ("the model has no replay without the profiler (the profiler's excess is under the timers' "
                      "noise or most of the traced step)")
    cost = model.result.profiler
    if cost is None or not cost.headline:
        return None, "the run's step is the traced one"
    if not net.replays:
        return None, "no step was replayed without the profiler"
    # the clock's own test (clock.unreliable): the split is the replay's only where the clock is
    error = net_error_pct([r.step_ns / 1e6 for r in net.replays], cost.unprofiled_step_ms)
    phases = model_clock(model).phases
    why = unreliable(error, phases.error_pct if phases is not None else None)
    if why == STEP_MISSED:
        return None, (f"the replay without the profiler misses the timers' clean step by {error:.1f} % (more than "
                      f"{RELIABLE_REPLAY_PCT:g} %)")
    if why == PHASES_MISSED:
        assert phases is not None
        return None, (f"out of sample, the replay without the profiler took the profiler's share out of the phases "
                      f"up to {phases.error_pct:.1f} % of the step away from where the timers saw it leave (more "
                      f"than {PHASE_LIMIT_PCT:g} %)")
    before = per_rank_parts(model.recording.steps, model.replays)
    after = per_rank_parts(net.recording.steps, net.replays)
    drops = {rank: Parts(*((a or 0.0) - (b or 0.0) for a, b in zip(before[rank], after[rank])))
             for rank in sorted(set(before) & set(after))}
    drops = host_paced(drops, model.recording.serial_collectives)
    return (drops, "") if drops else (None, "no rank was replayed both as traced and without the profiler")


def host_paced(drops: dict[int, Parts], host_backend: bool) -> dict[int, Parts]:
    """``drops`` as the bound takes them: the exposed communication's only where the collectives run on a
    host backend (``host_backend``: gloo on CUDA tensors, whose labels hold the host while they run); NCCL's
    are kernels the profiler does not slow, so how long the device waits on them stays the trace's, and
    what the replay moves there goes with the remainder (module docstring)."""
    return drops if host_backend else {rank: d._replace(exposed_comm=0.0) for rank, d in drops.items()}


def per_rank_parts(steps: Sequence[StepProgram], sims: Sequence[SimResult]) -> dict[int, Parts]:
    """Per rank, the mean split of its replayed steps (ms)."""
    by_rank: dict[int, list[Parts]] = defaultdict(list)
    for step, sim in zip(steps, sims):
        by_rank[step.rank].append(sim_parts(sim))
    return {rank: Parts(*(statistics.fmean(p[i] or 0.0 for p in parts) for i in range(len(Parts._fields))))
            for rank, parts in by_rank.items()}


def replay_bound(run: RunResult, model: Model | None, why_not: str = "") -> BoundSummary | None:
    """``run``'s bound on the replay's split (module docstring) where its step is the timers' on a GPU;
    the rule's, with why, where ``model`` (None: ``why_not``) cannot say; None without a bound."""
    drops, why = replay_drops(model) if model is not None else (None, why_not)
    return summarize_bound(run.overlap, run.profiler, clean_step_ms(run.traces.timers, run.traces.run),
                           drops=drops, rule_why=why or None)


def adopt(run: RunResult, model: Model | None, why_not: str = "") -> None:
    """Make the replay's split ``run``'s bound (``RunResult.adopt_bound``) where the run's step is the
    timers' on a GPU, and where the model cannot give it, say why in the bound's note."""
    rule = run.bound_split
    if rule is None or rule.device != OVERLAP_GPU or rule.deprofiled_by is None or rule.deprofiled_by == BY_REPLAY:
        return
    bound = replay_bound(run, model, why_not)
    if bound is not None:
        run.adopt_bound(bound)
