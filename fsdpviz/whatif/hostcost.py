"""The host's work without the profiler: a program's host durations net of the profiler's cost.

A traced GPU step is slower than the run's own: every CPU op the profiler records costs the
training thread time, and on a launch-bound step the GPU waits for those launches
(:mod:`fsdpviz.analysis.profiler_cost` measures the excess, profiled against unprofiled steps, from
the recorder's timers). What a setting saves on the host -- one unit's hooks, copy-in and copy-out
launches instead of K, no pre-backward all-gather after a forward kept unsharded -- is therefore
inflated in the trace, and so is the host time the step keeps. The simulator is run on the host's
work net of that excess: the excess is taken off every host interval of the step (the hooks, the
launches of gathers and copy-outs, the Python between units, the segments outside units) in
proportion to its length, which is how the profiler's per-op cost spreads over host work of one
op density. The device's own times (kernels, collectives) are the trace's: the profiler does not
slow them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from fsdpviz.whatif.program import BusyOp, Op, Program, SegmentOp
from fsdpviz.whatif.recording import Segment

# Host work never shrinks below this share of its traced length: an estimate of the profiler's
# cost larger than the host's whole work is noise in the timers, not a host that costs nothing.
MIN_HOST_SHARE: Final = 0.2


def host_ns(program: Program) -> float:
    """The host's busy time in ``program`` (ns): the work that launches, outside every wait."""
    busy = sum(op.ns for op in program.ops if isinstance(op, BusyOp))
    busy += sum(g.host_ns + g.copy_out_host_ns for g in program.gathers)
    busy += sum(op.segment.busy_ns for op in program.ops if isinstance(op, SegmentOp))
    return busy


def host_share(host_busy_ns: float, excess_ns: float) -> float:
    """What part of the traced host work the run does without the profiler, given the profiler's
    measured cost per step ``excess_ns`` (profiled minus unprofiled step)."""
    if host_busy_ns <= 0 or excess_ns <= 0:
        return 1.0
    return max(MIN_HOST_SHARE, 1.0 - excess_ns / host_busy_ns)


def scaled(program: Program, share: float) -> Program:
    """``program`` with every host duration times ``share`` (device durations as they are)."""
    if share == 1.0:
        return program
    ops: list[Op] = []
    for op in program.ops:
        if isinstance(op, BusyOp):
            ops.append(BusyOp(op.ns * share, op.what))
        elif isinstance(op, SegmentOp):
            seg = op.segment
            ops.append(replace(op, segment=Segment(busy_ns=seg.busy_ns * share, device_ns=seg.device_ns,
                                                   sync_at=[at * share for at in seg.sync_at],
                                                   comm_ns=list(seg.comm_ns))))
        else:
            ops.append(op)
    gathers = [replace(g, host_ns=g.host_ns * share, copy_out_host_ns=g.copy_out_host_ns * share)
               for g in program.gathers]
    return replace(program, ops=ops, gathers=gathers)
