"""Collectives of other process groups beside FSDP's on a GPU rank, on a hand-written trace whose
answer is known by construction (times in µs):

    main thread   FSDP::all_gather (blocks.0) 10-30 issues a NCCL all-gather       kernel 100-200
                  forward compute                                                   kernel 200-400
                  a tensor-parallel all-reduce (NCCL, process group "3": mesh_tp)   kernel 300-320
                  backward compute                                                  kernel 430-590
                  FSDP::post_backward_reduce (blocks.0) 500-520 issues a 64 MiB
                      c10d::_reduce_scatter_base_ (NCCL)                            kernel 600-700
                  c10d::allreduce_ of a 1-element tensor (another group, gloo) at 540
                  c10d::barrier at 800 (NCCL all-reduce of one element)             kernel 810-815
    gloo thread   gloo:all_reduce of 1 element                                      550-560

gloo has no reduce-scatter and FSDP's reduce-scatter op is issued before the 1-element all-reduce:
matched by kind and order alone, the 4-byte gloo op became blocks.0's 64 MiB reduce-scatter. Truth:
the reduce-scatter is the NCCL kernel 600-700 (100 µs, all exposed); the gloo op and the barrier are
no FSDP communication (``other``: 10 + 5 µs, of which only the barrier's 5 µs ran beside no compute);
the all-reduce of the group distributedInfo names ``mesh_tp`` is tensor parallelism's (20 µs, hidden).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.kineto import MAIN_TID, TraceBuilder

from fsdpviz.analysis.pipeline import analyse

GLOO_TID = 2000
RS_NUMEL = 16 * 2**20  # float32: 64 MiB
AG_NUMEL = 2**20


def rank_trace(rank: int) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=4, base_time_ns=1_700_000_000_000_000_000)
    b.thread(MAIN_TID, "python").thread(GLOO_TID, "pt_gloo_runloop")
    b.step(1, 0, 1000)
    b.annotation("FSDP::root_pre_forward", 2, 3)
    b.annotation("FSDP::pre_forward (blocks.0)", 5, 80)
    b.annotation("FSDP::all_gather (blocks.0)", 10, 20)
    b.cpu_op("c10d::_allgather_base_", 12, 5, **{"Input Dims": [[AG_NUMEL], [AG_NUMEL // 2], [], [], []],
                                                 "Input type": ["float", "float", "", "", ""]})
    b.kernel("ncclDevKernel_AllGather_RING_LL", 100, 100, stream=20, launch_us=14)
    b.kernel("sm90_xmma_gemm_forward", 200, 200, stream=7, launch_us=90)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 300, 20, stream=21, launch_us=150,
             **{"Collective name": "allreduce", "Process Group Name": "3", "In msg nelems": 256,
                "Out msg nelems": 256, "dtype": "Float"})
    b.annotation("FSDP::post_forward (blocks.0)", 395, 3)
    b.annotation("FSDP::pre_backward (blocks.0)", 420, 10)
    b.kernel("sm90_xmma_gemm_backward", 430, 160, stream=7, launch_us=432)
    b.annotation("FSDP::post_backward_reduce (blocks.0)", 500, 20)
    b.cpu_op("c10d::_reduce_scatter_base_", 505, 10,
             **{"Input Dims": [[RS_NUMEL // 2], [RS_NUMEL], [], [], [], []],
                "Input type": ["float", "float", "", "", "", ""]})
    b.kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 600, 100, stream=20, launch_us=508)
    # another process group's 1-element all-reduce, run by gloo
    b.cpu_op("c10d::allreduce_", 540, 5, **{"Input Dims": [[[1]], [], [], [], [], []],
                                            "Input type": ["TensorList", "", "", "", "", ""]})
    b.cpu_op("gloo:all_reduce", 550, 10, tid=GLOO_TID, **{"Input Dims": [[1]], "Input type": ["float"]})
    b.cpu_op("c10d::barrier", 800, 20, **{"Input Dims": [[1], [], [], [], []],
                                          "Input type": ["float", "", "", "", ""]})
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 810, 5, stream=20, launch_us=805)
    return b


def group(name: str, desc: str, ranks: list[int]) -> dict:
    return {"pg_name": name, "pg_desc": desc, "backend_config": "cuda:nccl", "pg_size": len(ranks), "ranks": ranks}


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    folder: Path = tmp_path_factory.mktemp("purposes")
    mesh = [group("1", "mesh_dp", [0, 2]), group("3", "mesh_tp", [0, 1])]
    for rank in range(4):
        doc = rank_trace(rank).document()
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 4,
                                  "pg_config": [group("0", "default_pg", [0, 1, 2, 3]), *mesh]}
        (folder / f"rank{rank}.trace.json").write_text(json.dumps(doc))
    return analyse([folder], cache=False).summary.to_json()


def test_a_gloo_all_reduce_of_another_group_is_not_an_fsdp_reduce_scatter(summary: dict) -> None:
    unit = next(u for u in summary["units"] if u["name"] == "blocks.0")
    assert unit["reduce_scatter_ms"] == pytest.approx(0.100)
    assert unit["all_gather_ms"] == pytest.approx(0.100)
    by_purpose = summary["overlap"]["by_purpose"]
    assert by_purpose["fsdp_reduce_scatter"] == {"comm_ms": pytest.approx(0.100), "exposed_ms": pytest.approx(0.100)}
    assert by_purpose["fsdp_all_gather"] == {"comm_ms": pytest.approx(0.100), "exposed_ms": pytest.approx(0.100)}


def test_a_barrier_and_another_groups_all_reduce_are_other(summary: dict) -> None:
    by_purpose = summary["overlap"]["by_purpose"]
    assert by_purpose["other"] == {"comm_ms": pytest.approx(0.015), "exposed_ms": pytest.approx(0.005)}
    assert by_purpose["hsdp_all_reduce"] == {"comm_ms": 0.0, "exposed_ms": 0.0}
    assert by_purpose["tensor_parallel"] == {"comm_ms": pytest.approx(0.020), "exposed_ms": 0.0}
    assert summary["parallelism"] == {"dp_shard": 2, "dp_replicate": 1, "tp": 2, "source": "trace"}
    # the whole-step overlap still counts every collective (HTA's definition): 100 + 100 + 20 + 15 µs
    assert summary["overlap"]["comm_ms"] == pytest.approx(0.235)


@pytest.mark.parametrize(("groups", "expected"), [
    # HSDP on a 2 x 2 mesh of rank 0: replicas {0, 2}, shards {0, 1}
    ([group("1", "mesh_dp_replicate", [0, 2]), group("2", "mesh_dp_shard", [0, 1])],
     {"dp_shard": 2, "dp_replicate": 2, "tp": 1}),
    # FSDP over the world on unnamed 1-D meshes (one per fully_shard call)
    ([group("1", "mesh_default", [0, 1, 2, 3]), group("2", "mesh_default", [0, 1, 2, 3])],
     {"dp_shard": 4, "dp_replicate": 1, "tp": 1}),
    # a dimension whose role the name does not say: every size unknown, never 0
    ([group("1", "mesh_dp", [0, 2]), group("2", "mesh_pp", [0, 1])],
     {"dp_shard": None, "dp_replicate": None, "tp": None}),
])
def test_parallelism_from_the_process_groups(tmp_path: Path, groups: list[dict], expected: dict) -> None:
    for rank in range(4):
        doc = rank_trace(rank).document()
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 4,
                                  "pg_config": [group("0", "default_pg", [0, 1, 2, 3]), *groups]}
        (tmp_path / f"rank{rank}.trace.json").write_text(json.dumps(doc))
    out = analyse([tmp_path], cache=False).summary.to_json()
    assert {k: out["parallelism"][k] for k in expected} == expected
    unknown = any(v is None for v in expected.values())
    assert any("parallelism" in note for note in out["notes"]) == unknown


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from fsdpviz.cli import main

    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return int(code or 0), out.out, out.err


@pytest.mark.parametrize(("groups", "refused"), [
    # mesh_pp: a role fsdpviz's table of dimension names does not know, so the mesh may be 2-D
    ([group("1", "mesh_dp", [0, 2]), group("2", "mesh_pp", [0, 1])], True),
    # the same shape with known names is 2-D: refused for that reason instead
    ([group("1", "mesh_dp_replicate", [0, 2]), group("2", "mesh_dp_shard", [0, 1])], True),
    # 1-D meshes over the world: the world-size model applies
    ([group("1", "mesh_default", [0, 1, 2, 3])], False),
    # groups of half the world that are no DeviceMesh's (FSDP1 HYBRID_SHARD makes such): the mesh is unknown,
    # so the prediction says it took it as 1-D
    ([group("1", "undefined", [0, 1]), group("2", "undefined", [0, 2])], False),
])
def test_whatif_world_size_needs_the_mesh_roles(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                groups: list[dict], refused: bool) -> None:
    for rank in range(4):
        doc = rank_trace(rank).document()
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 4,
                                  "pg_config": [group("0", "default_pg", [0, 1, 2, 3]), *groups]}
        (tmp_path / f"rank{rank}.trace.json").write_text(json.dumps(doc))
    code, out, err = _cli(["whatif", str(tmp_path), "--world-size", "8", "--json", "-q", "--no-cache"], capsys)
    if not refused:
        assert code == 0, err
        data = json.loads(out)
        assert data["predicted"]["settings"]["world_size"]["value"] == 8
        one_d = [a for a in data["assumed"] if a.startswith("the mesh is taken as 1-D")]
        assert bool(one_d) == any(g["pg_desc"] == "undefined" for g in groups), data["assumed"]
        return
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --world-size"), err
    unknown = any(g["pg_desc"] == "mesh_pp" for g in groups)
    assert ("unknown role (pp)" in lines[0]) == unknown, lines[0]


def test_whatif_world_size_of_a_one_rank_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A one-rank recording: its own world size (1) asked again is the recording, predicted as it ran;
    another is one error line (no collective ran to scale)."""
    doc = rank_trace(0).document()
    doc["distributedInfo"] = {"backend": "nccl", "rank": 0, "world_size": 1,
                              "pg_config": [group("0", "default_pg", [0])]}
    (tmp_path / "rank0.trace.json").write_text(json.dumps(doc))
    code, out, err = _cli(["whatif", str(tmp_path), "--world-size", "1", "--json", "-q", "--no-cache"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["predicted"]["step_time_ms"] == data["baseline"]["step_time_ms"]
    assert data["predicted"]["settings"]["world_size"] == {"value": 1, "source": "given"}
    code, out, err = _cli(["whatif", str(tmp_path), "--world-size", "2", "-q", "--no-cache"], capsys)
    assert code == 2 and out == ""
    said = "error: the recording ran on one rank: no collective to scale to another world size"
    assert err.strip().splitlines() == [said]
