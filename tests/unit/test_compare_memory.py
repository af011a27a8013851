"""Memory a step adds and level drift, on hand-built traces whose levels are known sample by sample."""

from __future__ import annotations

from pathlib import Path

from helpers.kineto import TraceBuilder

from fsdpviz.analysis.compare.memory import drift_bytes, step_levels, step_rise_bytes
from fsdpviz.trace import load_traces
from fsdpviz.trace.tables import TraceSet

MIB = 1 << 20


def _run(tmp_path: Path, starts_mib: list[int], rise_mib: int) -> tuple[TraceSet, list[int]]:
    """Steps 1..n of 1000 µs; each starts at ``starts_mib[i]`` and climbs ``rise_mib`` in its middle."""
    b = TraceBuilder(rank=0)
    level = 0
    for i, start in enumerate(starts_mib):
        t0 = 1000.0 * i
        b.step(i + 1, t0, 1000)
        b.memory(t0 + 1, start * MIB, 0, (start * MIB) - level)  # the level the step works from
        b.memory(t0 + 400, (start + rise_mib) * MIB, 0, rise_mib * MIB)
        b.memory(t0 + 600, start * MIB, 0, -rise_mib * MIB)
        level = start * MIB
    path = b.write(tmp_path / "rank0.trace.json")
    return load_traces([path], cache=False), list(range(1, len(starts_mib) + 1))


def test_steady_level_rises_by_what_the_step_allocates(tmp_path: Path) -> None:
    traces, steps = _run(tmp_path, [10, 10, 10, 10], rise_mib=6)
    levels = step_levels(traces, steps)
    assert levels["peak_bytes"].tolist() == [16 * MIB] * 4
    # The first step has no sample before it: it starts from its first sample.
    assert levels["start_bytes"].tolist() == [10 * MIB] * 4
    assert step_rise_bytes(levels) == 6 * MIB
    assert drift_bytes(levels) is None


def test_climbing_level_is_drift_and_the_rise_ignores_it(tmp_path: Path) -> None:
    traces, steps = _run(tmp_path, [1, 10, 20, 30], rise_mib=6)
    levels = step_levels(traces, steps)
    # Levels entering steps 2..4 are those the previous step ended at.
    assert levels["start_bytes"].tolist() == [1 * MIB, 1 * MIB, 10 * MIB, 20 * MIB]
    assert levels["peak_bytes"].tolist() == [7 * MIB, 16 * MIB, 26 * MIB, 36 * MIB]
    assert drift_bytes(levels) == 19 * MIB  # from the second step's start to the last's
    assert step_rise_bytes(levels) == int((15 + 16) / 2 * MIB)  # median of 6, 15, 16, 16


def test_no_samples_no_numbers(tmp_path: Path) -> None:
    path = TraceBuilder(rank=0).step(1, 0, 100).step(2, 100, 100).cpu_op("aten::mm", 10, 5).write(tmp_path / "r.json")
    levels = step_levels(load_traces([path], cache=False), [1, 2])
    assert levels.empty and step_rise_bytes(levels) is None and drift_bytes(levels) is None
