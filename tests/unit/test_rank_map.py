"""A run analysed rank by rank where each rank is parsed (the map of a large run) gives the numbers
the same run gives loaded whole: summary JSON bytes, every analysis table, the report's data --
on the bundled CPU samples of the three frameworks and on synthetic GPU runs whose clocks disagree,
with a straggler, gradient accumulation and HSDP. And the parent holds no events."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synth import generate_run
from synth.scenario import Scenario, make_root, make_units

from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.analysis.run import labels_of
from fsdpviz.trace.digest import thin_memory

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ["fsdp2-cpu-2rank", "fsdp2-cpu-2rank-plain", "fsdp1-cpu-2rank", "zero3-cpu-2rank"]
TABLES = ["units", "spans", "windows", "unit_steps", "unit_stats", "step_times", "memory",
          "memory_peaks", "clock", "skew", "findings"]

SCENARIOS = {
    "offsets-straggler-accumulation": Scenario(
        units=make_units(4), root=make_root(), world_size=4, steps=(3, 4, 5), micro_batches=2,
        step_delay_ns={2: 400_000}, clock_offset_ns={1: 3_000_000, 3: -2_000_000}),
    "hsdp": Scenario(units=make_units(3), root=make_root(), world_size=4, hsdp_replicas=2, steps=(1, 2, 3)),
}


def _both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RunResult, RunResult]:
    monkeypatch.setenv("FSDPVIZ_KEEP_EVENTS", "1")
    whole = analyse([path], cache=False)
    monkeypatch.setenv("FSDPVIZ_KEEP_EVENTS", "0")
    mapped = analyse([path], cache=False)
    return whole, mapped


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory: pytest.TempPathFactory,
              sample_run: Callable[[str], RunResult]) -> Callable[[str], tuple[RunResult, RunResult]]:
    """``both_ways(name)``: a bundled sample or a scenario of ``SCENARIOS`` analysed whole and rank by
    rank, once per module; the tests only read the two results. A sample's whole result is the
    session's (``sample_run``): a bundled sample is small enough to be loaded whole by default, which
    ``_same`` asserts, and on a CPU run the views other tests read of it (its completed summary, its
    model) adopt no split, so its tables and summary are the pipeline's as analysed."""
    made: dict[str, tuple[RunResult, RunResult]] = {}

    def get(name: str) -> tuple[RunResult, RunResult]:
        if name not in made:
            if name in SCENARIOS:
                folder = generate_run(SCENARIOS[name], tmp_path_factory.mktemp(name), run_folder=True).folder
                with pytest.MonkeyPatch.context() as patch:
                    made[name] = _both(folder, patch)
            else:
                with pytest.MonkeyPatch.context() as patch:
                    patch.setenv("FSDPVIZ_KEEP_EVENTS", "0")
                    mapped = analyse([ROOT / "sample_traces" / name], cache=False)
                made[name] = sample_run(name), mapped
        return made[name]

    return get


def _same(whole: RunResult, mapped: RunResult) -> None:
    assert whole.events_kept and not mapped.events_kept
    assert len(mapped.traces.events) == 0 and len(whole.traces.events) > 0
    assert mapped.framework == whole.framework
    assert mapped.selection.per_rank == whole.selection.per_rank
    assert [n.text for n in mapped.selection.notes] == [n.text for n in whole.selection.notes]
    pd.testing.assert_frame_equal(mapped.overlap.reset_index(drop=True), whole.overlap.reset_index(drop=True))
    assert mapped.summary.to_json() == whole.summary.to_json()
    a, b = whole.analysis, mapped.analysis
    for name in TABLES:
        left, right = getattr(a, name).reset_index(drop=True), getattr(b, name).reset_index(drop=True)
        assert len(left) > 0 or name in ("skew", "findings", "clock", "memory_peaks"), name
        pd.testing.assert_frame_equal(right, left, obj=name)
    # labels are not kept of a run held rank by rank: they are read again for the ranks that need them
    assert b.labels.empty and len(a.labels)
    again = labels_of(mapped.aligned_detail(), mapped.selection).reset_index(drop=True)
    pd.testing.assert_frame_equal(again, a.labels.reset_index(drop=True))
    assert b.memory_model == a.memory_model
    assert [n.text for n in b.notes] == [n.text for n in a.notes]
    assert (b.ranks, b.steps, b.has_units, b.world_size) == (a.ranks, a.steps, a.has_units, a.world_size)


@pytest.mark.parametrize("sample", SAMPLES)
def test_cpu_samples_same_both_ways(sample: str, both_ways: Callable[[str], tuple[RunResult, RunResult]]) -> None:
    _same(*both_ways(sample))


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_synthetic_gpu_runs_same_both_ways(name: str, both_ways: Callable[[str], tuple[RunResult, RunResult]]) -> None:
    whole, mapped = both_ways(name)
    _same(whole, mapped)
    if name == "offsets-straggler-accumulation":  # the clocks were compared from the digests
        applied = mapped.analysis.clock.set_index("rank")
        assert bool(applied.loc[1, "applied"]) and bool(applied.loc[3, "applied"])
    # the drawn ranks' detail is read again, whole, from the traces
    detail = mapped.detail([0, 2])
    assert sorted(detail.rank_ids) == [0, 2]
    kept = whole.traces.events[whole.traces.events["rank"].isin([0, 2])]
    assert len(detail.events) == len(kept)
    assert np.array_equal(np.sort(detail.events["start_ns"].to_numpy()), np.sort(kept["start_ns"].to_numpy()))


def test_report_data_same_both_ways(both_ways: Callable[[str], tuple[RunResult, RunResult]]) -> None:
    from fsdpviz.report.data import prepare_report

    whole, mapped = both_ways("offsets-straggler-accumulation")
    a, b = prepare_report(whole), prepare_report(mapped)
    assert b.title == a.title and b.meta == a.meta and b.notes == a.notes
    assert len(b.views) == len(a.views) >= 2 and b.findings == a.findings
    for x, y in zip(a.views, b.views):
        assert (y.title, y.kind) == (x.title, x.kind)
        for name in ("rows", "segments", "exposed", "memory"):
            pd.testing.assert_frame_equal(getattr(y, name).reset_index(drop=True),
                                          getattr(x, name).reset_index(drop=True), obj=name)
        if x.peaks is not None:
            pd.testing.assert_frame_equal(y.peaks.reset_index(drop=True), x.peaks.reset_index(drop=True))
    pd.testing.assert_frame_equal(b.rank_steps, a.rank_steps)


def test_thinned_memory_keeps_step_peaks_and_opening_levels() -> None:
    """Known by construction: random samples on two devices; every step's highest allocated and
    reserved level per device, and the level each step opens at, survive the thinning."""
    rng = np.random.default_rng(7)
    n = 20_000
    t = np.sort(rng.integers(0, 10_000_000, n))
    memory = {"device": rng.integers(0, 2, n).astype(np.int32), "t_ns": t,
              "allocated_bytes": rng.integers(0, 1 << 30, n), "reserved_bytes": rng.integers(0, 1 << 31, n),
              "delta_bytes": rng.integers(-1000, 1000, n), "addr": rng.integers(0, 1 << 40, n)}
    starts = np.array([1_000_000, 3_500_000, 7_000_000])
    ends = np.array([3_500_000, 6_000_000, 9_900_000])
    thin = thin_memory(memory, starts, ends)
    assert len(thin["t_ns"]) < n // 10
    for dev in (0, 1):
        full_m, thin_m = memory["device"] == dev, thin["device"] == dev
        for s, e in zip(starts, ends):
            for col in ("allocated_bytes", "reserved_bytes"):
                inside = full_m & (memory["t_ns"] >= s) & (memory["t_ns"] < e)
                kept = thin_m & (thin["t_ns"] >= s) & (thin["t_ns"] < e)
                assert memory[col][inside].max() == thin[col][kept].max()
            before = full_m & (memory["t_ns"] < s)
            kept_before = thin_m & (thin["t_ns"] < s)
            assert memory["allocated_bytes"][before][-1] == thin["allocated_bytes"][kept_before][-1]


def test_whatif_reads_the_same_recording_both_ways(both_ways: Callable[[str], tuple[RunResult, RunResult]]) -> None:
    """The what-if model reads the events of its ranks again from a run held rank by rank (and
    their labels): its prediction is the one made from the run loaded whole."""
    from fsdpviz.replay.model import read_model
    from fsdpviz.replay.settings import Settings, parse_wrap
    from fsdpviz.whatif.predict import predict

    whole, mapped = both_ways("offsets-straggler-accumulation")
    setting = Settings().with_(wrap=parse_wrap("merge:2"), prefetch="none")
    a = predict(read_model(whole, ranks=[0, 3]), setting).to_json()
    b = predict(read_model(mapped, ranks=[0, 3]), setting).to_json()
    assert b == a
    assert a["predicted"]["step_time_ms"] != a["baseline"]["step_time_ms"]


def test_which_runs_are_loaded_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fsdpviz.trace.loader import KEEP_EVENTS_MAX, estimated_events, keeps_events

    monkeypatch.delenv("FSDPVIZ_KEEP_EVENTS", raising=False)

    def sized(name: str, size: int) -> Path:
        path = tmp_path / name
        with path.open("wb") as fh:  # sparse: the size counts, not the blocks
            fh.truncate(size)
        return path

    # the estimate on a real run: the bundled example's traces hold 17,580 tabled events (more in the files)
    example = sorted((ROOT / "sample_traces" / "fsdp2-cpu-2rank" / "traces").glob("*.json.gz"))
    assert 17_580 < estimated_events(example) < 100_000
    half = KEEP_EVENTS_MAX // 2
    small = [sized(f"rank{i}.trace.json.gz", half * 18 - 18) for i in range(2)]
    large = small + [sized("rank2.trace.json.gz", 18 * 10)]
    assert keeps_events(small) and not keeps_events(large)
    assert not keeps_events([sized("a.json", half * 200), sized("b.json", half * 200 + 400)])
    assert keeps_events([sized("one.trace.json.gz", 10 * KEEP_EVENTS_MAX * 18)])  # one file: one rank
    monkeypatch.setenv("FSDPVIZ_KEEP_EVENTS", "1")
    assert keeps_events(large)
    monkeypatch.setenv("FSDPVIZ_KEEP_EVENTS", "0")
    assert not keeps_events(small)


def test_exported_tables_same_both_ways(both_ways: Callable[[str], tuple[RunResult, RunResult]]) -> None:
    """`export` writes every allocator sample: a run held rank by rank reads its ranks again for them."""
    from fsdpviz.commands.export import export_tables

    whole, mapped = both_ways("fsdp2-cpu-2rank")
    a = export_tables(whole)
    b = export_tables(mapped)
    assert len(b["memory"]) > len(mapped.traces.memory)  # more than the thinned samples kept
    for name in a:
        pd.testing.assert_frame_equal(b[name].reset_index(drop=True), a[name].reset_index(drop=True), obj=name)


def test_aligned_tables_are_on_the_reference_clock_both_ways(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``RunResult.aligned`` / ``aligned_detail`` move every rank by the offset its clock runs ahead
    (known by construction), so that they line up with the analysis' spans, loaded whole or rank by rank."""
    offsets = {1: 7_000_000, 2: -3_000_000}
    synth = generate_run(Scenario(units=make_units(3), root=make_root(), world_size=3, clock_offset_ns=offsets),
                         tmp_path / "run")
    whole, mapped = _both(synth.folder, monkeypatch)
    assert whole.clock_offsets == mapped.clock_offsets == {0: 0, **offsets}
    own = whole.traces
    for rank, offset in {0: 0, **offsets}.items():
        steps = own.steps[own.steps["rank"] == rank]
        moved = whole.aligned.steps[whole.aligned.steps["rank"] == rank]
        assert (moved["start_ns"].to_numpy() == steps["start_ns"].to_numpy() - offset).all()
        events = own.events[own.events["rank"] == rank]["start_ns"].to_numpy()
        assert (whole.aligned.events[whole.aligned.events["rank"] == rank]["start_ns"].to_numpy()
                == events - offset).all()
    assert whole.aligned_detail() is whole.aligned  # loaded whole: nothing to read again
    again = mapped.aligned_detail([2])
    assert again.rank_ids == [2]
    mine = whole.aligned.events[whole.aligned.events["rank"] == 2].reset_index(drop=True)
    assert (again.events["start_ns"].to_numpy() == mine["start_ns"].to_numpy()).all()
    # the aligned step holds the spans the analysis put on the reference clock; the step on the rank's
    # own clock (7 ms later for rank 1, a step being about that long) would not
    spans, step = whole.analysis.spans, whole.analysis.steps[0]
    first = spans[(spans["rank"] == 1) & (spans["step"] == step)]["start_ns"].min()
    at = whole.aligned.steps[(whole.aligned.steps["rank"] == 1) & (whole.aligned.steps["step"] == step)]
    assert int(at["start_ns"].iloc[0]) <= first < int(at["start_ns"].iloc[0]) + offsets[1]
