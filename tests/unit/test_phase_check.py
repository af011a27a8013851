"""The replay's out-of-sample check (``clock.phase_miss_pct``, fsdpviz/replay/phases.py), against answers
known by construction.

The bundled FSDP2 CPU sample's timers time the step's phases in every step (its recorder predates the
unit-timed steps). Moving time from the backward to the forward of its unprofiled steps, each step's
length kept, changes nothing the trace or the clean steps' lengths hold: the replay, its factor and its
miss of the clean step stay as they were, and the check moves by exactly the time moved, the forward's
miss up and the backward's down. A check that read the trace or the steps' lengths alone could not move.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.whatif.gains import completed_summary

SAMPLES = Path(__file__).parents[2] / "sample_traces"
RECORDED = Path(__file__).parents[2] / "tests" / "recorded"
MOVED_MS = 2.0


def _unprofiled_steps(run: dict, rank: int) -> set[int]:
    """The steps the check reads, from run.json alone: after the first two, neither profiled nor the
    profiler's warm-up before them nor the step after them."""
    info = next(r for r in run["ranks"] if r["rank"] == rank)
    profiled = info.get("profiled_steps") or run["profile"]["steps"]
    return set(range(2, info["timer_steps"])) - {*profiled, min(profiled) - 1, max(profiled) + 1}


def _move(folder: Path, ms: float) -> None:
    """Move ``ms`` of every unprofiled step's backward to its forward, on every rank, in the timers."""
    run = json.loads((folder / "run.json").read_text())
    for path in sorted((folder / "timers").glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        steps = _unprofiled_steps(run, rank)
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        moved = 0
        for r in rows:
            if r["unit"] == "" and r["kind"] == "total" and r["step"] in steps and r["phase"] in ("forward", "backward"):
                r["ms"] += ms if r["phase"] == "forward" else -ms
                moved += 1
        assert moved == 2 * len(steps)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _clock(folder: Path) -> tuple[dict, float]:
    result = analyse([folder], cache=False, progress=False)
    summary = completed_summary(result)
    assert summary.clock is not None and summary.step_time_ms is not None
    return {f: getattr(summary.clock, f) for f in summary.clock.__struct_fields__}, summary.step_time_ms


def test_the_check_reads_what_the_trace_does_not_hold(tmp_path: Path) -> None:
    original = tmp_path / "original"
    moved = tmp_path / "moved"
    for folder in (original, moved):
        shutil.copytree(SAMPLES / "fsdp2-cpu-2rank", folder, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    _move(moved, MOVED_MS)
    before, step = _clock(original)
    after, step_after = _clock(moved)
    assert before["phase_steps"] == after["phase_steps"] == 4  # steps 6-9 of both ranks
    # the clean-step check and everything it rests on did not move: it cannot see where the time sat
    assert step_after == step
    assert after["replay_error_pct"] == before["replay_error_pct"]
    # the out-of-sample check moved by exactly what was moved, in % of each rank's unprofiled step
    # (the two ranks' steps: 24.6 and 25.5 ms; the miss is the median over the ranks)
    shift_forward = after["phase_miss_pct"]["forward"] - before["phase_miss_pct"]["forward"]
    shift_backward = after["phase_miss_pct"]["backward"] - before["phase_miss_pct"]["backward"]
    expected = 100.0 * MOVED_MS / step
    assert shift_forward == pytest.approx(expected, rel=0.05)
    assert shift_backward == pytest.approx(-expected, rel=0.05)
    assert after["phase_miss_pct"]["optimizer"] == before["phase_miss_pct"]["optimizer"]
    assert after["phase_error_pct"] == max(abs(v) for v in after["phase_miss_pct"].values())
    assert f"up to {after['phase_error_pct']:.1f} % of the step" in after["note"]


def test_a_recording_without_timed_unprofiled_phases_says_so() -> None:
    """The example recording made with the recorder's defaults: its one unit-timed step follows the
    trace export, and its other unprofiled steps time only their ends (run.json's kinds of step)."""
    folder = RECORDED / "example-fsdp2" / "run"
    run = json.loads((folder / "run.json").read_text())
    assert run["profile"]["unit_timed_steps"] == [max(run["profile"]["steps"]) + 1]
    clock, _ = _clock(folder)
    assert clock["basis"] == "replayed"
    assert clock["phase_error_pct"] is None and clock["phase_miss_pct"] is None and clock["phase_steps"] is None
    assert "record with --unit-timer-steps 2 or more" in clock["note"]
