"""Per-unit analysis on real GPU traces without FSDP labels (DDP / recommendation jobs): it must
say there are no units, keep the whole-step tables, and not invent clock shifts or stragglers."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsdpviz.analysis.run import analyse_run
from fsdpviz.trace import load_traces, schema


# The DDP jobs (their traces hold DistributedDataParallel.forward ranges) are named as such.
@pytest.mark.parametrize(("name", "framework"), [("trace_filter", "ddp"), ("nccl_parser_config", "ddp"),
                                                 ("tracelens_b200_eager", "unknown")])
def test_traces_without_unit_labels(gpu_real_dir: Path, name: str, framework: str) -> None:
    traces = load_traces([gpu_real_dir / name], cache=False)
    analysis = analyse_run(traces)
    assert not analysis.has_units and analysis.framework == framework
    assert analysis.unit_steps.empty and analysis.unit_stats.empty
    assert any("no FSDP unit labels" in note for note in analysis.notes)
    assert list(analysis.clock["rank"]) == traces.rank_ids
    assert not analysis.clock["applied"].any()  # one job's ranks; SendRecv pairs are never matched
    assert analysis.findings[analysis.findings["kind"] == "straggler"].empty
    assert list(analysis.step_times.columns) == list(schema.STEP_TIMES)
    assert set(analysis.step_times["step"]) <= set(analysis.steps)
