"""2-D meshes on CPU: TP x FSDP2 and HSDP, 4 gloo ranks, checked against the script's own truth and the
raw traces.

Each process group of gloo runs its collectives on threads of its own, so on a 2-D mesh FSDP's
reduce-scatters (run as ``gloo:all_reduce`` of the whole gradient) and tensor parallelism's activation
all-reduces (``gloo:all_reduce`` of a batch x dim tensor) interleave. The truth: the script's mesh and
its units' parameter bytes (``DTensor.to_local()``), FSDP2's own ``FSDP::post_backward_reduce (fqn)``
ranges in the raw trace and the ``c10d::_reduce_scatter_base_`` inside each (what it hands gloo), and
the raw gloo ops' tensors.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from helpers.jobs import REPO
from recording import MeshRecording, MeshRecordings

from fsdpviz import vocabulary
from fsdpviz.analysis.pipeline import RunResult, analyse

pytestmark = [pytest.mark.slow, pytest.mark.recorded]

BATCH, DIM = 8, 32  # mesh_train.py's activations: what tensor parallelism all-reduces
# FSDP2 names the root's range without a module: "FSDP::post_backward_reduce"
REDUCE_LABEL = re.compile(r"^FSDP::post_backward_reduce(?: \((.*)\))?$")


def raw_events(run_dir: Path, rank: int) -> tuple[list[dict], int]:
    """The rank's complete events and its base time (ns), read straight from the trace file."""
    trace = json.loads(gzip.decompress((run_dir / "traces" / f"rank{rank}.trace.json.gz").read_bytes()))
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"], int(trace.get("baseTimeNanoseconds") or 0)


def start_ns(event: dict, base: int) -> int:
    return base + round(event["ts"] * 1000)


def numel(dims: list) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def analysed_window(result: RunResult, rank: int) -> tuple[int, int]:
    steps = result.traces.steps
    mine = steps[(steps["rank"] == rank) & steps["step"].isin(result.summary.steps)]
    return int(mine["start_ns"].min()), int(mine["end_ns"].max())


@pytest.fixture(scope="module")
def tp(mesh_recordings: MeshRecordings) -> tuple[MeshRecording, RunResult]:
    rec = mesh_recordings.get("tp")
    return rec, analyse([rec.run_dir], cache=False)


@pytest.fixture(scope="module")
def hsdp(mesh_recordings: MeshRecordings) -> tuple[MeshRecording, RunResult]:
    rec = mesh_recordings.get("hsdp")
    return rec, analyse([rec.run_dir], cache=False)


def test_tp_parallelism_from_the_recorder_and_from_the_traces(tp: tuple[MeshRecording, RunResult],
                                                              tmp_path: Path) -> None:
    rec, result = tp
    mesh = rec.truth["mesh"]
    expected = {"dp_shard": mesh["dp"], "dp_replicate": 1, "tp": mesh["tp"]}
    got = result.summary.to_json()["parallelism"]
    assert {k: got[k] for k in expected} == expected and got["source"] == "run.json"
    # the traces alone (no run.json): distributedInfo's process groups say the same
    shutil.copytree(rec.run_dir / "traces", tmp_path / "traces")
    alone = analyse([tmp_path / "traces"], cache=False).summary.to_json()["parallelism"]
    assert {k: alone[k] for k in expected} == expected and alone["source"] == "trace"


def test_tp_units_are_sized_after_tensor_parallelism(tp: tuple[MeshRecording, RunResult]) -> None:
    rec, result = tp
    units = {u["name"]: u for u in result.summary.to_json()["units"]}
    run = json.loads((rec.run_dir / "run.json").read_text())
    recorded = {u["unit"]: u for u in run["units"]}
    for name, truth in rec.truth["units"].items():
        # the blocks' weights are split by TP: each rank's part; the root's are whole on every rank
        assert recorded[name]["param_bytes"] == truth["local_bytes"]
        split = truth["local_bytes"] < truth["global_bytes"]
        assert units[name]["param_scope"] == ("local" if split else "global")
    assert any(t["local_bytes"] < t["global_bytes"] for t in rec.truth["units"].values())


def test_tp_reduce_scatters_are_fsdps_own(tp: tuple[MeshRecording, RunResult]) -> None:
    """Every unit's reduce-scatter is the gloo op that ran the tensor its FSDP::post_backward_reduce
    range handed gloo, one per unit and step, and takes time."""
    rec, result = tp
    rank = 0
    events, base = raw_events(rec.run_dir, rank)
    lo, hi = analysed_window(result, rank)
    inside = [e for e in events if lo <= start_ns(e, base) < hi]
    # FSDP2's own labels and the reduce-scatter op in each: the tensor it hands gloo (its input)
    handed: dict[str, set[int]] = defaultdict(set)
    labels = [(m.group(1) or "(root)", e) for e in inside if (m := REDUCE_LABEL.match(e["name"]))]
    for unit, label in labels:
        for op in inside:
            if (op["name"] == "c10d::_reduce_scatter_base_" and op["tid"] == label["tid"]
                    and label["ts"] <= op["ts"] <= label["ts"] + label["dur"]):
                handed[unit].add(numel(op["args"]["Input Dims"][1]))
    runs = {start_ns(e, base): e for e in inside if e["name"] == "gloo:all_reduce"}
    spans = result.analysis.spans
    rs = spans[(spans["rank"] == rank) & (spans["kind"] == vocabulary.REDUCE_SCATTER)]
    n_steps = len(result.summary.steps)
    units = {u["name"]: u for u in result.summary.to_json()["units"]}
    assert set(handed) == set(rec.truth["units"]) == {"(root)", "blocks.0", "blocks.1"}
    for unit, tensors in handed.items():
        mine = rs[rs["unit"] == unit]
        assert len(mine) == n_steps, unit
        for start in mine["start_ns"].tolist():
            run = runs[min(runs, key=lambda t: abs(t - start))]
            assert abs(start_ns(run, base) - start) < 1000
            assert numel(run["args"]["Input Dims"][0]) in tensors, unit  # not a TP all-reduce
        assert units[unit]["reduce_scatter_ms"] > 0


def test_tp_all_reduces_are_tensor_parallel_and_the_rest_is_not_fsdp(tp: tuple[MeshRecording, RunResult]) -> None:
    from fsdpviz.structure.collectives import find_collectives
    from fsdpviz.structure.labels import parse_labels
    from fsdpviz.structure.purposes import collective_purposes
    from fsdpviz.structure.spans import attribute_collectives

    rec, result = tp
    rank = 0
    events, base = raw_events(rec.run_dir, rank)
    gloo = {start_ns(e, base): e for e in events if e["name"].startswith("gloo:")}
    ev = result.traces.events[(result.traces.events["rank"] == rank).to_numpy()]
    coll = attribute_collectives(find_collectives(ev, result.traces.lanes), parse_labels(ev))
    purposes = collective_purposes(coll, tp=rec.truth["mesh"]["tp"])
    seen = defaultdict(int)
    for start, purpose in zip(coll["start_ns"].tolist(), purposes.tolist()):
        raw = gloo[min(gloo, key=lambda t: abs(t - start))]
        dims = (raw.get("args") or {}).get("Input Dims")
        activation = dims == [[BATCH, DIM]]
        if activation:
            assert purpose == vocabulary.TENSOR_PARALLEL
        elif raw["name"] == "gloo:barrier" or numel(dims[0]) < 64:  # barrier, all_gather_object's sizes/bytes
            assert purpose == vocabulary.OTHER_PURPOSE, raw
        else:
            assert purpose in vocabulary.FSDP_PURPOSES, raw
        seen[purpose] += 1
    assert seen[vocabulary.TENSOR_PARALLEL] and seen[vocabulary.OTHER_PURPOSE] and seen[vocabulary.FSDP_REDUCE_SCATTER]
    by_purpose = result.summary.to_json()["overlap"]["by_purpose"]
    assert by_purpose["tensor_parallel"]["comm_ms"] > 0 and by_purpose["other"]["comm_ms"] > 0
    assert by_purpose["hsdp_all_reduce"]["comm_ms"] == 0
    for row in by_purpose.values():
        assert 0 <= row["exposed_ms"] <= row["comm_ms"]


def test_whatif_world_size_refuses_a_2d_mesh(tp: tuple[MeshRecording, RunResult]) -> None:
    rec, _ = tp
    proc = subprocess.run([sys.executable, "-m", "fsdpviz", "whatif", str(rec.run_dir), "--world-size", "8"],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --world-size") and "tp 2" in lines[-1] and "Traceback" not in proc.stderr


def test_hsdp_parallelism_reduce_scatter_and_all_reduce(hsdp: tuple[MeshRecording, RunResult]) -> None:
    rec, result = hsdp
    mesh = rec.truth["mesh"]
    out = result.summary.to_json()
    assert {k: out["parallelism"][k] for k in ("dp_shard", "dp_replicate", "tp")} == {
        "dp_shard": mesh["shard"], "dp_replicate": mesh["replicate"], "tp": 1}
    by_purpose = out["overlap"]["by_purpose"]
    assert by_purpose["fsdp_reduce_scatter"]["comm_ms"] > 0 and by_purpose["hsdp_all_reduce"]["comm_ms"] > 0
    assert by_purpose["tensor_parallel"]["comm_ms"] == 0
    units = {u["name"]: u for u in out["units"]}
    run = {u["unit"]: u for u in json.loads((rec.run_dir / "run.json").read_text())["units"]}
    for name, truth in rec.truth["units"].items():
        assert run[name]["param_bytes"] == truth["global_bytes"]
        assert units[name]["param_scope"] == "global"
        assert units[name]["reduce_scatter_ms"] > 0 and units[name]["all_reduce_ms"] > 0
    # each unit is sharded over the shard group, not the world: so is the memory model's state
    assert {u["shard_size"] for u in run.values()} == {mesh["shard"]} and mesh["shard"] < mesh["shard"] * mesh["replicate"]
    model = result.analysis.memory_model
    assert model is not None
    assert (model.shards, model.shards_source) == (mesh["shard"], "run.json")
    assert 4 * model.param_count == sum(t["global_bytes"] for t in rec.truth["units"].values())  # fp32
