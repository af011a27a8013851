"""Taking the profiler out: how a traced step becomes the run's own step, for every figure fsdpviz shows.

A recording holds two clocks (:mod:`fsdpviz.structure.profiler_cost`): the trace, which the profiler
slowed, and the recorder's timers on the clean unprofiled steps. Every time figure fsdpviz leads with
is on the timers' clock. Two rules take the profiler out: the replay's (:mod:`fsdpviz.replay`: the
recording played again without the profiler's cost), which takes its own drop out of a GPU step's
waits on the host (and, where the collectives run on a host backend, its exposed communication), and
this module's, which keeps the parts adding up to the clean step and takes whatever the replay does not
account for (on the ten shared GPU recordings the replay can say for, at most 2.6 ms a step). This module holds both as the bound
(:mod:`fsdpviz.analysis.bound`) applies them, below the replay's layer:

- **CPU rank**: the training thread is the device. Every op, hook and copy is host work that the
  profiler slows, and gloo's collectives, which the thread waits out, then wait for a slowed peer.
  One factor per rank, ``clean / traced`` (its median clean step over its mean traced step, both
  measured, neither fitted), scales every part of the rank's step (:func:`rank_scale`); the replay's
  calibration (:mod:`fsdpviz.replay.calibration`) scales the rank's program by the same factor.
- **GPU rank**: the profiler slows the host, not the kernels. The replay spreads the excess of the
  traced step over the clean one over the traced host events (:mod:`fsdpviz.replay.hostcost`) and
  plays the step again; the traced step's waits on the host (and a host backend's exposed
  communication) lose what that replay took out of them (:func:`replay_moved`,
  :mod:`fsdpviz.replay.split`). What the replay does not account for, and a
  run the replay cannot say for (no units to replay, a replay that misses the clean step), goes by the
  rule (:func:`deprofiled`): out of the time the traced steps spent on work carried in from before
  them (``Parts.carried``: the steps before the analysed ones queued ahead, as when the profiler
  starts), then out of the time the GPU waited for the host (host wait, FSDP's hooks' share first, in
  proportion), then out of other idle. Only where idle cannot hold the whole excess are the device's
  parts shrunk, in proportion, and :func:`deprofiled` says so: the traced device work itself ran
  longer than the clean step allows (a note, never silent).

A clean step longer than the traced one (within the noise the headline accepts) is longer by time the
trace did not see: it is other idle, so the parts still add up to the clean step.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from fsdpviz.trace.schema import OVERLAP_CPU, OVERLAP_GPU

# Said when the excess does not fit in a GPU step's idle parts (:func:`deprofiled`).
SHRUNK_DEVICE_NOTE: Final = ("the profiler's share exceeds the traced step's idle time, so the device's own parts "
                             "(compute, FSDP's copies, exposed communication) were shrunk in proportion to reach "
                             "the clean step: the traced device work ran longer than the run's")


class Parts(NamedTuple):
    """One step's parts (any unit of time; they add up to the step)."""

    compute: float
    exposed_comm: float
    host_wait: float | None
    """None on a CPU rank (the host is the device) or where the trace holds no launches."""
    other_idle: float
    fsdp_kernels: float = 0.0
    """FSDP's copy kernels (0 on a CPU rank)."""
    fsdp_host: float = 0.0
    """GPU: the host wait spent inside FSDP's hooks; CPU: the thread's ops inside FSDP's ranges."""
    carried: float = 0.0
    """GPU: the time the traced steps ran only work launched before them, beyond what their own work
    ran after them (:func:`fsdpviz.analysis.bound.carried_work`): the steps before the
    analysed ones queued ahead, as when the profiler starts. The steps waited on it (other idle,
    :meth:`settled`); a clean step does not (the de-profiler takes it out first). 0 on a CPU rank."""

    @property
    def total(self) -> float:
        """The step the parts add up to."""
        return (self.compute + self.exposed_comm + (self.host_wait or 0.0) + self.other_idle + self.fsdp_kernels
                + self.fsdp_host + self.carried)

    def scaled(self, k: float) -> Parts:
        """Every part times ``k``."""
        return Parts(self.compute * k, self.exposed_comm * k, None if self.host_wait is None else self.host_wait * k,
                     self.other_idle * k, self.fsdp_kernels * k, self.fsdp_host * k, self.carried * k)

    def settled(self) -> Parts:
        """The parts as shown: the time carried in from earlier steps is other idle (the steps waited)."""
        return self._replace(other_idle=self.other_idle + self.carried, carried=0.0)


def rank_scale(clean_ms: float, traced_ms: float) -> float:
    """A CPU rank's factor from its traced step to its clean one (module docstring); 1.0 when either is
    unknown."""
    return clean_ms / traced_ms if traced_ms > 0 and clean_ms > 0 else 1.0


def deprofiled(parts: Parts, step: float, device: str) -> tuple[Parts, str | None]:
    """``parts`` (a traced step's) moved to the clean ``step`` by the module's rule, and a note where the
    rule had to shrink a GPU step's device parts (None otherwise)."""
    total = parts.total
    if total <= 0:
        return parts, None
    if device == OVERLAP_CPU:
        return parts.scaled(rank_scale(step, total)), None
    excess = total - step
    if excess <= 0:  # a clean step longer than the traced one: time the trace did not see
        return parts._replace(other_idle=parts.other_idle - excess), None
    # work carried in from before the analysed steps is the traced steps' alone: out first
    taken = min(parts.carried, excess)
    parts, excess = parts._replace(carried=parts.carried - taken), excess - taken
    waited = (parts.host_wait or 0.0) + parts.fsdp_host
    taken = min(waited, excess)
    keep = (waited - taken) / waited if waited > 0 else 0.0
    host = None if parts.host_wait is None else parts.host_wait * keep
    fsdp_host = parts.fsdp_host * keep
    excess -= taken
    taken = min(parts.other_idle, excess)
    idle, excess = parts.other_idle - taken, excess - taken
    out = parts._replace(host_wait=host, fsdp_host=fsdp_host, other_idle=idle)
    if excess <= 0:
        return out, None
    device_ms = parts.compute + parts.exposed_comm + parts.fsdp_kernels
    if device_ms <= 0:
        return out, None
    k = max(device_ms - excess, 0.0) / device_ms
    return out._replace(compute=parts.compute * k, exposed_comm=parts.exposed_comm * k,
                        fsdp_kernels=parts.fsdp_kernels * k), SHRUNK_DEVICE_NOTE


# The parts of a GPU step the replay's drop moves (:func:`replay_moved`): where the host's pace decides
# how long the device waits, as the replay without the profiler plays it again.
REPLAY_MOVED: Final = ("host_wait", "fsdp_host", "exposed_comm")


class ReplayMove(NamedTuple):
    """A step moved by the replay's split (:func:`replay_moved`)."""

    moved: Parts
    """The parts on the clean step."""
    left: Parts
    """What the replay's drop left of the traced parts (carried work out first): the rule moved these,
    by their total less the clean step (the remainder)."""
    note: str | None
    """The rule's note (:func:`deprofiled`)."""
    beyond: dict[str, float]
    """Per part of :data:`REPLAY_MOVED`, what the replay took out of it beyond what the trace holds (ms;
    the part ends at 0 and that time goes with the remainder)."""


def replay_moved(parts: Parts, drop: Parts, step: float) -> ReplayMove:
    """A GPU step's ``parts`` (as traced) moved to the clean ``step`` by the replay's split: each part the
    host's pace decides on the device -- the waits on the host (host wait, FSDP's hooks' share of it) and
    the communication the device waits out where the host runs it (gloo's collectives on CUDA tensors;
    :mod:`fsdpviz.replay.split` gives no drop there for NCCL's, kernels the profiler does not slow) --
    less what the replay without the profiler took out of it (``drop``: the traced program's replayed
    part less the same part replayed net of the profiler's cost per host event,
    :mod:`fsdpviz.replay.split`), none below 0. The kernels' own time (the model's compute, FSDP's
    copies) keeps the trace's figure: the replay plays the traced kernels' durations, and its drop there
    is only how its two replays overlap them (FSDP's copies: 0.1-0.8 ms a step on the shared GPU
    recordings). So does other idle: the replayed device waits on nothing but launches and its own
    streams, so its other idle is launch latency alone (:class:`fsdpviz.replay.simulate.SimResult`), not
    the trace's waits on events, which it does not hold. Both go with the remainder.

    Work carried in from before the traced steps is the traced steps' alone: it comes out first, as
    the rule takes it, and the replay's drop then takes no more than the excess left (scaled down in
    proportion where it would; a drop below 0, a part the replay saw grow without the profiler, is
    none). What the replay's drop does not account for -- it took more out of a part than the trace
    holds, its drop differs from the timers' whole drop (its replay of the traced step misses the
    trace's), FSDP's copies -- is ``step`` against what is left: that remainder (> 0 where the timers saw
    more leave) goes by :func:`deprofiled`'s rule, so the parts still add up to ``step``; the device's
    parts shrink only where the rule has to, as its note says."""
    excess = max(parts.total - step, 0.0)
    carried_out = min(parts.carried, excess)
    excess -= carried_out
    held = {name: getattr(parts, name) or 0.0 for name in REPLAY_MOVED}
    asked = {name: max(getattr(drop, name) or 0.0, 0.0) for name in REPLAY_MOVED}
    if parts.host_wait is None:
        asked["host_wait"] = 0.0
    total = sum(asked.values())
    k = min(1.0, excess / total) if total > 0 else 0.0
    left = parts._replace(carried=parts.carried - carried_out,
                          **{name: max(held[name] - asked[name] * k, 0.0) for name in REPLAY_MOVED})
    if parts.host_wait is None:
        left = left._replace(host_wait=None)
    moved, note = deprofiled(left, step, OVERLAP_GPU)
    return ReplayMove(moved, left, note, {name: asked[name] * k - held[name] for name in REPLAY_MOVED
                                          if asked[name] * k > held[name]})


def device_scale(parts: Parts, moved: Parts) -> float:
    """How a step's device figures (a pass's kernels; communication where :func:`comm_scale` has no
    exposed communication to go by) move with it: the factor its device parts moved by (CPU: the rank's
    factor; GPU: 1 unless :func:`deprofiled` shrank them)."""
    before = parts.compute + parts.exposed_comm + parts.fsdp_kernels
    after = moved.compute + moved.exposed_comm + moved.fsdp_kernels
    return after / before if before > 0 else 1.0


def comm_scale(parts: Parts, moved: Parts) -> float:
    """How a step's communication figures (its collectives', per unit and per purpose, exposed or not)
    move with it: the factor its exposed communication moved by from the trace (``parts``) to the clean
    step (``moved``); a step without exposed communication by :func:`device_scale`'s factor."""
    if parts.exposed_comm <= 0:
        return device_scale(parts, moved)
    return moved.exposed_comm / parts.exposed_comm


def host_scale(parts: Parts, moved: Parts) -> float:
    """How a step's host-wait figures (a unit's host wait) move with it: the factor its host wait,
    FSDP's hooks' share included, moved by (GPU: the share :func:`deprofiled` kept; 1 without any)."""
    before = (parts.host_wait or 0.0) + parts.fsdp_host
    after = (moved.host_wait or 0.0) + moved.fsdp_host
    return after / before if before > 0 else 1.0


def idle_scale(parts: Parts, moved: Parts) -> float:
    """How the other idle inside a traced span (a GPU unit's pass, first kernel to last) moves with its
    step: the share of the traced other idle the de-profiler kept. A clean step longer than the traced
    one adds idle the trace did not see, which lies inside no traced span: there no gap grows (1)."""
    if parts.other_idle <= 0:
        return 1.0
    return min(moved.other_idle / parts.other_idle, 1.0)
