"""compare stars no overlap change within the runs' own step-to-step spread.

The overlap of two real CPU recordings (the FSDP2 and ZeRO-3 samples: FSDP2's training thread waits
out every collective, ZeRO-3's computes beside a few) differs by a fraction of a point, and ZeRO-3's
steps differ more among themselves. The spread's truth is each step analysed on its own
(``analyse(..., steps=[N])``: the whole-step overlap of that step alone, per rank, then the median
over ranks), not the per-step table the comparison reads; a star needs a difference beyond both
runs' spreads, and a timed row whose spread is not measured (idle) gets none.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from fsdpviz.analysis.compare.runs import compare_runs, comparison_json
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.commands.compare_table import headline_rows
from fsdpviz.report.compare.build import load_runs

SAMPLES = Path(__file__).parents[2] / "sample_traces"
RUNS = ["fsdp2-cpu-2rank", "zero3-cpu-2rank"]


def _spread_points_truth(path: Path, steps: list[int]) -> float:
    per_step = []
    for step in steps:
        ranks = analyse([path], steps=[step], cache=False, progress=False).summary.overlap.per_rank
        per_step.append(statistics.median(r.overlap_pct for r in ranks.values() if r.overlap_pct is not None))
    return max(per_step) - min(per_step)


@pytest.fixture(scope="module")
def comparison():  # type: ignore[no-untyped-def]
    return compare_runs(load_runs([SAMPLES / r for r in RUNS], RUNS, cache=False))


def test_overlap_spread_is_the_steps_own(comparison) -> None:  # type: ignore[no-untyped-def]
    spreads = comparison.spread_points["overlap.overlap_pct"]
    for name, run, spread in zip(RUNS, comparison.runs, spreads):
        assert spread == pytest.approx(_spread_points_truth(SAMPLES / name, list(run.summary.steps)), abs=0.05)


def test_overlap_star_only_beyond_both_spreads(comparison) -> None:  # type: ignore[no-untyped-def]
    values = comparison.values["overlap.overlap_pct"]
    spreads = comparison.spread_points["overlap.overlap_pct"]
    beyond = abs(values[1] - values[0]) > max(spreads)
    assert bool(comparison.best["overlap.overlap_pct"]) == beyond
    if not beyond:  # the samples: 0.46 points apart, ZeRO-3's steps 2.5 points apart
        why = comparison.best_withheld["overlap.overlap_pct"]
        assert "within the runs' step-to-step spread" in why and "points" in why
        row = next(r for r in headline_rows(comparison) if r[0] == "overlap")
        assert "*" not in "".join(row[1:]) and "points" in row[1]
    # the change against the first run is a difference of two shares: said in points
    row = next(r for r in headline_rows(comparison) if r[0] == "overlap")
    assert f"{values[1] - values[0]:+.1f} points" in row[2] and "%," not in row[2].split("(", 1)[1]
    assert comparison_json(comparison)["spread_points"]["overlap.overlap_pct"] == spreads
    # idle has no per-step values: no star, and why
    assert comparison.best["overlap.idle_ms"] == []
    assert "not measured" in comparison.best_withheld["overlap.idle_ms"]
