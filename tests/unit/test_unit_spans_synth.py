"""Per-unit spans on synthetic GPU FSDP2 traces: every span matches the model to the nanosecond.

The generator (``tests/synth``) simulates FSDP2's streams and labels and records, while it creates
them, which interval is which unit's gather, copy, compute, reduce-scatter or reshard. The
analysis only sees the Kineto files.
"""

from __future__ import annotations

import pandas as pd
import pytest
from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.structure.labels import ROOT, parse_label_name, parse_labels
from fsdpviz.structure.spans import unit_tables
from fsdpviz.structure.windows import unit_windows
from fsdpviz.trace import load_traces, schema

SCENARIOS = {
    "implicit-root": Scenario(units=make_units(4), root=make_root(), world_size=2),
    "explicit-2-ahead": Scenario(units=make_units(4), forward_prefetch=2, backward_prefetch=1),
    "no-overlap": Scenario(units=make_units(3), root=make_root(), backward_prefetch=0, sync_per_unit=True),
    "hsdp-skew-straggler": Scenario(units=make_units(3), world_size=4, hsdp_replicas=2,
                                    clock_offset_ns={1: 5_000_000_000, 2: -3_000_000},
                                    step_delay_ns={1: 2_000_000}),
    "grad-accum-2": Scenario(units=make_units(3), root=make_root(), micro_batches=2),
}
KEY = ["step", "micro", "unit", "phase", "kind", "lane", "start_ns"]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_spans_match_the_model(name: str, tmp_path) -> None:
    run = generate_run(SCENARIOS[name], tmp_path)
    traces = load_traces(run.paths, cache=False)
    for rank in traces.rank_ids:
        events = traces.events[traces.events["rank"] == rank]
        got = unit_tables(events, traces.lanes, parse_labels(events)).spans
        want = run.expected.spans[run.expected.spans["rank"] == rank].copy()
        offset = run.expected.clock_offsets[rank]  # spans are on the rank's own clock here
        for col in ("start_ns", "end_ns", "issue_ns"):
            want[col] += offset
        merged = got.merge(want, on=KEY, how="outer", indicator=True, suffixes=("", "_want"))
        assert (merged["_merge"] == "both").all(), merged[merged["_merge"] != "both"][KEY + ["_merge"]]
        for col in ("end_ns", "issue_ns", "bytes"):
            assert (merged[col] == merged[f"{col}_want"]).all(), (rank, col)
        kinds = set(got["kind"])
        assert {"all_gather", "copy_in", "copy_out", "compute", "reduce_scatter", "reshard"} <= kinds
        assert ("all_reduce" in kinds) == (SCENARIOS[name].hsdp_replicas > 1)


def test_root_compute_excludes_its_children(tmp_path) -> None:
    run = generate_run(SCENARIOS["implicit-root"], tmp_path, ranks=[0])
    traces = load_traces(run.paths, cache=False)
    spans = unit_tables(traces.events, traces.lanes, parse_labels(traces.events)).spans
    fwd = spans[(spans["kind"] == "compute") & (spans["phase"] == "forward") & (spans["step"] == 3)]
    root = fwd[fwd["unit"] == ROOT].sort_values("start_ns")
    children = fwd[fwd["unit"] != ROOT]
    # two pieces: before the first child and after the last one, never overlapping a child
    assert len(root) == 2
    assert root["end_ns"].iat[0] <= children["start_ns"].min()
    assert root["start_ns"].iat[1] >= children["end_ns"].max()
    assert int((root["end_ns"] - root["start_ns"]).sum()) == SCENARIOS["implicit-root"].root.fwd_ns


@pytest.mark.parametrize(("name", "family", "action", "unit", "phase"), [
    ("FSDP::pre_forward (blocks.3)", "fsdp2", "pre_forward", "blocks.3", "forward"),
    ("FSDP::pre_forward", "fsdp2", "pre_forward", ROOT, "forward"),
    ("FSDP::all_gather (layers.0.attn) [pg=4]", "fsdp2", "all_gather", "layers.0.attn", ""),
    ("FSDP::forward_prefetch for blocks.4", "fsdp2", "forward_prefetch", "blocks.4", "forward"),
    ("FSDP::backward_prefetch for ", "fsdp2", "backward_prefetch", ROOT, "backward"),
    ("FSDP::post_backward_rs_wait ()", "fsdp2", "post_backward_rs_wait", ROOT, "backward"),
    ("FSDP::root_pre_forward", "fsdp2", "root_pre_forward", "", "forward"),
    ("fsdpviz::forward (blocks.0+1)", "fsdpviz", "forward", "blocks.0+1", "forward"),
    ("fsdpviz::backward ((root))", "fsdpviz", "backward", ROOT, "backward"),
    ("FullyShardedDataParallel._pre_forward", "fsdp1", "", "", ""),
])
def test_label_names_parse(name: str, family: str, action: str, unit: str, phase: str) -> None:
    info = parse_label_name(name)
    assert info is not None
    assert (info.family, info.action, info.unit, info.phase) == (family, action, unit, phase)


def test_other_annotations_are_not_labels() -> None:
    for name in ("ProfilerStep#3", "FullyShardedDataParallel.forward", "Optimizer.step#AdamW.step",
                 "nccl:all_reduce", "fsdpviz"):
        assert parse_label_name(name) is None


def test_labels_table_is_typed_and_sorted(tmp_path) -> None:
    run = generate_run(SCENARIOS["explicit-2-ahead"], tmp_path, ranks=[0])
    traces = load_traces(run.paths, cache=False)
    labels = parse_labels(traces.events)
    assert str(labels["start_ns"].dtype) == "int64"
    prefetch = labels[labels["action"] == "forward_prefetch"]
    # explicit 2-ahead: blocks.0 prefetches blocks.1 and blocks.2; later units find some already issued
    assert set(prefetch["unit"]) == {"blocks.1", "blocks.2", "blocks.3"}
    assert pd.Index(labels.groupby("lane")["start_ns"].apply(lambda s: s.is_monotonic_increasing)).all()


def test_activation_checkpoint_recompute_belongs_to_backward() -> None:
    """FSDP2 under activation checkpointing runs pre_forward / post_forward again inside backward."""
    rows = [("FSDP::pre_forward (b)", 0, 10), ("FSDP::post_forward (b)", 100, 110),
            ("FSDP::pre_backward (b)", 200, 210), ("FSDP::pre_forward (b)", 220, 230),
            ("FSDP::post_forward (b)", 300, 310), ("FSDP::post_backward_reduce (b)", 400, 450)]
    events = pd.DataFrame({
        "rank": 0, "lane": "main", "kind": "annotation", "name": [r[0] for r in rows],
        "start_ns": [r[1] for r in rows], "dur_ns": [r[2] - r[1] for r in rows], "correlation": -1,
        "external_id": -1, "step": 1, "comm": "", "comm_bytes": -1, "pg": "", "comm_dtype": "", "comm_numel": -1})
    labels = parse_labels(schema.conform(events, schema.EVENTS))
    assert list(labels.sort_values("start_ns")["phase"]) == ["forward", "forward", "backward", "backward",
                                                             "backward", "backward"]
    windows = unit_windows(labels).set_index("phase")
    assert len(windows) == 2
    assert tuple(windows.loc["forward", ["start_ns", "end_ns", "region_start_ns", "region_end_ns"]]) == (0, 110, 10, 100)
    assert tuple(windows.loc["backward", ["start_ns", "end_ns", "region_start_ns", "region_end_ns"]]) == (
        200, 450, 210, 400)


def _label_events(rows: list[tuple[str, int, int]], lanes: list[str] | None = None) -> pd.DataFrame:
    events = pd.DataFrame({
        "rank": 0, "lane": lanes or "main", "kind": "annotation", "name": [r[0] for r in rows],
        "start_ns": [r[1] for r in rows], "dur_ns": [r[2] - r[1] for r in rows], "correlation": -1,
        "external_id": -1, "step": 1, "comm": "", "comm_bytes": -1, "pg": "", "comm_dtype": "", "comm_numel": -1})
    return schema.conform(events, schema.EVENTS)


def test_gradient_accumulation_second_forward_is_a_forward_pass() -> None:
    """Two micro-batches in one step (FSDP2): the second root_pre_forward opens pass 1; its forward
    labels are a forward window, while a recomputation inside pass 1's backward stays backward."""
    rows = [("FSDP::root_pre_forward", 0, 5), ("FSDP::pre_forward (b)", 10, 20), ("FSDP::post_forward (b)", 100, 110),
            ("FSDP::pre_backward (b)", 200, 210), ("FSDP::post_backward_reduce (b)", 300, 350),
            ("FSDP::root_post_backward_callback", 360, 380),
            ("FSDP::root_pre_forward", 400, 405), ("FSDP::pre_forward (b)", 410, 420),
            ("FSDP::post_forward (b)", 500, 510), ("FSDP::pre_backward (b)", 600, 610),
            ("FSDP::pre_forward (b)", 620, 630), ("FSDP::post_forward (b)", 700, 710),
            ("FSDP::post_backward_reduce (b)", 800, 850)]
    labels = parse_labels(_label_events(rows)).sort_values("start_ns")
    assert list(labels["micro"]) == [0] * 6 + [1] * 7
    assert list(labels["phase"]) == ["forward"] * 3 + ["backward"] * 3 + ["forward"] * 3 + ["backward"] * 4
    windows = unit_windows(parse_labels(_label_events(rows))).sort_values("start_ns")
    got = list(zip(windows["phase"], windows["micro"], windows["region_start_ns"], windows["region_end_ns"]))
    assert got == [("forward", 0, 20, 100), ("backward", 0, 210, 300), ("forward", 1, 420, 500),
                   ("backward", 1, 610, 800)]


@pytest.mark.parametrize("opening", ["fsdpviz::forward ((root))", "fsdpviz::engine_forward"])
def test_gradient_accumulation_with_fsdpviz_ranges(opening: str) -> None:
    """FSDP1 / ZeRO-3 (fsdpviz's ranges): a forward of the root after a backward starts a new pass; a
    unit's forward range recomputed inside its backward range (activation checkpointing) does not."""
    rows = [(opening, 0, 180), ("fsdpviz::forward (b)", 10, 100),
            ("fsdpviz::backward (b)", 200, 300), ("fsdpviz::forward (b)", 210, 250),
            (opening, 400, 580), ("fsdpviz::forward (b)", 410, 500),
            ("fsdpviz::backward (b)", 600, 700), ("fsdpviz::forward (b)", 610, 650)]
    if opening == "fsdpviz::engine_forward":  # ZeRO-3: the root's own range sits inside the engine's
        rows += [("fsdpviz::forward ((root))", 2, 170), ("fsdpviz::forward ((root))", 402, 570)]
    labels = parse_labels(_label_events(rows))
    unit_b = labels[labels["unit"] == "b"].sort_values("start_ns")
    assert list(unit_b["micro"]) == [0, 0, 0, 1, 1, 1]
    assert list(unit_b["phase"]) == ["forward", "backward", "backward", "forward", "backward", "backward"]
    windows = unit_windows(labels)
    w = windows[windows["unit"] == "b"].sort_values("start_ns")
    assert list(zip(w["phase"], w["micro"], w["start_ns"])) == [
        ("forward", 0, 10), ("backward", 0, 200), ("forward", 1, 410), ("backward", 1, 600)]


def test_root_forward_recomputed_inside_backward_is_no_new_pass() -> None:
    """A checkpointed root (fsdpviz::forward ((root)) inside the root's backward range) is recomputation."""
    rows = [("fsdpviz::forward ((root))", 0, 100), ("fsdpviz::backward ((root))", 200, 400),
            ("fsdpviz::forward ((root))", 210, 300)]
    labels = parse_labels(_label_events(rows)).sort_values("start_ns")
    assert list(labels["micro"]) == [0, 0, 0]
    assert list(labels["phase"]) == ["forward", "backward", "backward"]


def test_collectives_without_launch_calls_tie_by_external_id(tmp_path) -> None:
    """Some traces lack the runtime call of a kernel: its External id (the CPU op that launched it,
    here ``record_param_comms`` inside ``FSDP::all_gather (u)``) still names the unit."""
    run = generate_run(SCENARIOS["implicit-root"], tmp_path, ranks=[0])
    traces = load_traces(run.paths, cache=False)
    ev = traces.events
    nccl = ev[(ev["kind"] == "kernel") & (ev["comm"] != "")]
    launches = (ev["kind"] == "runtime") & ev["correlation"].isin(nccl["correlation"])
    assert launches.sum() == len(nccl) > 0
    stripped = schema.conform(ev[~launches.to_numpy()].reset_index(drop=True), schema.EVENTS)
    spans = unit_tables(stripped, traces.lanes, parse_labels(stripped)).spans
    got = spans[spans["kind"].isin(["all_gather", "reduce_scatter"])]
    want = run.expected.spans
    want = want[want["kind"].isin(["all_gather", "reduce_scatter"])]
    merged = got.merge(want, on=KEY, how="outer", indicator=True, suffixes=("", "_want"))
    assert (merged["_merge"] == "both").all()
    # the issue point is now the launching op's start, just before the launch call
    assert ((merged["issue_ns"] <= merged["issue_ns_want"]) & (merged["issue_ns"] > merged["issue_ns_want"] - 50_000)).all()
