"""The host's work without the profiler: what each traced host event cost the training thread.

A traced GPU step is slower than the run's own: every event the profiler records on the host
threads (an op, a runtime call such as a kernel launch, a ``record_function`` range such as FSDP's
hooks and its copy-in and copy-out) costs the training thread time, and on a launch-bound step the
GPU waits for those launches (:mod:`fsdpviz.structure.profiler_cost` measures the excess per step,
profiled against unprofiled steps, from the recorder's timers). What a setting saves on the host --
one merged unit's hooks instead of K, fewer copy-in and copy-out launches -- is inflated in the
trace by the events it holds, and so is the host time the step keeps.

The model therefore reads a GPU recording a second time with the host's time net of that excess,
spread evenly over the traced host events of the step (``per_op_ns``): an interval of host work
loses the profiler's cost of the events that started in it. The device's own times (kernels,
collectives) are the trace's: the profiler does not slow them. The step time of a setting moves
by the share the simulation on this net host work gives (``whatif``'s predictions on a GPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from fsdpviz.replay.recorded import Recording
    from fsdpviz.structure.profiler_cost import ProfilerCost

# An excess above this share of the traced step is not spread over the host's events: the
# host would cost next to nothing, which is noise in the timers, not the run.
MAX_EXCESS_SHARE: Final = 0.8


def per_op_ns(cost: ProfilerCost | None, rec: Recording) -> float:
    """The profiler's cost per traced host event (ns): the run's profiler share per step
    (:attr:`~fsdpviz.structure.profiler_cost.ProfilerCost.share_ms`) over the host events a traced step
    holds; 0 where the timers do not measure one (no timers, or profiled steps no slower than the others)."""
    share = cost.share_ms if cost is not None else None
    if share is None or not rec.host_ops_per_step or not rec.steps:
        return 0.0
    # the one profiler share (``profiler_share_ms``), the excess the bound takes out of the same step's
    # idle time (:func:`fsdpviz.structure.deprofile.deprofiled`)
    excess_ns = share * 1e6
    traced_ns = sum(s.step_ns for s in rec.steps) / len(rec.steps)
    if excess_ns <= 0 or excess_ns > MAX_EXCESS_SHARE * traced_ns:
        return 0.0
    return excess_ns / rec.host_ops_per_step
