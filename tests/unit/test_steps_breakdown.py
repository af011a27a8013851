"""The report's "where each rank's traced step went": its bars add up to each rank's traced step.

The traced step of a rank is the mean of its analysed ProfilerStep spans, read here from the trace
files with plain JSON; the bars (the units' compute, the time in FSDP's / ZeRO's ranges, the optimizer,
the rest) are each rank's means over the same steps. Medians per part, as the chart had them, added up
to neither (on a 4-rank FSDP1 run, 476-513 ms against steps of 481-494 ms).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.rawfiles import raw_trace

from fsdpviz.report.steps.data import STEP_PARTS, step_breakdown

SAMPLES = Path(__file__).parents[2] / "sample_traces"


@pytest.mark.parametrize("sample", ["fsdp2-cpu-2rank", "fsdp1-cpu-2rank", "zero3-cpu-2rank"])
def test_the_bars_add_up_to_each_ranks_traced_step(sample: str, sample_run: Callable[[str], Any]) -> None:
    result = sample_run(sample)
    bars = step_breakdown(result.analysis.step_times)
    assert set(bars["part"]) == {label for _, label in STEP_PARTS}
    traces = sorted((SAMPLES / sample / "traces").glob("rank*.trace.json*")) or sorted(
        (SAMPLES / sample).glob("rank*.trace.json*"))
    assert len(traces) == len(set(bars["rank"])) == 2
    for path in traces:
        rank = int(path.name.removeprefix("rank").split(".")[0])
        raw = raw_trace(path)
        traced_ms = statistics.mean(raw.step_ms(s) for s in result.summary.steps)
        assert bars[bars["rank"] == rank]["ms"].sum() == pytest.approx(traced_ms, abs=1e-3), rank
