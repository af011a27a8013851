"""A rank that ends inside a profiled step leaves that step in its trace, cut short: the profiler
began it at the end of the step before. Two real failures at the top of a step -- an exception after
an optimizer step, and a data loader that raises before the step's forward -- are recorded with the
profiled steps 2-4, and the cut step must be left out with a note, never analysed as complete.

The truth is outside the analysis: the trace holds the cut ``ProfilerStep#N`` (the profiler recorded
it), the rank's own timers hold no whole-step record for it (the step never finished), and the
traced step time lies among the durations of the complete steps in the raw traces.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers.jobs import record_env, torchrun
from recording import SCRIPTS, record

TINY = ("--layers", "2", "--dim", "32", "--steps", "8")
# script, its argument, the step rank 0 ends inside: failing_train.py raises after optimizer step 2,
# at the top of step 3; failing_loader_train.py raises fetching the batch of step 4
CASES = {"exception": ("failing_train.py", "2", 3), "data loader": ("failing_loader_train.py", "4", 4)}


def _steps_in_trace(run_dir: Path, rank: int) -> dict[int, float]:
    """ProfilerStep#N -> its duration in ms, read from the raw trace."""
    with gzip.open(run_dir / "traces" / f"rank{rank}.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    return {int(e["name"].split("#")[1]): e["dur"] / 1000 for e in events
            if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"}


def _finished_steps(run_dir: Path, rank: int) -> set[int]:
    records = [json.loads(line) for line in (run_dir / "timers" / f"rank{rank}.jsonl").read_text().splitlines()]
    return {r["step"] for r in records if r["unit"] == "" and r["phase"] == "step" and r["kind"] == "total"
            and not r.get("partial")}


def _check_cut_step_left_out(run_dir: Path, cut: int) -> Any:
    from fsdpviz.analysis.pipeline import analyse

    result = analyse([run_dir], cache=False, progress=False)
    for rank in (0, 1):
        analysed = result.selection.of(rank)
        assert analysed is not None and cut not in analysed.steps
        assert set(analysed.steps) == {s for s in (2, 3, 4) if s < cut}
    assert cut not in result.summary.steps
    assert any(f"step {cut} (cut short) is not analysed" in n for n in result.summary.notes), result.summary.notes
    return result


@pytest.mark.slow
@pytest.mark.lifecycle
@pytest.mark.parametrize("case", list(CASES))
def test_a_step_a_rank_ended_inside_is_not_analysed(case: str, tmp_path: Path) -> None:
    script, argument, cut = CASES[case]
    run_dir = tmp_path / "run"
    proc = record(run_dir, torchrun(SCRIPTS / script, argument, *TINY), "--warmup", "2", env=record_env())
    assert proc.returncode != 0
    run = json.loads((run_dir / "run.json").read_text())
    # GIVEN the truth: rank 0's trace holds the cut step, and its timers say the step never finished
    traced = _steps_in_trace(run_dir, 0)
    assert cut in traced and cut not in _finished_steps(run_dir, 0) and cut - 1 in _finished_steps(run_dir, 0)
    # THEN run.json names the step each rank ended inside
    assert [r["partial_step"] for r in run["ranks"]] == [cut, cut]
    # AND the analysis leaves it out, says so, and times only complete steps
    result = _check_cut_step_left_out(run_dir, cut)
    complete = [ms for rank in (0, 1) for step, ms in _steps_in_trace(run_dir, rank).items() if 2 <= step < cut]
    traced_ms = result.summary.traced_step_time_ms
    assert traced_ms is not None and min(complete) - 0.01 <= traced_ms <= max(complete) + 0.01

    # WHEN run.json is as the recorder before partial_step covered the top of a step wrote it (the
    # cut step listed as profiled, no partial step): the count of steps each rank completed tells
    older = tmp_path / "older"
    shutil.copytree(run_dir, older)
    for rank_info in run["ranks"]:
        rank_info["partial_step"] = None
        rank_info["profiled_steps"] = sorted(set(rank_info["profiled_steps"]) | {cut})
        assert rank_info["steps_seen"] == cut
    (older / "run.json").write_text(json.dumps(run))
    _check_cut_step_left_out(older, cut)
