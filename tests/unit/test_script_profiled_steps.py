"""The steps a script's own torch.profiler was on in (run.json ``ranks[].script_profiled_steps``) are
never clean steps, on the rank that ran it and no other: the step time, compare's step-to-step spread and
the units' timed passes leave them out. The committed FSDP2 recording of the example, with a rank's
steps marked in its run.json (the input); its clean steps as the recorder's agent saw them (run.json's
``observer.clean_steps``) are the truth before the mark."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from fsdpviz.analysis.compare.spread import step_values_ms
from fsdpviz.analysis.pipeline import LabelledRun, analyse
from fsdpviz.structure.profiler_cost import clean_step_rows, profiler_cost, unit_pass_steps, whole_step_times

RUN = Path(__file__).parents[1] / "recorded" / "example-fsdp2" / "run"


def _by_rank(rows: pd.DataFrame) -> dict[int, list[int]]:
    return {int(r): sorted({int(s) for s in g["step"]}) for r, g in rows.groupby("rank")}


def test_a_step_the_script_profiled_on_one_rank_is_not_clean_there(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(RUN, run_dir, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    doc = json.loads((run_dir / "run.json").read_text())
    observed = {r["rank"]: r["observer"]["clean_steps"] for r in doc["ranks"]}
    unit_timed = doc["profile"]["unit_timed_steps"]
    before = analyse([run_dir], cache=False).traces
    assert _by_rank(clean_step_rows(before.timers, before.run)) == observed
    assert observed[0] == observed[1] and len(observed[0]) == 4
    marked = observed[0][1]
    # GIVEN rank 0's script profiling a clean step and the unit-timed step
    doc["ranks"][0]["script_profiled_steps"] = [unit_timed[0], marked]
    (run_dir / "run.json").write_text(json.dumps(doc))
    result = analyse([run_dir], cache=False)
    after = result.traces
    # THEN rank 0 alone loses them: its clean steps, the cost's left-out steps, its units' timed passes
    clean = _by_rank(clean_step_rows(after.timers, after.run))
    assert clean == {0: [s for s in observed[0] if s != marked], 1: observed[1]}
    cost = profiler_cost(after.timers, after.run)
    assert cost is not None and marked in cost.left_out_steps and marked in cost.unprofiled_steps  # rank 1's
    passes = _by_rank(unit_pass_steps(after.timers, after.run))
    assert passes == {1: unit_timed}
    assert _by_rank(unit_pass_steps(before.timers, before.run)) == {0: unit_timed, 1: unit_timed}
    # AND the step-to-step spread reads the steps clean on both ranks: the marked one is not among them,
    # and each is the median (2 ranks: the mean) of the two ranks' timed steps
    ms = whole_step_times(after.timers).set_index(["rank", "step"])["ms"]
    values = step_values_ms(LabelledRun(label="run", source=str(run_dir), result=result), "step_time_ms")
    assert values is not None and sorted(values.index) == [s for s in observed[0] if s != marked]
    for step, value in values.items():
        assert value == (ms[(0, step)] + ms[(1, step)]) / 2
