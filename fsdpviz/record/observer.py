"""What the recorder does in the running step, and what that costs the step.

A recorded run has kinds of step (docs/recording.md, "Kinds of step"): warm-up, profiled, unit-timed
and clean. The clean steps are the bare run that every time figure is calibrated on, so in them the
recorder does only what a step boundary needs: a host timestamp and one CUDA event at each end of the
step. On a CPU rank, where there is no CUDA event, a clean step also takes a host timestamp at each end
of its forward, backward and optimizer phases (one autograd callback ends the backward): they are the
out-of-sample check of the replay's clock (docs/whatif.md). FSDP's hooks and collectives, which fsdpviz
wraps for its trace labels and unit timers, then pass straight through after one flag check
(:attr:`Observer.active`).

What is left is measured here, on the agent itself: the time its hooks and the step boundary take
(``time.perf_counter_ns`` around them), and the pass-through calls, counted, at a cost per call the
agent measures once in its own process (:func:`pass_through_ns`). run.json's ``ranks[].observer``
holds the result (:meth:`Observer.facts`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Calls timed to measure one pass-through (about 10 ms once per rank): enough to average out the
# clock's resolution and a scheduler tick.
_PASS_SAMPLES = 20_000


@dataclass(slots=True)
class StepCost:
    """The agent's own work in one step."""

    step: int
    agent_ns: int  # hooks and the step boundary, timed
    passes: int  # wrapped framework calls that passed straight through
    unit_intervals: int  # per-unit intervals the timers marked
    cuda_events: int  # CUDA events the timers created


@dataclass(slots=True)
class Observer:
    """The running step's switches, read by every wrapper, and the agent's cost per step."""

    active: bool = True
    """The wrappers do their work (trace labels, unit timers, the units' first forward order); False:
    they pass the call straight through (counted in :attr:`passes`)."""
    labels: bool = False
    """The profiler records: fsdpviz's trace ranges are worth entering."""
    unit_timing: bool = False
    """This step's units are timed (a unit-timed or a profiled step)."""
    passes: int = 0
    agent_ns: int = 0
    pass_ns: float = 0.0
    """Measured cost of one pass-through call, in ns (:func:`pass_through_ns`)."""
    costs: list[StepCost] = field(default_factory=list)

    def add(self, started_ns: int) -> None:
        """Count the agent's time since ``started_ns`` (a ``perf_counter_ns`` reading) in this step."""
        self.agent_ns += time.perf_counter_ns() - started_ns

    def end_step(self, step: int, *, unit_intervals: int, cuda_events: int) -> None:
        """Close ``step``'s account (its boundary work up to now included) and start the next one."""
        self.costs.append(StepCost(step, self.agent_ns, self.passes, unit_intervals, cuda_events))
        self.agent_ns = 0
        self.passes = 0

    def facts(self, clean: set[int], step_ms: dict[int, float]) -> dict[str, Any] | None:
        """run.json's ``ranks[].observer``: the agent's own cost in the rank's clean steps (``clean``),
        against those steps' times (``step_ms``, the timers'); None without a clean step."""
        rows = [c for c in self.costs if c.step in clean]
        if not rows:
            return None
        agent_ms = [(c.agent_ns + c.passes * self.pass_ns) / 1e6 for c in rows]
        shares = [ms / step_ms[c.step] for ms, c in zip(agent_ms, rows, strict=True) if step_ms.get(c.step)]
        return {
            "clean_steps": [c.step for c in rows],
            "agent_ms": [round(ms, 4) for ms in agent_ms],
            "agent_ms_median": round(statistics.median(agent_ms), 4),
            "agent_ms_max": round(max(agent_ms), 4),
            "agent_share_median": round(statistics.median(shares), 6) if shares else None,
            "agent_share_max": round(max(shares), 6) if shares else None,
            "pass_through_calls_per_step": statistics.median(c.passes for c in rows),
            "pass_through_ns_each": round(self.pass_ns, 1),
            "unit_intervals_max": max(c.unit_intervals for c in rows),
            "cuda_events_max": max(c.cuda_events for c in rows),
        }


def pass_through_ns(samples: int = _PASS_SAMPLES) -> float:
    """What one pass-through costs in this process, in ns: a wrapper of the form fsdpviz installs
    (one flag check, one count, the call) against the bare call it wraps."""
    observer = Observer(active=False)

    def original(*args: Any, **kwargs: Any) -> None:
        return None

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not observer.active:
            observer.passes += 1
            return original(*args, **kwargs)
        return None  # pragma: no cover - the measured path is the pass-through

    def timed(call: Callable[..., Any]) -> int:
        start = time.perf_counter_ns()
        for _ in range(samples):
            call(1, key=2)
        return time.perf_counter_ns() - start

    timed(wrapper)  # warm the code paths
    # the smaller of two tries of each: a scheduler tick inflates one try, never deflates it
    wrapped = min(timed(wrapper), timed(wrapper))
    bare = min(timed(original), timed(original))
    return max(0.0, (wrapped - bare) / samples)
