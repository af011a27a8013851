"""The bound's de-profiler checked phase by phase against the timers (fsdpviz/analysis/bound_phases.py).

Truth from outside the rule: the recorder's timers on the shared H200 recording of model B, whose
profiled steps ran the forward 43.0 ms against 24.1 in the clean ones and the backward 54.3 against 54.3
(../shared/traces/gpu-h200/README.md, docs/whatif.md "Out of sample"): the profiler did not slow B's
backward, so a rule that takes its share out of every wait on the host in proportion takes too much out
of the backward and too little out of the forward. And a construction: time moved in the timers from
the clean steps' backward to their forward, which the trace does not hold, moves the check by exactly
that time and nothing else.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fsdpviz.analysis.bound_phases import REST, BoundPhaseCheck, bound_phase_check
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.runfolder import RunInfo
from fsdpviz.structure.profiler_cost import phase_times
from fsdpviz.trace.loader import load_traces

H200 = Path(__file__).resolve().parents[3] / "shared" / "traces" / "gpu-h200"
SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MOVED_MS = 3.0

needs_h200 = pytest.mark.skipif(not (H200 / "B").is_dir(), reason="needs ../shared/traces/gpu-h200")


def _check(folder: Path) -> BoundPhaseCheck | None:
    return bound_phase_check(analyse([folder], cache=False, progress=False))


def _timers(folder: Path) -> tuple[pd.DataFrame, RunInfo | None]:
    traces = load_traces([folder], cache=False, progress=False)
    return traces.timers, traces.run


@needs_h200
def test_the_rule_takes_from_the_backward_what_the_profiler_did_not_slow_there() -> None:
    check = _check(H200 / "B")
    assert check is not None and check.ranks == 1 and check.spilled_ms == 0.0
    assert set(check.miss_pct) == {"forward", "backward", REST}
    # the timers saw no backward slow-down (0.06 ms): the rule's take from the backward's waits is its miss,
    # about 15 ms of the 87.3 ms step; the forward lost 18.9 ms, more than its waits' share
    assert 10.0 < check.miss_pct["backward"] < 25.0
    assert check.miss_pct["forward"] < 0.0
    assert check.error_pct == abs(check.miss_pct["backward"])


@needs_h200
def test_time_moved_in_the_clean_steps_timers_moves_the_check_by_that_time(tmp_path: Path) -> None:
    moved = tmp_path / "B"
    shutil.copytree(H200 / "B", moved, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    run = json.loads((moved / "run.json").read_text())
    profiled = set(run["ranks"][0]["profiled_steps"])
    path = moved / "timers" / "rank0.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for r in rows:
        if r["unit"] == "" and r["kind"] == "total" and r["step"] not in profiled \
                and r["phase"] in ("forward", "backward"):
            r["ms"] += MOVED_MS if r["phase"] == "forward" else -MOVED_MS
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    before, after = _check(H200 / "B"), _check(moved)
    assert before is not None and after is not None
    # the clean step the misses are shares of, which the move leaves as it was
    step = phase_times(*_timers(moved))[0].unprofiled["step"]
    assert step == phase_times(*_timers(H200 / "B"))[0].unprofiled["step"] == pytest.approx(87.3, abs=0.1)
    expected = 100.0 * MOVED_MS / step
    # the clean forward is longer: the timers saw less leave it, so the rule's take misses by more
    assert after.miss_pct["forward"] - before.miss_pct["forward"] == pytest.approx(expected, abs=0.02)
    assert after.miss_pct["backward"] - before.miss_pct["backward"] == pytest.approx(-expected, abs=0.02)
    assert after.miss_pct[REST] == pytest.approx(before.miss_pct[REST], abs=0.01)


def test_a_cpu_run_is_not_checked_here() -> None:
    # one factor for the whole step on a CPU rank: the replay's calibration, checked by the replay's check.
    # The sample's timers did time its phases in clean steps: it is the device that leaves it out
    sample = SAMPLES / "fsdp2-cpu-2rank"
    assert set(phase_times(*_timers(sample))) == {0, 1}
    assert _check(sample) is None
