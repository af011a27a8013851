"""Which optimizer steps torch.profiler records: skip ``warmup`` steps, record the next ``steps``.

The agent steps the profiler once per optimizer step (not per forward), so ``ProfilerStep#N`` in a
trace is training step N (counted from 0 at the first forward of the sharded model) and the same
N appears in the timers. Kineto needs one warm-up step before it records accurately, so the step
just before the first recorded one is a profiler warm-up step (when there is one).

Pure functions, so that the schedule can be checked without torch.
"""

from __future__ import annotations

from typing import Final

NONE: Final = "none"
WARMUP: Final = "warmup"
RECORD: Final = "record"
RECORD_AND_SAVE: Final = "record_and_save"


def profiler_action(step: int, warmup: int, steps: int) -> str:
    """The profiler action for training step ``step`` (0-based)."""
    last = warmup + steps - 1
    if step < warmup - 1 or step > last:
        return NONE
    if step == warmup - 1:
        return WARMUP
    return RECORD_AND_SAVE if step == last else RECORD


def profiled_steps(warmup: int, steps: int) -> list[int]:
    """The training steps a complete recording holds."""
    return list(range(warmup, warmup + steps))


def unit_timed_steps(warmup: int, steps: int, unit_timer_steps: int) -> range:
    """The training steps whose units the timers clock: the ``unit_timer_steps`` steps right after the
    profiled ones. The first of them follows the trace export, which already keeps it out of the clean
    steps (``fsdpviz.structure.profiler_cost``); more of them take clean steps away."""
    first = warmup + steps
    return range(first, first + unit_timer_steps)


def should_fall_back(*, optimizer_stepped: bool, elapsed_s: float, forwards: int, fallback_after_s: float) -> bool:
    """True when a script that never steps a torch optimizer should get a time-window recording.

    Requires both time and more than one forward, so that a slow first step (compilation, a large
    model) is not mistaken for a script without an optimizer.
    """
    return not optimizer_stepped and forwards >= 2 and elapsed_s >= fallback_after_s
