"""Which step time a run leads with: the timers' clean unprofiled steps, or the traced step.

Synthetic run folders (tests/synth: traces whose step length is known by construction) with
hand-written ``timers/rank{R}.jsonl``: every step's wall time is chosen here, so the step the
headline must show is known before fsdpviz reads a byte. The traced steps last a few ms, the timed
ones tens of ms: a headline from the wrong side cannot pass for the right one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synth import Scenario, generate_run, make_units

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.analysis.summary import Summary

SLOW_START = [900.0, 70.0]  # steps 0 and 1: allocation, caches


def _run(tmp_path: Path, profiled: tuple[int, ...], step_ms: dict[int, list[float]]) -> tuple[Summary, float]:
    """A 2-rank run folder whose trace holds ``profiled`` and whose timers say ``step_ms`` (rank ->
    the wall time of steps 0, 1, ...); its summary and the traced step length (ms) by construction."""
    synth = generate_run(Scenario(units=make_units(2), steps=profiled), tmp_path / "run", run_folder=True)
    (synth.folder / "timers").mkdir()
    for rank, times in step_ms.items():
        lines = [json.dumps({"rank": rank, "step": step, "unit": "", "phase": "step", "kind": "total", "ms": ms,
                             "n": 1}) for step, ms in enumerate(times)]
        (synth.folder / "timers" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    steps = synth.expected.steps
    traced_ms = float((steps["end_ns"] - steps["start_ns"]).mean()) / 1e6
    return analyse([synth.folder], cache=False, progress=False).summary, traced_ms


def _leads_with_the_trace(summary: Summary, traced_ms: float, why: str) -> None:
    from fsdpviz.commands.summary import step_time_text

    assert summary.step_time_source == "trace"
    assert summary.step_time_ms == pytest.approx(traced_ms, abs=1e-3)
    assert step_time_text(summary) == f"{summary.step_time_ms:,.2f} ms (as traced)"  # the terminal's line
    (note,) = [n for n in summary.notes if "the step time is the traced one" in n]
    assert why in note
    as_json = summary.to_json()
    assert as_json["step_time_ms"] == summary.step_time_ms and why in " ".join(as_json["notes"])


def test_steps_timed_before_the_profiled_window_lead(tmp_path: Path) -> None:
    # GIVEN the default schedule: steps 2-4 timed unprofiled, 5 the profiler's warm-up, 6-8
    # profiled, 9 right after the trace export (slow: it pays for the export)
    summary, traced_ms = _run(tmp_path, (6, 7, 8), {
        0: [*SLOW_START, 20, 22, 21, 40, 30, 31, 32, 95],
        1: [*SLOW_START, 24, 26, 25, 45, 36, 35, 34, 120],
    })
    # THEN the headline is the median of steps 2-4, median over ranks (21 and 25)
    assert summary.step_time_source == "timers" and summary.step_time_ms == pytest.approx(23.0)
    cost = summary.profiler
    assert cost is not None and cost.headline and cost.note is None
    assert cost.unprofiled_steps == [2, 3, 4] and cost.left_out_steps == [0, 1, 5, 9]
    # the profiled step is the traced one (one figure for the traced step), the slowdown its ratio to the headline
    assert cost.profiled_step_ms == pytest.approx(traced_ms, abs=1e-3)
    assert cost.slowdown == pytest.approx(traced_ms / 23, abs=1e-3)
    assert summary.traced_step_time_ms == pytest.approx(traced_ms, abs=1e-3)
    assert not [n for n in summary.notes if "traced one" in n]


def test_a_slow_step_after_the_export_never_leads(tmp_path: Path) -> None:
    # GIVEN the old schedule on a 6-step script: profiled 2-4, and step 5 the only other one, slow
    # because the trace was just written (the recorded fsdp1 sample's shape: 0.56x)
    summary, traced_ms = _run(tmp_path, (2, 3, 4), {
        0: [*SLOW_START, 39, 29, 110, 56],
        1: [*SLOW_START, 39, 29, 102, 84],
    })
    # THEN no step is left to compare with: the traced step leads and a note says why
    assert summary.profiler is None and summary.to_json()["profiler"] is None
    _leads_with_the_trace(summary, traced_ms, "no clean unprofiled step")


def test_one_unprofiled_step_is_too_few(tmp_path: Path) -> None:
    # GIVEN profiled 2-4, step 5 after the export, then only step 6
    summary, traced_ms = _run(tmp_path, (2, 3, 4), {
        0: [*SLOW_START, 30, 30, 30, 80, 20],
        1: [*SLOW_START, 33, 33, 33, 90, 22],
    })
    # THEN the profiler's numbers are still reported, but the headline is the traced step
    cost = summary.profiler
    assert cost is not None and not cost.headline and cost.fewest_unprofiled_steps == 1
    assert cost.unprofiled_steps == [6] and cost.unprofiled_step_ms == pytest.approx(21.0)
    assert cost.slowdown == pytest.approx(traced_ms / 21, abs=1e-3)
    _leads_with_the_trace(summary, traced_ms, "timed 1 clean unprofiled step(s)")
    assert summary.to_json()["profiler"]["note"] == cost.note
    assert not [f for f in summary.findings if f.kind == "profiler"]  # a 1.5x from one step is not said
    # one clock: the bound splits the traced step too
    assert summary.bound is None or (summary.bound.basis == "traced" and summary.bound.step_ms == summary.step_time_ms)


def test_two_unprofiled_steps_lead(tmp_path: Path) -> None:
    # GIVEN profiled 2-4, step 5 after the export, then steps 6 and 7 (what the shared H100 recordings have)
    summary, _ = _run(tmp_path, (2, 3, 4), {
        0: [*SLOW_START, 30, 30, 30, 80, 20, 20],
        1: [*SLOW_START, 33, 33, 33, 90, 22, 22],
    })
    # THEN the headline is their median over ranks (21 ms), and the bound splits that step
    cost = summary.profiler
    assert cost is not None and cost.headline and cost.fewest_unprofiled_steps == 2
    assert summary.step_time_ms == pytest.approx(21.0) and summary.step_time_source == "timers"
    assert summary.bound is None or summary.bound.step_ms == pytest.approx(21.0)


def test_profiled_steps_faster_than_the_clean_ones_leave_the_clean_steps_leading(tmp_path: Path) -> None:
    # GIVEN profiled steps at 16 ms and clean unprofiled steps at 20 and 21 ms: a 0.78x "slowdown" by the
    # timers, the machine's pace changed between the two windows (the clean steps are most of the run)
    summary, traced_ms = _run(tmp_path, (2, 3, 4), {
        0: [*SLOW_START, 16, 16, 16, 50, 20, 20, 20],
        1: [*SLOW_START, 16, 16, 16, 50, 21, 21, 21],
    })
    from fsdpviz.commands.summary import step_time_text

    cost = summary.profiler
    # THEN the clean steps lead (20.5 ms, median over ranks), as the script's own timer saw the run
    assert cost is not None and cost.headline and cost.note is None
    assert summary.step_time_source == "timers" and summary.step_time_ms == pytest.approx(20.5)
    # the timers' own profiled steps decide it (one clock on both sides), and a note says their ratio
    (note,) = [n for n in summary.notes if "shorter than the clean unprofiled ones" in n]
    assert "shorter than the clean" in note and "pace changed" in note and "3 or more on each rank" in note
    # one slowdown figure: the step line's (the traced step over the clean one), not a second in the note
    assert "x as long" not in note and f"{cost.slowdown:.2f}x as long" in step_time_text(summary)
    assert note in summary.to_json()["notes"] and summary.to_json()["profiler"]["pace_note"] == note
    # the profiler's share is not known: null in every view, not the excess of a window run faster
    assert cost.share_ms is None
    from fsdpviz.whatif.gains import completed_summary

    clock = completed_summary(analyse([tmp_path / "run"], cache=False, progress=False)).clock
    assert clock is not None and clock.profiler_share_ms is None
    # one clock: the bound splits the clean step, which the traced parts are carried to
    bound = summary.bound
    assert bound is not None and bound.basis == "unprofiled" and bound.step_ms == pytest.approx(20.5)
    assert bound.profiler_share_ms is None
    assert summary.traced_step_time_ms == pytest.approx(traced_ms, abs=1e-3)


def test_one_rank_short_of_steps_is_enough_to_fall_back(tmp_path: Path) -> None:
    # GIVEN rank 1 stopped timing earlier than rank 0 (4 clean steps against 1)
    summary, traced_ms = _run(tmp_path, (2, 3, 4), {
        0: [*SLOW_START, 30, 30, 30, 80, 20, 20, 20, 20],
        1: [*SLOW_START, 30, 30, 30, 80, 20],
    })
    assert summary.profiler is not None and summary.profiler.fewest_unprofiled_steps == 1
    _leads_with_the_trace(summary, traced_ms, "rank 1 timed 1")


def test_a_run_that_failed_before_its_clean_steps_says_so(tmp_path: Path) -> None:
    # GIVEN profiled 2-4, and a rank that raised in step 5 (run.json, as the recorder writes a failed run)
    synth = generate_run(Scenario(units=make_units(2), steps=(2, 3, 4)), tmp_path / "run", run_folder=True)
    (synth.folder / "timers").mkdir()
    for rank in (0, 1):
        lines = [json.dumps({"rank": rank, "step": step, "unit": "", "phase": "step", "kind": "total", "ms": ms,
                             "n": 1}) for step, ms in enumerate([*SLOW_START, 30, 30, 30])]
        (synth.folder / "timers" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    run_json = synth.folder / "run.json"
    facts = json.loads(run_json.read_text())
    facts.update(status="failed", exit_code=1, reason="command exited with code 1; rank 1: RuntimeError: boom")
    for rank in facts["ranks"]:
        rank.update(status="failed", steps_seen=5, partial_step=5)
    run_json.write_text(json.dumps(facts))
    summary = analyse([synth.folder], cache=False, progress=False).summary
    # THEN the note says the run stopped, with run.json's reason: more steps would not have helped it
    (note,) = [n for n in summary.notes if "the step time is the traced one" in n]
    assert "the run failed after 5 step(s) (run.json: command exited with code 1; rank 1: RuntimeError: boom)" in note
    # run.json cannot tell a stop in the loop from one after it: the advice for a short run follows
    assert note.index("the run failed") < note.index("record at least")
    # a run that ended well was only too short
    facts.update(status="ok", exit_code=0, reason="")
    run_json.write_text(json.dumps(facts))
    summary = analyse([synth.folder], cache=False, progress=False).summary
    (note,) = [n for n in summary.notes if "the step time is the traced one" in n]
    assert "record at least" in note and "the run failed" not in note
