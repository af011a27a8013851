"""ZeRO-3 attribution on hand-built traces whose answers are known by construction.

A ZeRO-3 unit is what DeepSpeed fetches for one submodule; ``fsdpviz record`` also labels the root
module and each parent block (units without parameters of their own), DeepSpeed's per-module fetch
and release, and the engine's ``forward`` / ``backward`` / ``step`` calls. The trace below lays
these out on one CPU rank with every interval chosen by hand, so each category of the step's time
and each unit's compute has an exact expected value. Also: bucket labels listing several units
(and each unit's share of the bucket's time), FSDP2 units made of several modules (whose own name
holds a comma), and the memory model's shard group under HSDP.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers.kineto import TraceBuilder
from synth import Scenario, generate_run, make_units

from fsdpviz.analysis import memory
from fsdpviz.analysis.run import analyse_run
from fsdpviz.analysis.unit_overlap import collective_shares
from fsdpviz.runfolder import UnitInfo
from fsdpviz.structure.labels import parse_label_name, parse_labels
from fsdpviz.structure.spans import unit_tables
from fsdpviz.trace import load_traces

GLOO_TID = 2000
US = 1_000  # ns per µs


def _zero3_step(b: TraceBuilder) -> None:
    """One ZeRO-3 step, 0-1000 µs: root > blocks.0 > (qkv, proj), engine calls around them."""
    b.step(3, 0, 1000)
    b.cpu_op("aten::to", 0, 20)  # the user's batch.to: other
    b.annotation("fsdpviz::engine_forward", 20, 380)
    b.cpu_op("aten::empty", 20, 20)  # DeepSpeed's forward prologue: framework
    b.annotation("fsdpviz::forward ((root))", 40, 340)
    b.annotation("fsdpviz::fetch ((root))", 40, 20)
    b.annotation("fsdpviz::all_gather (blocks.0.qkv, blocks.0.proj)", 42, 16)
    b.cpu_op("aten::add", 60, 20)  # the root's own code (embeddings)
    b.annotation("fsdpviz::forward (blocks.0)", 80, 220)
    b.annotation("fsdpviz::fetch (blocks.0)", 80, 10)
    for unit, start, work in (("blocks.0.qkv", 90, 40), ("blocks.0.proj", 200, 60)):
        b.annotation(f"fsdpviz::forward ({unit})", start, work + 20)
        b.annotation(f"fsdpviz::fetch ({unit})", start, 10)
        b.cpu_op("aten::linear", start + 10, work)
        b.annotation(f"fsdpviz::release ({unit})", start + 10 + work, 10)
    b.cpu_op("aten::scaled_dot_product_attention", 150, 50)  # the block's own code between its units
    b.cpu_op("aten::add", 280, 10)  # its residual add after them
    b.annotation("fsdpviz::release (blocks.0)", 290, 10)
    b.cpu_op("aten::linear", 300, 70)  # the root's own code (head)
    b.annotation("fsdpviz::release ((root))", 370, 10)
    b.cpu_op("aten::empty", 380, 20)  # DeepSpeed's forward epilogue
    b.cpu_op("aten::cross_entropy_loss", 400, 50)  # the user's loss: other
    b.annotation("fsdpviz::engine_backward", 450, 350)
    b.cpu_op("autograd::engine::evaluate_function: NllLossBackward0", 450, 30)
    b.annotation("fsdpviz::backward ((root))", 480, 280)
    b.cpu_op("autograd::engine::evaluate_function: MmBackward0", 480, 20)
    b.annotation("fsdpviz::backward (blocks.0)", 500, 240)
    b.annotation("fsdpviz::fetch (blocks.0)", 500, 10)
    for unit, start, work in (("blocks.0.proj", 510, 70), ("blocks.0.qkv", 650, 60)):
        b.annotation(f"fsdpviz::backward ({unit})", start, work + 20)
        b.annotation(f"fsdpviz::fetch ({unit})", start, 10)
        b.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", start + 10, work)
        b.annotation(f"fsdpviz::release ({unit})", start + 10 + work, 10)
    b.cpu_op("autograd::engine::evaluate_function: ScaledDotProductAttentionBackward0", 600, 50)
    b.annotation("fsdpviz::release (blocks.0)", 730, 10)
    b.cpu_op("autograd::engine::evaluate_function: EmbeddingBackward0", 740, 20)
    b.annotation("fsdpviz::reduce_scatter (blocks.0.proj, blocks.0.qkv)", 760, 30)
    b.annotation("fsdpviz::engine_step", 800, 180)
    b.annotation("Optimizer.step#AdamW.step", 820, 80)
    b.cpu_op("aten::item", 980, 20)


@pytest.fixture(scope="module")
def zero3_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    b = TraceBuilder(rank=0, world_size=1, backend="gloo")
    _zero3_step(b)
    return b.write(tmp_path_factory.mktemp("zero3") / "rank0.trace.json")


def test_engine_labels_name_no_unit_and_imply_a_pass() -> None:
    forward = parse_label_name("fsdpviz::engine_forward")
    assert forward is not None and (forward.action, forward.unit, forward.phase) == ("engine_forward", "", "forward")
    assert parse_label_name("fsdpviz::engine_backward").phase == "backward"
    assert parse_label_name("fsdpviz::engine_step").unit == ""
    fetch = parse_label_name("fsdpviz::fetch (blocks.0.qkv)")
    assert fetch is not None and (fetch.action, fetch.unit) == ("fetch", "blocks.0.qkv")


def test_step_time_splits_into_unit_compute_framework_optimizer_and_other(zero3_trace: Path) -> None:
    analysis = analyse_run(load_traces([zero3_trace], cache=False))
    assert analysis.framework == "zero3"  # from the engine ranges, without run.json
    times = analysis.step_times.iloc[0]
    assert times["step_ns"] == 1000 * US
    # units' own code (root 90 + 40, blocks.0 60 + 50, qkv 40 + 60, proj 60 + 70)
    assert times["unit_compute_ns"] == 470 * US
    # fetches, releases, the gather and bucket reduce, and the engine's work outside every window
    assert times["framework_ns"] == 260 * US
    assert times["optimizer_ns"] == 200 * US  # engine.step and what follows the last backward label
    assert times["other_ns"] == 70 * US  # batch.to and the loss


def test_parent_block_and_root_compute_their_own_code(zero3_trace: Path) -> None:
    stats = analyse_run(load_traces([zero3_trace], cache=False)).unit_stats.set_index("unit")
    want = {"(root)": (90, 40), "blocks.0": (60, 50), "blocks.0.qkv": (40, 60), "blocks.0.proj": (60, 70)}
    for unit, (forward_us, backward_us) in want.items():
        assert stats.loc[unit, "forward_ns"] == forward_us * US, unit
        assert stats.loc[unit, "backward_ns"] == backward_us * US, unit
    assert list(stats.sort_values("order").index) == ["(root)", "blocks.0", "blocks.0.qkv", "blocks.0.proj"]


def _gathers(b: TraceBuilder, label: str, start_us: float) -> None:
    b.annotation(label, start_us, 30)
    b.cpu_op("c10d::_allgather_base_", start_us + 5, 10, **{"Input Dims": [[64], [32]], "Input type": ["float", "float"]})
    b.annotation("gloo:all_gather", start_us + 10, 40, tid=GLOO_TID)


def test_bucket_labels_split_into_units_but_fsdp2_multi_module_units_keep_their_name(tmp_path: Path) -> None:
    b = TraceBuilder(rank=0, world_size=2, backend="gloo").thread(GLOO_TID, "pt_gloo_runloop")
    b.step(3, 0, 400)
    _gathers(b, "FSDP::all_gather (blocks.0, blocks.1)", 10)  # one FSDP2 unit: fully_shard([a, b])
    _gathers(b, "fsdpviz::all_gather (blocks.2.qkv, blocks.2.proj)", 100)  # a ZeRO-3 bucket of two units
    traces = load_traces([b.write(tmp_path / "rank0.trace.json")], cache=False)
    coll = unit_tables(traces.events, traces.lanes, parse_labels(traces.events)).collectives
    coll = coll[coll["kind"] == "all_gather"].sort_values("start_ns")
    assert list(coll["unit"]) == ["[blocks.0, blocks.1]", "blocks.2.qkv", "blocks.2.proj"]
    assert list(coll["n_units"]) == [1, 2, 2]
    # each gloo gather ran 40 µs; the bucket's two units (sizes unknown here) get half each
    gathered = analyse_run(traces).unit_steps.groupby("unit")["ag_ns"].sum()
    assert gathered.to_dict() == {"[blocks.0, blocks.1]": 40 * US, "blocks.2.qkv": 20 * US, "blocks.2.proj": 20 * US}


def test_a_bucket_counts_its_duration_once_over_its_units_by_size() -> None:
    rows = pd.DataFrame({"rank": 0, "lane": "gloo 0", "kind": "all_gather", "start_ns": [0, 0, 100],
                         "end_ns": [40, 40, 140], "unit": ["a", "b", "c"], "n_units": [2, 2, 1]})
    assert list(collective_shares(rows, {"a": 300, "b": 100, "c": 5})) == [0.75, 0.25, 1.0]
    assert list(collective_shares(rows, {"a": 300})) == [0.5, 0.5, 1.0]  # a size unknown: equal shares


def test_hsdp_memory_model_shards_over_the_shard_group(tmp_path: Path) -> None:
    """4 ranks as 2 replicas of 2-rank shard groups: each rank holds half the state, not a quarter."""
    sc = Scenario(units=make_units(3), world_size=4, hsdp_replicas=2)
    run = generate_run(sc, tmp_path)
    model = analyse_run(load_traces(run.paths, cache=False)).memory_model
    assert (model.shards, model.shards_source) == (2, "trace")  # the all-gathers' process group
    assert model.sharded_state_bytes == run.expected.baseline_bytes


def test_shard_sizes_from_run_json_win_over_the_trace() -> None:
    units = [UnitInfo(unit="a", shard_size=4), UnitInfo(unit="b", shard_size=2), UnitInfo(unit="(root)", shard_size=None)]
    shards, source = memory.shard_sizes(units, pd.DataFrame(), n_ranks=1, world_size=8)
    assert (shards, source) == ({"a": 4, "b": 2}, "run.json")
    model = memory.memory_model(pd.Series({"a": 400, "b": 400, "(root)": 400}), 8, 4, measured_elem=True,
                                unit_shards=shards, shards_source=source)
    # (4 + 4 + 8) bytes per parameter, 100 parameters per unit, over 4, 2 and 8 (the world) ranks
    assert model.sharded_state_bytes == 16 * 100 // 4 + 16 * 100 // 2 + 16 * 100 // 8
