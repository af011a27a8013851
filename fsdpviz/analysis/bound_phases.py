"""Out of sample: where the rule takes the profiler's share out, phase by phase, against the timers.

On a GPU the bound (:mod:`fsdpviz.analysis.bound`) is the replay's split (:mod:`fsdpviz.replay.split`),
whose phases the replay's own check holds to the timers (:mod:`fsdpviz.replay.phases`); what the replay
does not account for, and a run it cannot say for, goes by the rule
(:func:`fsdpviz.structure.deprofile.deprofiled`): the excess of the traced step over the clean one
leaves the device's waits on the host (host wait and FSDP's hooks' share), each in proportion to its
time. This is the rule's check, on the same partition: what the comparison of the two rests on
(``benchmarks/bench_deprofile_phases.py``). Nothing in that rule knows the step's phases, so where it says the share left can be
checked on what the recorder's timers saw: each phase (the root module's forward, autograd's backward)
in the profiled steps against the unprofiled ones (:func:`fsdpviz.structure.profiler_cost.phase_times`).

A rank's waits are split by where the host made the launch the device waited for
(``UNIT_STEPS.host_wait_ns``: a unit pass's window, innermost first): the forward's passes and the
backward's. Each loses the share of its waits the rule took out of the rank's. The rest of the step
loses the rest of the rule's take: the waits outside every pass (before the forward, between the
phases, the optimizer), the work carried in from before the traced steps, which the rule takes out
first, and the other idle it takes where the waits cannot hold the excess (``spilled_ms``). On the
timers' side the rest is their step less their forward and backward, so each side's three add up to
its own step less its clean one (the trace's window and the timers' step differ by the hooks between
them). A recorder older than the backward's timer timed the forward alone of the two, and the
backward is then read with the rest. The timers' backward is autograd's whole backward, the loss's
and FSDP's final callbacks included, where the rule's is the waits for launches made in the units'
backward passes: what lies between them is in the rule's rest. The miss is in % of the rank's
unprofiled step, the run's the median over ranks, as the replay's own check
(:mod:`fsdpviz.replay.phases`), which reads the optimizer alone as its third phase (docs/whatif.md,
"Out of sample").

On a GPU the timers are the host's: a phase's host time holds the host's waits for the device (a
synchronisation, a full launch queue), which move between phases with how far the host runs ahead, so a
phase's truth there is uncertain by up to 15 points of the step (docs/whatif.md, "Which de-profiler the
split reads"). Only a recording whose clean steps timed their phases can be checked: on a GPU, one made
when every unprofiled step timed its units and phases (the shared H100 and H200 recordings); a GPU's
clean steps now time only their ends. A CPU rank's rule is one factor for the whole step, the replay's
calibration itself: its check is the replay's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from fsdpviz.analysis.bound import traced_parts
from fsdpviz.structure.deprofile import deprofiled
from fsdpviz.structure.profiler_cost import STEP_TIMER_PHASE, clean_step_ms, phase_times
from fsdpviz.trace import schema
from fsdpviz.vocabulary import BACKWARD, FORWARD

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult

REST: Final = "rest"
"""The step less its forward and backward (a recorder without the backward's timer: less its forward)."""


@dataclass(slots=True)
class BoundPhaseCheck:
    """The bound's de-profiler checked per phase against the timers (module docstring)."""

    miss_pct: dict[str, float]
    """``forward``, ``backward`` (where every rank checked timed it) and ``rest``: the share the rule
    took out of the phase less the share the timers saw leave it, in % of the unprofiled step (median
    over ranks)."""
    ranks: int
    """How many ranks were checked."""
    spilled_ms: float
    """The most any rank's rule took out of other idle, beyond its waits (ms a step; 0 where none): in the
    rest's take."""

    @property
    def error_pct(self) -> float:
        """The largest phase's miss."""
        return max(abs(v) for v in self.miss_pct.values())


def bound_phase_check(run: RunResult) -> BoundPhaseCheck | None:
    """The check of ``run``'s bound (module docstring); None on a run of no GPU rank that timed its
    phases in clean steps and waited on its host."""
    timed = phase_times(run.traces.timers, run.traces.run)
    clean = clean_step_ms(run.traces.timers, run.traces.run)
    us = run.analysis.unit_steps
    misses: list[dict[str, float]] = []
    spilled = 0.0
    for row in run.overlap.to_dict(orient="records"):
        rank = int(row["rank"])
        if str(row["device"]) != schema.OVERLAP_GPU or rank not in timed or rank not in clean \
                or int(row["bound_window_ns"]) <= 0:
            continue
        _, parts, _ = traced_parts(row)
        waited = (parts.host_wait or 0.0) + parts.fsdp_host
        if waited <= 0:
            continue
        moved, _ = deprofiled(parts, clean[rank][0], schema.OVERLAP_GPU)
        taken = (waited - (moved.host_wait or 0.0) - moved.fsdp_host) / waited
        spilled = max(spilled, parts.other_idle - moved.other_idle)
        mine = us[(us["rank"] == rank).to_numpy()]
        steps = max(int(row["n_steps"]), 1)  # per analysed step, as the bound's parts
        wait_ns = mine["host_wait_ns"].clip(lower=0).to_numpy(np.int64)
        phase = mine["phase"].astype(str).to_numpy()
        waits: dict[str, float] = {p: float(wait_ns[phase == p].sum()) / steps / 1e6 for p in (FORWARD, BACKWARD)}
        t = timed[rank]
        seen: dict[str, float] = {p: t.profiled[p] - t.unprofiled[p]
                                  for p in (FORWARD, BACKWARD, STEP_TIMER_PHASE) if p in t.unprofiled}
        if BACKWARD not in seen:  # read with the rest: the recorder timed no backward
            waits.pop(BACKWARD)
        took = {p: w * taken for p, w in waits.items()}
        took[REST] = parts.total - clean[rank][0] - sum(took.values())  # the rule's whole take, less those
        seen[REST] = seen[STEP_TIMER_PHASE] - sum(seen[p] for p in waits)
        step = t.unprofiled[STEP_TIMER_PHASE]
        misses.append({p: 100.0 * (took[p] - seen[p]) / step for p in took})
    if not misses:
        return None
    phases = [p for p in (FORWARD, BACKWARD, REST) if all(p in m for m in misses)]
    return BoundPhaseCheck(miss_pct={p: round(float(statistics.median(m[p] for m in misses)), 2) for p in phases},
                           ranks=len(misses), spilled_ms=round(max(spilled, 0.0), 3))
