"""compare's "where the time went": the training threads' parts of the two steps add up to the difference
they are said beside, on the clock they are said on. On a CPU rank the rank's factor moves them to the
run's clock, so they add up to the difference of the headline steps; on a GPU they are host work the
profiler slowed and stay as traced, so they add up to the difference of the traced steps and say so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsdpviz.analysis.compare.findings import step_parts
from fsdpviz.analysis.compare.runs import compare_runs
from fsdpviz.report.compare.build import load_runs

RECORDED = Path(__file__).parents[1] / "recorded"
# the names the report's step chart gives the same parts (its legend), one name per quantity
PART = re.compile(r"(units' compute|in FSDP's / ZeRO's ranges|optimizer|other \(data, loss, Python\)) "
                  r"([+-]\d+\.\d+) ms")


def _step_finding(folders: list[Path]) -> tuple[str, list[float], list[float]]:
    c = compare_runs(load_runs(folders, [f"run{i}" for i in range(len(folders))], cache=False))
    (finding,) = [f for f in c.findings if f.kind == "step_time"]
    return (finding.message, [r.summary.step_time_ms for r in c.runs],
            [r.summary.traced_step_time_ms for r in c.runs])


def _parts_ms(message: str) -> float:
    text = message.split(":", 2)[-1].split("(exposed communication")[0]
    parts = [float(v) for _, v in PART.findall(text)]
    assert parts, message
    return sum(parts)


def test_cpu_parts_add_up_to_the_headline_difference() -> None:
    # two committed CPU recordings of one model, per block and with each pair of blocks one unit (a list
    # sharded together), on the timers' clock; the parts the finding says where it names a faster run (which
    # it does only where the steps are apart beyond their spread, as these copies' steps were recorded)
    runs = load_runs([RECORDED / "example-fsdp2" / "run", RECORDED / "fsdp2-pair-list" / "run"], ["a", "b"],
                     cache=False)
    text = step_parts(runs[0], runs[1])
    assert "as traced" not in text
    steps = [r.summary.step_time_ms for r in runs]
    # each part is shown to 0.01 ms, and parts under 0.05 ms are left out
    parts = [float(v) for _, v in PART.findall(text.split("(exposed communication")[0])]
    assert parts and sum(parts) == pytest.approx(steps[0] - steps[1], abs=0.1)


def test_gpu_parts_are_the_traced_steps_and_say_so(gpu_h200_dir: Path) -> None:
    # model B on an H200 wrapped per block and as one unit: the profiler slowed the two steps differently
    message, steps, traced = _step_finding([gpu_h200_dir / "B", gpu_h200_dir / "Broot"])
    assert "as traced" in message and "Where the" not in message
    assert abs(_parts_ms(message)) == pytest.approx(abs(traced[0] - traced[1]), abs=0.1)
    assert abs(traced[0] - traced[1]) != pytest.approx(abs(steps[0] - steps[1]), abs=0.5)
