"""The one de-profiler: how a traced step becomes the run's own step, for every figure fsdpviz shows.

A recording holds two clocks (:mod:`fsdpviz.structure.profiler_cost`): the trace, which the profiler
slowed, and the recorder's timers on the clean unprofiled steps. Every time figure fsdpviz leads with
is on the timers' clock; this module is the one rule that moves a traced figure there. The bound
(:mod:`fsdpviz.analysis.bound`), the overlap table, whatif's baseline and the replay's calibration
(:mod:`fsdpviz.replay.calibration`) all read it, so one quantity has one figure.

What the profiler slows, and so what the rule takes out:

- **CPU rank**: the training thread is the device. Every op, hook and copy is host work that the
  profiler slows, and gloo's collectives, which the thread waits out, then wait for a slowed peer.
  One factor per rank, ``clean / traced`` (its median clean step over its mean traced step, both
  measured, neither fitted), scales every part of the rank's step (:func:`rank_scale`).
- **GPU rank**: the profiler slows the host, not the kernels. The excess of the traced step over the
  clean one comes out of the time the traced steps spent on work carried in from before them
  (``Parts.carried``: the steps before the analysed ones queued ahead, as when the profiler starts),
  then out of the time the GPU waited for the host (host wait, FSDP's hooks' share first, in
  proportion), then out of other idle. Only where idle cannot hold the whole excess are the
  device's parts shrunk, in proportion, and :func:`deprofiled` says so: the traced device work itself
  ran longer than the clean step allows (a note, never silent). The replay spreads the same excess
  over the traced host events (:mod:`fsdpviz.replay.hostcost`): the same assumption, on its program.

A clean step longer than the traced one (within the noise the headline accepts) is longer by time the
trace did not see: it is other idle, so the parts still add up to the clean step.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from fsdpviz.trace.schema import OVERLAP_CPU

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


def device_scale(parts: Parts, moved: Parts) -> float:
    """How a step's device figures (communication, per-unit times) move with it: the factor its device
    parts moved by (CPU: the rank's factor; GPU: 1 unless :func:`deprofiled` shrank them)."""
    before = parts.compute + parts.exposed_comm + parts.fsdp_kernels
    after = moved.compute + moved.exposed_comm + moved.fsdp_kernels
    return after / before if before > 0 else 1.0


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
