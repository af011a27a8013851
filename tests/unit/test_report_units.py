"""Per-unit plot data on a synthetic FSDP2 GPU run whose answers are known by construction.

The run has two ranks whose clocks disagree by 5 ms (the analysis moves rank 1 onto rank 0's
clock) and a straggler, so the checks also cover the clock alignment of every view.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from synth import Scenario, generate_run, make_root, make_units
from synth.expected import BOUND_FIELDS, bound_ms

from fsdpviz import vocabulary
from fsdpviz.analysis.pipeline import analyse_traces
from fsdpviz.formatting import NS_PER_MS
from fsdpviz.report import style
from fsdpviz.report.data import prepare_report
from fsdpviz.report.timeline.units import LOOP_PART_COLORS
from fsdpviz.report.units.table import TABLE_COLUMNS, html_table, unit_tables
from fsdpviz.structure.intervals import total_ns, union_intervals
from fsdpviz.trace import load_traces

OFFSET_NS = 5_000_000


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sc = Scenario(units=make_units(4), root=make_root(), world_size=2, steps=(3, 4, 5),
                  step_delay_ns={1: 300_000}, clock_offset_ns={1: OFFSET_NS})
    synth = generate_run(sc, tmp_path_factory.mktemp("synth"), run_folder=True)
    traces = load_traces([synth.folder], cache=False)
    result = analyse_traces(traces)
    data = prepare_report(result)
    return synth, traces, result.analysis, data


def _unit_views(data):
    return [v for v in data.views if v.kind == "units"]


def test_views_and_tabs(run) -> None:
    _, _, analysis, data = run
    assert data.has_units
    kinds = [(v.kind, v.choice.step) for v in data.views]
    # units tab per chosen step (median 3, slowest 4: 5 is the last captured, not analysed) + all events
    assert [k for k, _ in kinds] == ["units", "events", "units"]
    assert {s for _, s in kinds} <= set(analysis.steps)


def test_median_view_only_is_the_full_reports_first_tab(run) -> None:
    """``views=("median",)`` (what compare draws) builds one tab: the same per-unit median tab."""
    _, traces, _, data = run
    only = prepare_report(analyse_traces(traces), views=("median",))
    [view] = only.views
    full = data.views[0]
    assert view.kind == full.kind == "units" and view.choice == full.choice
    pd.testing.assert_frame_equal(view.segments, full.segments)
    pd.testing.assert_frame_equal(view.memory, full.memory)
    pd.testing.assert_frame_equal(view.peaks, full.peaks)
    assert only.segment_count == len(view.segments) + len(view.exposed) < data.segment_count
    with pytest.raises(ValueError, match="unknown report views"):
        prepare_report(analyse_traces(traces), views=("fastest",))


def _unit_segments(view) -> pd.DataFrame:
    """The view's segments of FSDP units and the optimizer step (not the loop's other work)."""
    return view.segments[~view.segments["unit_name"].isin(LOOP_PART_COLORS)].reset_index(drop=True)


def test_zero_grad_and_data_loading_named_on_the_gantt(run) -> None:
    # the synthetic run calls zero_grad and takes a batch from a DataLoader once per rank and step
    _, traces, _, data = run
    for view in _unit_views(data):
        loop = view.segments[view.segments["unit_name"].isin(LOOP_PART_COLORS)]
        ranks = sorted(int(r) for r in view.rows["rank"].unique())
        counts = loop.groupby("unit_name").size().to_dict()
        assert counts == {"zero_grad": len(ranks), "data loading": len(ranks)}, counts
        assert set(loop["step"]) == {view.choice.step}
        assert (loop["color"] == loop["unit_name"].map(LOOP_PART_COLORS)).all()
        # on the lane (thread) the trace's range ran on
        ev = traces.events
        named = ev[ev["name"].astype(str).str.startswith(("Optimizer.zero_grad#", "enumerate(DataLoader)#"))
                   & (ev["step"] == view.choice.step)]
        assert sorted(zip(view.rows.set_index("row").loc[loop["row"], "rank"],
                          view.rows.set_index("row").loc[loop["row"], "lane"])) == sorted(
            zip(named["rank"].astype(int), named["lane"].astype(str)))
        assert (loop["x0_ms"] >= -1e-9).all() and (loop["x1_ms"] > loop["x0_ms"]).all()


def test_one_segment_per_span_on_its_own_lane(run) -> None:
    _, _, analysis, data = run
    for view in _unit_views(data):
        spans = analysis.spans[analysis.spans["step"] == view.choice.step]
        view = replace(view, segments=_unit_segments(view))
        assert len(view.segments) == len(spans)  # small run: nothing merged
        assert not view.merged and (view.segments["n_merged"] == 1).all()
        rows = view.rows.set_index("row")
        seg_lane = list(zip(rows.loc[view.segments["row"], "rank"], rows.loc[view.segments["row"], "lane"]))
        assert seg_lane == list(zip(view.segments["rank"], view.segments["lane"]))
        # a lane row exists exactly for each (rank, lane) that carries spans
        assert set(zip(rows["rank"], rows["lane"])) == set(zip(spans["rank"], spans["lane"].astype(str)))
        # the gather lane is named after what runs there
        gather = spans[spans["kind"] == vocabulary.ALL_GATHER]["lane"].iloc[0]
        assert f"rank 0 · {gather} · all_gather" in set(rows["label"])
        # times: ms from the step origin on the reference clock, same durations as the spans
        merged = view.segments.merge(spans, on=["rank", "unit", "phase", "kind", "lane", "start_ns"],
                                     suffixes=("", "_span"))
        assert len(merged) == len(spans)
        assert np.allclose(merged["dur_ms"], (merged["end_ns_span"] - merged["start_ns"]) / NS_PER_MS)
        assert np.allclose(merged["x0_ms"], (merged["start_ns"] - view.choice.origin_ns) / NS_PER_MS)


def test_backward_spans_hatched_and_hover_texts(run) -> None:
    _, _, _, data = run
    seg = _unit_views(data)[0].segments
    assert set(seg.loc[seg["phase"] == "backward", "hatch"]) == {style.PHASE_HATCH["backward"]}
    assert set(seg.loc[seg["phase"] == "forward", "hatch"]) == {" "}
    gathers = seg[seg["kind"] == vocabulary.ALL_GATHER]
    assert (gathers["bytes_text"].str.endswith("MiB")).all()
    assert (gathers["lead_text"] != "").any()
    assert (seg.loc[seg["kind"] == vocabulary.COMPUTE, "lead_text"] == "").all()
    # the analysis makes the optimizer step (Optimizer.step#...) the only span of no unit: named so
    assert set(seg.loc[seg["unit"] == "", "unit_name"]) <= {"optimizer step"}
    assert set(seg.loc[seg["phase"] == "optimizer", "unit_name"]) <= {"optimizer step"}


def test_unit_colours_are_stable_and_by_forward_order(run) -> None:
    _, _, analysis, data = run
    order = analysis.units.sort_values("order")["unit"].tolist()
    for i, unit in enumerate(order):
        assert data.unit_colors[unit] == style.UNIT_PALETTE[i % len(style.UNIT_PALETTE)]
    views = _unit_views(data)
    assert len(views) == 2
    for view in views:
        segments = _unit_segments(view)
        for unit, colour in zip(segments["unit"], segments["color"]):
            assert colour == data.unit_colors[unit]
        if view.peaks is not None:
            assert all(c == data.unit_colors[u] for u, c in zip(view.peaks["unit"], view.peaks["color"]))
    table = unit_tables(analysis.unit_stats, data.unit_colors).table
    assert [data.unit_colors[u] for u in order] == table["color"].tolist()


def test_exposed_pieces_match_the_analysis_per_rank_and_step(run) -> None:
    _, _, analysis, data = run
    for view in _unit_views(data):
        assert not view.exposed.empty
        step_times = analysis.step_times[analysis.step_times["step"] == view.choice.step]
        for rank in (0, 1):
            pieces = view.exposed[view.exposed["rank"] == rank]
            starts = (pieces["x0_ms"] * NS_PER_MS).round().astype(np.int64).to_numpy()
            ends = (pieces["x1_ms"] * NS_PER_MS).round().astype(np.int64).to_numpy()
            expected = int(step_times.loc[step_times["rank"] == rank, "exposed_comm_ns"].iloc[0])
            assert total_ns(union_intervals(starts, ends)) == pytest.approx(expected, abs=2)
        # every exposed piece lies inside a collective span of its own row
        seg = view.segments[view.segments["kind"].isin(["all_gather", "reduce_scatter", "all_reduce"])]
        for piece in view.exposed.itertuples():
            mine = seg[seg["row"] == piece.row]
            assert ((mine["x0_ms"] <= piece.x0_ms + 1e-9) & (mine["x1_ms"] >= piece.x1_ms - 1e-9)).any()


def test_clock_offset_is_removed_from_every_view(run) -> None:
    _, _, analysis, data = run
    assert bool(analysis.clock.set_index("rank").loc[1, "applied"])
    view = _unit_views(data)[0]
    # ranks share one timeline in the model (apart from the straggler's 0.3 ms data-loading delay):
    # their first gathers are a fraction of a millisecond apart, not the 5 ms of clock offset
    first = view.segments[view.segments["kind"] == "all_gather"].groupby("rank")["x0_ms"].min()
    assert abs(first[1] - first[0]) < 1.0
    lanes = next(v for v in data.views if v.kind == "events")
    starts = lanes.segments.groupby("rank")["x0_ms"].min()
    assert abs(starts[1] - starts[0]) < 1.0
    assert lanes.memory.groupby("rank")["t_ms"].min().max() < 1.0


def test_unit_peaks_sit_on_the_memory_curve(run) -> None:
    _, _, analysis, data = run
    for view in _unit_views(data):
        peaks = view.peaks
        expected = analysis.unit_steps[(analysis.unit_steps["step"] == view.choice.step)
                                       & (analysis.unit_steps["peak_allocated_bytes"] > 0)]
        assert len(peaks) == len(expected) > 0
        got = peaks.merge(expected, on=["rank", "unit", "phase"])
        assert (got["peak_bytes"] == got["peak_allocated_bytes"]).all()
        # the marker is inside the unit's window, at an allocator sample holding that level
        assert ((got["t_ns"] >= got["window_start_ns"]) & (got["t_ns"] <= got["window_end_ns"])).all()
        mem = data.views[0].memory
        for row in got.itertuples():
            curve = view.memory[view.memory["rank"] == row.rank]
            at = curve[curve["t_ms"] <= row.t_ms + 1e-9]
            assert int(at["allocated_bytes"].iloc[-1]) == row.peak_bytes
        assert not mem.empty


def test_memory_curve_is_the_analysis_curve_with_exact_peaks(run) -> None:
    """The drawn curve of a step is the analysis' (thinned, reference clock) curve cut to the step,
    and it reaches each rank's exact step peak (``memory_peaks``, from every sample)."""
    _, _, analysis, data = run
    for view in data.views:
        step = view.choice.step
        peaks = analysis.memory_peaks[analysis.memory_peaks["step"] == step].set_index("rank")
        for rank, curve in view.memory.groupby("rank"):
            assert curve["allocated_bytes"].max() == peaks.loc[rank, "peak_allocated_bytes"]
            source = analysis.memory[(analysis.memory["rank"] == rank)
                                     & (analysis.memory["t_ns"] >= view.choice.origin_ns)
                                     & (analysis.memory["t_ns"] <= view.choice.end_ns)]
            assert set(source["t_ns"]) <= set(curve["t_ns"])
            assert len(curve) <= len(source) + 2  # plus the entry level and the level held to the end


def test_unit_table_and_bars_from_unit_stats(run) -> None:
    _, _, analysis, data = run
    tables = data.unit_tables
    stats = analysis.unit_stats.sort_values("order")
    assert tables.units == stats["unit"].tolist()
    assert np.allclose(tables.table["forward_ms"], stats["forward_ns"] / NS_PER_MS)
    times = tables.times.pivot(index="unit_name", columns="metric", values="ms").loc[tables.units]
    assert np.allclose(times["all-gather"], stats["all_gather_ns"] / NS_PER_MS)
    mem = tables.memory[tables.memory["metric"] == "unsharded params + grads"].set_index("unit_name")["bytes"]
    assert mem.loc[tables.units].tolist() == stats["unsharded_bytes"].astype(float).tolist()


def test_findings_are_sentences_with_numbers(run) -> None:
    """The headline lists at most five actions (alike findings as one line), then one line for the rest."""
    _, _, analysis, data = run
    assert 1 <= len(data.findings) <= 6
    top = analysis.findings.sort_values("lost_ns", ascending=False).iloc[0]
    unit, phase = str(top["unit"]), str(top["phase"])
    # the top finding is in the list: its own sentence, or the line of its group
    assert any(str(top["message"]).rstrip(".") in line or "unit-passes" in line or unit in line for line in data.findings)
    assert all(any(ch.isdigit() for ch in line) for line in data.findings)
    assert phase


def test_gantt_rank_selection_beyond_the_limit() -> None:
    from fsdpviz.report.steps.data import choose_gantt_ranks

    times = pd.DataFrame({"rank": np.repeat(np.arange(64), 3), "step": np.tile([1, 2, 3], 64),
                          "ms": np.repeat(np.linspace(100, 163, 64), 3)})
    times.loc[times["rank"] == 37, "ms"] = 500.0  # a straggler
    chosen, why = choose_gantt_ranks(list(range(64)), times, 16)
    assert len(chosen) == 16 and 0 in chosen and 37 in chosen and 1 in chosen  # rank 1 is the fastest
    assert why and "16 of 64" in why
    assert choose_gantt_ranks([0, 1, 2], times, 16) == ([0, 1, 2], "")


def test_unit_table_names_a_unit_per_column_and_sorts_numbers(run) -> None:
    synth, _, _, data = run
    table = html_table(data.unit_tables.table, TABLE_COLUMNS)
    for header, hint in zip(table.columns, table.hints):
        assert hint
        assert header in {"#", "unit", "parameters counted"} or header.endswith(
            ("(ms)", "(count)", "(KiB)", "(MiB)", "(GiB)")), header
    col = {h.split(" (")[0]: i for i, h in enumerate(table.columns)}
    # the scenario's own units, in forward order, with the element counts the script gave them
    spec = {u.name: u for u in synth.scenario.units}
    body = [r for r in table.rows if r[col["unit"]].text in spec]
    assert [r[col["unit"]].text for r in body] == [u.name for u in synth.scenario.units]
    for row in body:
        cell = row[col["parameters"]]
        assert cell.text == f"{spec[row[col['unit']].text].numel:,}"
        assert cell.sort_key == spec[row[col["unit"]].text].numel
    # an unknown value reads "-" and sorts last (NaN), never 0
    for row in table.rows:
        for cell in row:
            if cell.text == "-" and not cell.left:
                assert cell.sort_key is not None and np.isnan(cell.sort_key)


def test_headline_names_the_bound_and_its_size(run) -> None:
    from fsdpviz.formatting import format_ms
    from fsdpviz.report.headline import headline_section

    synth, _, _, data = run
    bound = data.summary.bound
    fact = {f.label: f for f in headline_section(data).facts}["bound"]
    assert fact.value.startswith(bound.kind)
    # the step and its parts (traced: a synthetic run has no timers), each what the simulation knows
    # of its GPU events (synth/expected.py), per analysed step, the median of the two ranks
    assert bound.basis == "traced" and f"of the {format_ms(bound.step_ms)} traced GPU step" in fact.hint
    assert f"compute {format_ms(bound.compute_ms)}" in fact.hint
    truth = bound_ms(synth.expected.bound, data.summary.steps).median()
    for field, column, tolerance in BOUND_FIELDS:
        assert getattr(bound, field) == pytest.approx(truth[column], abs=tolerance), field
