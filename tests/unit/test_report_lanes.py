"""The whole-step lanes view on real recordings: rows, categories, exposed pieces, budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fsdpviz.analysis.overlap import compute_overlap
from fsdpviz.report.timeline import events
from fsdpviz.report.timeline import view as timeline_view
from fsdpviz.report.timeline.steps import choose_steps
from fsdpviz.structure import intervals as iv
from fsdpviz.trace import load_traces, schema

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"


@pytest.fixture(scope="module")
def cpu_traces():
    return load_traces([SAMPLE], cache=False)


def _union_ms(df: pd.DataFrame) -> float:
    starts, ends = iv.union_intervals((df["x0_ms"] * 1e6).round().astype(np.int64).to_numpy(),
                                      (df["x1_ms"] * 1e6).round().astype(np.int64).to_numpy())
    return iv.total_ns((starts, ends)) / 1e6


def test_lanes_view_rows_and_categories_on_cpu_recording(cpu_traces) -> None:
    overlap = compute_overlap(cpu_traces)
    choice = choose_steps(cpu_traces.steps)[0]
    view = timeline_view.events_view(cpu_traces, overlap, choice, max_segments=50_000, memory_ranks=[0, 1])
    # one row per (rank, lane) with something drawn, ranks in order, main thread first
    assert view.rows["label"].tolist()[:1] == ["rank 0 · main"]
    assert view.rows["rank"].is_monotonic_increasing
    assert set(view.rows["lane_kind"]) == {schema.LANE_CPU_MAIN, schema.LANE_CPU_GLOO}
    # gloo threads carry the collectives (plus the ops gloo runs for them, e.g. aten::div_);
    # the main thread carries CPU ops and the c10d issue/wait ops
    by_kind = view.segments.merge(view.rows[["row", "lane_kind"]], on="row")
    gloo = by_kind[by_kind["lane_kind"] == schema.LANE_CPU_GLOO]
    assert events.CAT_COMM in set(gloo["category"])
    assert gloo[gloo["category"] == events.CAT_COMM]["name"].astype(str).str.startswith("gloo:").all()
    assert {events.CAT_CPU, events.CAT_COMM} <= set(by_kind[by_kind["lane_kind"] == schema.LANE_CPU_MAIN]["category"])
    # every segment lies inside the step window drawn
    assert view.segments["x0_ms"].min() >= 0
    assert view.segments["x1_ms"].max() <= choice.duration_ms + 1e-9
    assert not view.merged
    # the title names the step drawn, and no step time: the page's step times are the summary's
    assert view.title == f"median step {choice.step}: busy time per lane"


def test_exposed_pieces_add_up_to_the_analysis_exposed_time(cpu_traces) -> None:
    overlap = compute_overlap(cpu_traces)
    choice = choose_steps(cpu_traces.steps)[0]
    view = timeline_view.events_view(cpu_traces, overlap, choice, max_segments=50_000, memory_ranks=[0])
    expected = timeline_view.exposed_intervals(cpu_traces, overlap, choice.step)
    assert not view.exposed.empty
    for rank in (0, 1):
        mine = expected[expected["rank"] == rank]
        expected_ms = float((mine["end_ns"] - mine["start_ns"]).sum()) / 1e6
        assert expected_ms > 1.0  # gloo on CPU leaves real exposed time
        drawn = view.exposed[view.exposed["rank"] == rank]
        assert _union_ms(drawn) == pytest.approx(expected_ms, abs=1e-3)
        # exposed strips sit on gloo lanes only (where collectives run), never on the main thread
        kinds = set(view.rows.set_index("row").loc[drawn["row"].astype(int), "lane_kind"])
        assert kinds == {schema.LANE_CPU_GLOO}


def test_exposed_of_a_step_matches_whole_run_overlap_for_single_step_window(cpu_traces) -> None:
    # compute_overlap over exactly one step must report the same exposed ns as the view's intervals
    step = int(choose_steps(cpu_traces.steps)[0].step)
    overlap = compute_overlap(cpu_traces, steps=[step])
    expected = timeline_view.exposed_intervals(cpu_traces, overlap, step)
    for rank, row in overlap.set_index("rank").iterrows():
        mine = expected[expected["rank"] == rank]
        assert int((mine["end_ns"] - mine["start_ns"]).sum()) == int(row["exposed_comm_ns"])


def test_lane_segments_respect_budget(cpu_traces) -> None:
    overlap = compute_overlap(cpu_traces)
    choice = choose_steps(cpu_traces.steps)[0]
    full = timeline_view.events_view(cpu_traces, overlap, choice, max_segments=50_000, memory_ranks=[])
    small = timeline_view.events_view(cpu_traces, overlap, choice, max_segments=60, memory_ranks=[])
    assert len(full.segments) > 60
    assert len(small.segments) <= 60 and small.merged and small.notes
    assert small.segments["n_merged"].sum() == full.segments["n_merged"].sum()


def test_lanes_view_on_real_gpu_trace(gpu_real_dir: Path) -> None:
    traces = load_traces([gpu_real_dir / "nccl_parser_config" / "nccl_data.json.gz"], cache=False)
    overlap = compute_overlap(traces)
    choice = choose_steps(traces.steps)[0]
    view = timeline_view.events_view(traces, overlap, choice, max_segments=50_000, memory_ranks=[])
    rows = view.rows.set_index("row")
    seg = view.segments.assign(lane_kind=rows.loc[view.segments["row"], "lane_kind"].to_numpy())
    gpu = seg[seg["lane_kind"] == schema.LANE_GPU_STREAM]
    assert {events.CAT_COMPUTE, events.CAT_COMM} <= set(gpu["category"])
    comm_names = gpu[gpu["category"] == events.CAT_COMM]["name"].astype(str)
    assert comm_names.str.startswith("ncclKernel").all()
    # HTA: all-reduces of this DDP job are mostly exposed; the view must show exposed time on a stream
    assert not view.exposed.empty
    assert set(rows.loc[view.exposed["row"].astype(int), "lane_kind"]) == {schema.LANE_GPU_STREAM}


def test_trace_without_profiler_steps_is_drawn_whole(gpu_real_dir: Path) -> None:
    from fsdpviz.analysis.pipeline import analyse_traces
    from fsdpviz.report.data import prepare_report

    traces = load_traces([gpu_real_dir / "tracelens_b200_eager" / "eager_trace.json.gz"], cache=False)
    assert traces.steps.empty
    data = prepare_report(analyse_traces(traces))
    [view] = data.views
    assert view.choice.label == "whole trace" and view.choice.step == schema.NO_STEP
    events = traces.events
    assert view.choice.origin_ns == events["start_ns"].min()
    assert view.choice.end_ns == (events["start_ns"] + events["dur_ns"]).max()
    assert set(view.rows["lane_kind"]) >= {schema.LANE_CPU_MAIN, schema.LANE_GPU_STREAM}
    # HTA finds no overlap in this trace: its few NCCL kernels are exposed, and drawn so
    assert not view.exposed.empty
