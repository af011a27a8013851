"""``analyse_run`` on synthetic GPU FSDP2 runs: the per-unit numbers the model says, exactly.

Each scenario is simulated by ``tests/synth`` (FSDP2's stream semantics, NCCL collectives that end
together on all ranks, clocks that may disagree); its expected answers come from the simulation's
own record of what it created, never from fsdpviz.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
from synth import ROOT, Scenario, SynthRun, generate_run, make_root, make_units

from fsdpviz.analysis.run import RunAnalysis, analyse_run
from fsdpviz.formatting import ms_text
from fsdpviz.trace import load_traces, schema

SCENARIOS = {
    "implicit-root-2": Scenario(units=make_units(4), root=make_root(), world_size=2, steps=(3, 4, 5)),
    "explicit-1-ahead": Scenario(units=make_units(4), root=make_root(), forward_prefetch=1, backward_prefetch=1),
    "no-overlap": Scenario(units=make_units(3), backward_prefetch=0, sync_per_unit=True),
    "implicit-8-ranks": Scenario(units=make_units(3), root=make_root(), world_size=8),
    "skewed-clocks-straggler": Scenario(units=make_units(3), root=make_root(), world_size=2,
                                        clock_offset_ns={1: 2_500_000_000}, step_delay_ns={1: 3_000_000}),
    "hsdp-skewed": Scenario(units=make_units(3), world_size=4, hsdp_replicas=2,
                            clock_offset_ns={1: 5_000_000_000, 2: -3_000_000, 3: 7_000_000}),
    # one simulated timeline, its event body compressed once and shared by every rank's file
    "shared-body-6-ranks": Scenario(units=make_units(5), root=make_root(), world_size=6, shared_timeline=True,
                                    forward_prefetch=2, clock_offset_ns={4: 900_000_000}),
    # gradient accumulation: two forward + backward passes per optimizer step
    "grad-accum-2": Scenario(units=make_units(3), root=make_root(), world_size=2, micro_batches=2),
    "grad-accum-3-explicit": Scenario(units=make_units(3), forward_prefetch=1, backward_prefetch=1,
                                      micro_batches=3, steps=(2, 3, 4)),
}
UNIT_COLS = ["ag_issue_ns", "ag_start_ns", "ag_end_ns", "ag_ns", "ag_bytes", "ag_exposed_ns", "compute_start_ns",
             "compute_ns", "issue_depth", "rs_ns", "rs_exposed_ns", "ar_ns", "ar_exposed_ns", "peak_allocated_bytes",
             "n_passes"]
KEY = ["rank", "step", "unit", "phase"]



@pytest.fixture(scope="session")
def analysed(tmp_path_factory: pytest.TempPathFactory,
             session_memo: Callable[..., tuple[RunAnalysis, SynthRun]]) -> Callable[[str], tuple[RunAnalysis, SynthRun]]:
    """``analysed(name)``: a scenario generated, loaded and analysed once per test session."""
    def make(name: str) -> tuple[RunAnalysis, SynthRun]:
        sc = SCENARIOS[name]
        run = generate_run(sc, tmp_path_factory.mktemp(name))
        return analyse_run(load_traces(run.paths, cache=False), steps=list(sc.steps)), run
    return lambda name: session_memo(("synth-scenario", name), lambda: make(name))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_unit_steps_match_the_model(name: str, analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, run = analysed(name)
    got = analysis.unit_steps.set_index(KEY).sort_index()
    want = run.expected.unit_steps.set_index(KEY).sort_index()
    assert got.index.equals(want.index)
    for col in UNIT_COLS:
        assert (got[col].to_numpy() == want[col].to_numpy()).all(), col
    lead_got, lead_want = got["prefetch_lead_ns"].to_numpy(), want["prefetch_lead_ns"].to_numpy()
    assert np.array_equal(np.isnan(lead_got), np.isnan(lead_want))
    assert (lead_got[~np.isnan(lead_got)] == lead_want[~np.isnan(lead_want)]).all()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_spans_on_the_reference_clock(name: str, analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, run = analysed(name)
    key = ["rank", "step", "micro", "unit", "phase", "kind", "lane", "start_ns"]
    got = analysis.spans.merge(run.expected.spans, on=key, how="outer", indicator=True, suffixes=("", "_want"))
    assert (got["_merge"] == "both").all()
    assert (got["end_ns"] == got["end_ns_want"]).all() and (got["issue_ns"] == got["issue_ns_want"]).all()


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_clock_offsets_and_memory_peaks(name: str, analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, run = analysed(name)
    clock = analysis.clock.set_index("rank")
    for rank, offset in run.expected.clock_offsets.items():
        assert clock.loc[rank, "offset_ns"] == offset
        assert bool(clock.loc[rank, "applied"]) == (offset != 0)
    key = ["rank", "step"]
    got = analysis.memory_peaks.set_index(key).sort_index()
    want = run.expected.step_peaks.set_index(key).sort_index()
    assert got.index.equals(want.index)
    for col in ("peak_allocated_bytes", "peak_t_ns", "unit", "phase"):
        assert (got[col].to_numpy() == want[col].to_numpy()).all(), col


def test_collective_start_skew(analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, run = analysed("skewed-clocks-straggler")
    want = run.expected.skew
    got = analysis.skew[analysis.skew["kind"] != ""]
    merged = got.merge(want, on=["step", "unit", "phase", "kind"], suffixes=("", "_want"))
    assert len(merged) == len(want) > 0
    assert (merged["start_skew_ns"] == merged["start_skew_ns_want"]).all()
    assert (merged["late_rank"] == merged["late_rank_want"]).all()
    # the delayed rank starts the step's first gather 3 ms late, on the corrected clock
    first = merged.sort_values("first_start_ns").groupby("step").head(1)
    assert (first["start_skew_ns"] == 3_000_000).all() and (first["late_rank"] == 1).all()
    straggler = analysis.findings[analysis.findings["kind"] == "straggler"]
    assert list(straggler["rank"]) == [1]
    # rank 0 waits the 3 ms delay once per step, in its exposed communication: that is the time lost
    assert straggler["lost_ns"].iat[0] == pytest.approx(3_000_000, abs=1_000)
    # one figure for the time lost: the evidence gives the message's, not a second median beside it
    lost = ms_text(float(straggler["lost_ns"].iat[0]) / 1e6)
    assert f"wait for it {lost}/step" in straggler["message"].iat[0]
    assert straggler["evidence"].iat[0].count("/step") == 1 and f"median {lost}/step" in straggler["evidence"].iat[0]


def test_explicit_prefetch_gathers_one_unit_ahead(analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, _ = analysed("explicit-1-ahead")
    us = analysis.unit_steps
    fwd = us[(us["phase"] == "forward") & us["unit"].str.startswith("blocks.")].sort_values(["rank", "step", "unit"])
    later = fwd[fwd["unit"] != "blocks.0"]
    assert (later["issue_depth"] == 1).all()
    # each block's gather is issued before the previous block starts computing
    for (_, _), rows in fwd.groupby(["rank", "step"]):
        rows = rows.sort_values("compute_start_ns")
        assert (rows["ag_issue_ns"].to_numpy()[1:] < rows["compute_start_ns"].to_numpy()[:-1]).all()
    assert (later["ag_exposed_ns"] == 0).all() and (later["prefetch_lead_ns"] > 0).all()


def test_no_overlap_is_fully_exposed_and_says_why(analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, _ = analysed("no-overlap")
    us = analysis.unit_steps
    gathers = us[us["ag_ns"] > 0]
    assert (gathers["ag_exposed_ns"] == gathers["ag_ns"]).all()
    assert (gathers["issue_depth"] == 0).all()
    f = analysis.findings
    late = f[(f["kind"] == "exposed_all_gather") & (f["unit"] == "blocks.1") & (f["phase"] == "forward")]
    assert len(late) == 1
    assert "after blocks.0 had finished computing" in late["message"].iat[0]
    assert "set_modules_to_forward_prefetch" in late["knob"].iat[0]
    # the evidence in words, without the analysis' column names: issued late (no prefetch), so the
    # compute waited for the gather (a negative lead), one measurement per rank and analysed step
    evidence = late["evidence"].iat[0]
    assert "the gather started only after the previous unit's compute (not ahead of time)" in evidence
    passes = us[(us["unit"] == "blocks.1") & (us["phase"] == "forward")]
    lead_ms = float(passes["prefetch_lead_ns"].median()) / 1e6
    assert (f"the gather finished {lead_ms:.2f} ms before the unit's compute began" if lead_ms >= 0
            else f"the unit's compute waited {-lead_ms:.2f} ms for the gather") in evidence
    n = len(passes)
    assert f"median of {n} measurements (one per rank and step)" in evidence
    assert not any(word in evidence for word in ("issue depth", "prefetch lead", "rank-steps"))
    first = f[(f["kind"] == "exposed_all_gather") & (f["unit"] == "blocks.0") & (f["phase"] == "forward")]
    assert "the first all-gather of the forward pass, with no compute before it" in first["message"].iat[0]
    assert first["knob"].iat[0] == "" and "units' compute in the pass before it 0.00 ms" in first["evidence"].iat[0]
    assert list(f["lost_ns"]) == sorted(f["lost_ns"], reverse=True)


def test_nested_root_stats_and_units(analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, run = analysed("implicit-root-2")
    sc = run.scenario
    assert analysis.framework == "fsdp2" and analysis.has_units
    assert list(analysis.units["unit"]) == [ROOT] + [u.name for u in sc.units]
    assert list(analysis.units["parent"]) == [""] + [ROOT] * len(sc.units)
    stats = analysis.unit_stats.set_index("unit")
    assert stats.loc[ROOT, "forward_ns"] == sc.root.fwd_ns and stats.loc[ROOT, "backward_ns"] == sc.root.bwd_ns
    for u in sc.units:
        assert stats.loc[u.name, "forward_ns"] == u.fwd_ns and stats.loc[u.name, "backward_ns"] == u.bwd_ns
        assert stats.loc[u.name, "param_bytes"] == sc.padded_numel(u) * sc.dtype_bytes
    # the root is not resharded after forward: no gather in backward
    assert np.isnan(stats.loc[ROOT, "backward_prefetch_lead_ns"])
    model = analysis.memory_model
    assert model.sharded_state_bytes == run.expected.baseline_bytes
    assert model.measured_peak_bytes == run.expected.step_peaks["peak_allocated_bytes"].max()


def test_ranks_agree_on_eight_ranks(analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, _ = analysed("implicit-8-ranks")
    assert analysis.ranks == list(range(8))
    per_rank = analysis.unit_steps.groupby("rank")["ag_exposed_ns"].sum()
    assert per_rank.nunique() == 1
    assert (analysis.skew["start_skew_ns"] == 0).all() and (analysis.skew["n_ranks"] == 8).all()
    assert analysis.findings[analysis.findings["kind"] == "straggler"].empty


def test_tables_follow_the_schema(analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    analysis, _ = analysed("hsdp-skewed")
    for table, sch in ((analysis.spans, schema.SPANS), (analysis.unit_steps, schema.UNIT_STEPS),
                       (analysis.unit_stats, schema.UNIT_STATS), (analysis.step_times, schema.STEP_TIMES),
                       (analysis.memory, schema.MEMORY), (analysis.memory_peaks, schema.MEMORY_PEAKS),
                       (analysis.clock, schema.CLOCK), (analysis.skew, schema.SKEW),
                       (analysis.findings, schema.FINDINGS), (analysis.units, schema.UNITS)):
        assert list(table.columns) == list(sch)
        assert [str(t) for t in table.dtypes] == list(sch.values())
    assert set(analysis.spans["kind"]) >= {"all_gather", "reduce_scatter", "all_reduce", "compute"}
    assert any("clock differs" in n for n in analysis.notes)


def test_without_unit_labels_only_whole_step_numbers(tmp_path) -> None:
    run = generate_run(SCENARIOS["no-overlap"], tmp_path)
    traces = load_traces(run.paths, cache=False)
    keep = ~traces.events["name"].astype(str).str.startswith("FSDP::").to_numpy()
    stripped = pd.DataFrame(traces.events[keep]).reset_index(drop=True)
    traces.events = schema.conform(stripped, schema.EVENTS)
    analysis = analyse_run(traces)
    assert not analysis.has_units and analysis.unit_steps.empty and analysis.unit_stats.empty
    assert analysis.framework == "unknown"
    assert any("no FSDP unit labels" in n for n in analysis.notes)
    assert len(analysis.step_times) and (analysis.step_times["comm_ns"] > 0).all()


@pytest.mark.parametrize("name", ["grad-accum-2", "grad-accum-3-explicit"])
def test_gradient_accumulation_sums_micro_batches(name: str, analysed: Callable[[str], tuple[RunAnalysis, SynthRun]]) -> None:
    """Each micro-batch's forward is a forward pass (not recomputation inside backward): every unit
    runs both phases once per micro-batch, and a step's per-unit numbers are their sums."""
    analysis, run = analysed(name)
    sc = run.scenario
    us = analysis.unit_steps
    assert (us["n_passes"] == sc.micro_batches).all()
    assert set(us["phase"]) == {"forward", "backward"}
    assert len(us) == len(sc.steps) * sc.world_size * len(sc.all_units()) * 2
    stats = analysis.unit_stats.set_index("unit")
    for u in sc.all_units():
        assert stats.loc[u.name, "forward_ns"] == sc.micro_batches * u.fwd_ns
        assert stats.loc[u.name, "backward_ns"] == sc.micro_batches * u.bwd_ns
    # FSDP2 gathers each block again in every forward and backward and reduce-scatters it each time
    spans = analysis.spans
    blocks = spans[spans["unit"].str.startswith("blocks.")]
    counts = blocks.groupby(["rank", "step", "unit", "phase", "kind"]).size()
    for phase, kind in (("forward", "all_gather"), ("backward", "all_gather"), ("backward", "reduce_scatter"),
                        ("forward", "compute"), ("backward", "compute")):
        assert (counts.xs((phase, kind), level=("phase", "kind")) == sc.micro_batches).all(), (phase, kind)
    assert set(spans["micro"]) == set(range(sc.micro_batches))
    # one all-gather per micro-batch of the step: the same bytes each time
    fwd = us[(us["phase"] == "forward") & us["unit"].str.startswith("blocks.")]
    one = sc.padded_numel(sc.units[0]) * sc.dtype_bytes
    assert (fwd["ag_bytes"] == sc.micro_batches * one).all()
