"""The recorder's per-step peak from counters it never resets (``timers.step_peak``), against a
simulated allocator whose every level is known: a cumulative peak counter over a random memory
trace, reset by the "script" at random moments, some of which the recorder sees and some not."""

from __future__ import annotations

import random

import pytest

from fsdpviz.record.timers import AT_LEAST, AT_MOST, EXACT, step_peak
from fsdpviz.runfolder import clean_steps


class Counter:
    """``max_memory_allocated``: the highest level since the last reset (a reset starts at the level now)."""

    def __init__(self) -> None:
        self.level = 0
        self.peak = 0

    def set(self, level: int) -> None:
        self.level = level
        self.peak = max(self.peak, level)

    def reset(self) -> None:
        self.peak = self.level


def _run(seed: int, *, seen_resets: bool, unseen_resets: bool) -> list[tuple[int, int, str]]:
    """(true peak, reported bytes, bound) per step of a random run."""
    rng = random.Random(seed)
    counter = Counter()
    counter.set(rng.randrange(100, 1000))
    baseline: int | None = None
    out = []
    for _step in range(30):
        true_peak = counter.level  # the level as the step starts counts as its own
        segments: list[tuple[int, bool]] = []
        after_reset = False
        for _event in range(rng.randrange(1, 8)):
            counter.set(max(0, counter.level + rng.randrange(-400, 400)))
            true_peak = max(true_peak, counter.level)
            if seen_resets and rng.random() < 0.15:
                segments.append((counter.peak, after_reset))  # read just before the reset goes through
                counter.reset()
                after_reset = True
            elif unseen_resets and rng.random() < 0.1:
                counter.reset()
        segments.append((counter.peak, after_reset))
        nbytes, bound = step_peak(baseline, segments)
        out.append((true_peak, nbytes, bound))
        baseline = counter.peak
    return out


@pytest.mark.parametrize("seed", range(40))
def test_step_peak_is_exact_or_a_true_bound_without_resets_and_with_seen_ones(seed: int) -> None:
    for seen in (False, True):
        for true_peak, nbytes, bound in _run(seed, seen_resets=seen, unseen_resets=False):
            assert bound in (EXACT, AT_MOST)
            if bound == EXACT:
                assert nbytes == true_peak
            else:
                assert true_peak <= nbytes


@pytest.mark.parametrize("seed", range(40))
def test_step_peak_with_resets_it_cannot_see_is_never_wrong_where_it_says_at_least(seed: int) -> None:
    # (a reset it cannot see followed by a new high reads as exact: what came before the reset is lost,
    # which is why the recorder watches the CUDA reset function; what it claims as a lower bound holds)
    results = _run(seed, seen_resets=True, unseen_resets=True)
    assert any(bound == AT_LEAST for *_, bound in results)
    for true_peak, nbytes, bound in results:
        if bound == AT_LEAST:
            assert true_peak >= nbytes


def test_step_peak_cases() -> None:
    # the step raised the counter: its peak is the reading
    assert step_peak(500, [(800, False)]) == (800, EXACT)
    # the counter stayed: the step's peak is at most it
    assert step_peak(800, [(800, False)]) == (800, AT_MOST)
    # the script reset the counter at a moment the recorder saw, then reached 300: the part before the
    # reset stayed at most 800, so the step's peak is at most 800, and at least 300
    assert step_peak(800, [(800, False), (300, True)]) == (800, AT_MOST)
    # ... and if the part before the reset raised it to 900, that is the peak
    assert step_peak(800, [(900, False), (300, True)]) == (900, EXACT)
    # a reset nobody saw: the counter fell, so the reading is only a lower bound
    assert step_peak(800, [(300, False)]) == (300, AT_LEAST)
    # the first reading of a process covers everything before: at most
    assert step_peak(None, [(700, False)]) == (700, AT_MOST)


def test_clean_steps_are_the_steps_nothing_else_touched() -> None:
    # 12 steps, 2-4 profiled (1 warms the profiler up), 5 unit-timed (it also follows the export), 11 cut short
    steps = range(12)
    assert clean_steps(steps, profiled=[2, 3, 4], unit_timed=[5], partial=11) == {6, 7, 8, 9, 10}
    # two unit-timed steps take a clean one away
    assert clean_steps(steps, profiled=[2, 3, 4], unit_timed=[5, 6], partial=None) == {7, 8, 9, 10, 11}
    # a recording older than unit-timed steps
    assert clean_steps(steps, profiled=[2, 3, 4], unit_timed=None, partial=None) == {6, 7, 8, 9, 10, 11}
    # profiling late: clean steps before the window too, never the first two
    assert clean_steps(steps, profiled=[6, 7], unit_timed=[9], partial=None) == {2, 3, 4, 10, 11}
    assert clean_steps(steps, profiled=[], unit_timed=[5], partial=None) == set()
    # the steps the script's own profiler was on in
    assert clean_steps(steps, profiled=[2, 3, 4], unit_timed=[5], partial=None, script_profiled=[8, 9]) == {
        6, 7, 10, 11}


def test_a_reset_the_script_makes_is_read_before_it_goes_through_and_the_hook_leaves_with_the_run() -> None:
    """The clock wraps torch's peak reset: the script's own reset still runs (here, on a CPU-only torch,
    it raises as it would bare), after the clock read what the counters said of the step so far."""
    import torch

    from fsdpviz.record.clock import PeakWatch, StepClock

    counter = Counter()
    counter.set(500)
    peaks = PeakWatch(lambda: {"peak_allocated": counter.peak})
    clock = StepClock()
    clock._peaks = peaks
    peaks.start()
    before = torch.cuda.reset_peak_memory_stats
    clock._watch_resets(peaks)
    counter.set(900)  # the step's peak, before the script's reset
    counter.set(200)
    bare_error: type[BaseException] | None = None
    try:
        before()
    except Exception as exc:  # noqa: BLE001 - what the reset does bare on this machine
        bare_error = type(exc)
    if bare_error is None:
        torch.cuda.reset_peak_memory_stats()
    else:
        with pytest.raises(bare_error):
            torch.cuda.reset_peak_memory_stats()
    counter.reset()
    counter.set(300)
    assert peaks.end_step() == {"peak_allocated": (900, EXACT)}
    clock.remove()
    assert torch.cuda.reset_peak_memory_stats is before
