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


def test_a_trace_without_memory_says_why_its_peak_is_null(gpu_real_dir: Path) -> None:
    """A DDP job's trace (no run.json) whose file holds no `[memory]` event: the summary's peak is null, and
    a note says the traces hold no memory samples; whatif, which reads FSDP runs only, is not promised."""
    from helpers.rawfiles import all_events

    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.structure.records import NO_MEMORY

    folder = gpu_real_dir / "nccl_parser_config"
    files = sorted(folder.glob("*.json*"))
    assert files and not any(e.get("name") == "[memory]" for f in files for e in all_events(f))
    summary = analyse([folder], cache=False).summary
    assert summary.framework == "ddp" and summary.memory.peak_allocated_bytes is None
    (note,) = [n for n in summary.notes if n.code == NO_MEMORY]
    assert "the traces hold no memory samples" in note and "whatif" not in note
