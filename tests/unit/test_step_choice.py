"""Which steps are analysed: every step the trace holds complete (fsdpviz's own recordings), the
safe rule of dropping the last step where completeness cannot be shown (traces from elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.kineto import MAIN_TID, PID, TraceBuilder, launch

from fsdpviz.analysis.pipeline import analyse_traces
from fsdpviz.structure.steps import select_steps
from fsdpviz.trace import load_traces

STEPS = (2, 3, 4)


def _gpu_trace(rank: int, *, cut_last: bool = False) -> TraceBuilder:
    """Three 1 ms steps, each launching two kernels; ``cut_last``: the last step's second launch has
    no kernel in the trace (the profiler stopped before it ran)."""
    b = TraceBuilder(rank=rank)
    for i, step in enumerate(STEPS):
        t0 = 1000.0 * i
        b.step(step, t0, 1000)
        b.kernel("gemm", t0 + 100, 200, launch_us=t0 + 10)
        if cut_last and step == STEPS[-1]:
            b.events.append(launch(999, PID, MAIN_TID, t0 + 20))
        else:
            b.kernel("ncclDevKernel_AllGather_RING_LL", t0 + 300, 200, stream=24, launch_us=t0 + 20)
    return b


def _run_folder(tmp: Path, *, cut_last: bool = False, partial_step: int | None = None,
                schedule: str = "optimizer_steps") -> Path:
    (tmp / "traces").mkdir(parents=True)
    for rank in (0, 1):
        _gpu_trace(rank, cut_last=cut_last and rank == 1).write(tmp / "traces" / f"rank{rank}.trace.json")
    run = {"framework": "fsdp2", "world_size": 2, "units": [],
           "profile": {"schedule": schedule, "steps": list(STEPS)},
           "ranks": [{"rank": r, "profiled_steps": list(STEPS), "partial_step": partial_step if r == 0 else None}
                     for r in (0, 1)]}
    (tmp / "run.json").write_text(json.dumps(run))
    return tmp


def test_fsdpviz_recording_analyses_every_profiled_step(tmp_path: Path) -> None:
    traces = load_traces([_run_folder(tmp_path)], cache=False)
    selection = select_steps(traces)
    assert selection.steps == list(STEPS) and not selection.dropped and not selection.notes
    assert analyse_traces(traces).summary.to_json()["steps"] == list(STEPS)


def test_a_last_step_whose_kernels_are_missing_is_dropped_and_said(tmp_path: Path) -> None:
    traces = load_traces([_run_folder(tmp_path, cut_last=True)], cache=False)
    selection = select_steps(traces)
    assert selection.of(0).steps == STEPS and selection.of(1).steps == STEPS[:-1]
    assert selection.dropped == {1: (4,)}
    assert selection.notes == [("step 4 (cut short) is not analysed on rank(s) 1: 1 GPU kernels or copies "
                             "launched in it are not in the trace")]


def test_the_step_a_failing_rank_stopped_in_is_dropped(tmp_path: Path) -> None:
    traces = load_traces([_run_folder(tmp_path, partial_step=4)], cache=False)
    selection = select_steps(traces)
    assert selection.dropped == {0: (4,)} and selection.of(1).steps == STEPS
    assert "the rank stopped inside it" in selection.notes[0]


@pytest.mark.parametrize("schedule", ["time_window", None])
def test_without_fsdpviz_schedule_the_last_step_is_dropped(tmp_path: Path, schedule: str | None) -> None:
    if schedule is None:  # plain traces, no run folder
        for rank in (0, 1):
            _gpu_trace(rank).write(tmp_path / f"rank{rank}.trace.json")
        traces = load_traces([tmp_path], cache=False)
    else:
        traces = load_traces([_run_folder(tmp_path, schedule=schedule)], cache=False)
    selection = select_steps(traces)
    assert selection.steps == list(STEPS[:-1]) and selection.dropped == {0: (4,), 1: (4,)}
    assert selection.notes == [("step 4 (cut short) is not analysed: the trace cannot show that the profiler "
                             "recorded it to its end")]
    assert select_steps(traces, include_last_step=True).steps == list(STEPS)
    assert select_steps(traces, steps=[4]).steps == [4]
