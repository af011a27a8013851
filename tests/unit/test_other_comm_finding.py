"""Communication no FSDP unit issued, said as a finding with the figure the summary's communication by
purpose gives it, on a hand-written GPU trace whose answer is known by construction (times in µs, each
of three steps of 1000 µs; two ranks, NCCL):

    main thread   FSDP::all_gather (blocks.0) 10-30 issues a NCCL all-gather       kernel 100-200
                  c10d::barrier at 150 (NCCL all-reduce of one element)             kernel 405-415
                  forward compute                                                   kernel 200-400
                  backward compute                                                  kernel 430-590
                  FSDP::post_backward_reduce (blocks.0) 500-520 issues a
                      c10d::_reduce_scatter_base_ (NCCL)                            kernel 600-700
                  after the last backward label: c10d::allreduce_ at 720 (a loss
                      averaged for logging, say)                                    kernel 720-920

Truth: no unit issued the barrier or the all-reduce. They run 10 + 200 µs a step and no compute runs
beside either, so 0.210 ms a step is exposed. The all-reduce is issued after the backward pass; the
barrier is issued before it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import json_here
from helpers.kineto import MAIN_TID, TraceBuilder

from fsdpviz.analysis.findings import OUTSIDE_UNITS_WHY_NOT
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.analysis.summary import OUTSIDE_UNITS_CPU_REPLAY, OUTSIDE_UNITS_GPU_REPLAY

STEP_US = 1000
AG_NUMEL = 2**20
RS_NUMEL = 2**20
ALL_REDUCE = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def rank_trace(rank: int, *, optimizer_all_reduce_us: float = 200, backward_labels: bool = True) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=2, base_time_ns=1_700_000_000_000_000_000)
    b.thread(MAIN_TID, "python")
    for step in range(3):
        o = step * STEP_US
        b.step(step + 1, o, STEP_US)
        b.annotation("FSDP::root_pre_forward", o + 2, 3)
        b.annotation("FSDP::pre_forward (blocks.0)", o + 5, 80)
        b.annotation("FSDP::all_gather (blocks.0)", o + 10, 20)
        b.cpu_op("c10d::_allgather_base_", o + 12, 5, **{"Input Dims": [[AG_NUMEL], [AG_NUMEL // 2], [], [], []],
                                                         "Input type": ["float", "float", "", "", ""]})
        b.kernel("ncclDevKernel_AllGather_RING_LL", o + 100, 100, stream=20, launch_us=o + 14)
        b.cpu_op("c10d::barrier", o + 150, 5, **{"Input Dims": [[1], [], [], [], []],
                                                 "Input type": ["float", "", "", "", ""]})
        b.kernel(ALL_REDUCE, o + 405, 10, stream=20, launch_us=o + 152)
        b.kernel("sm90_xmma_gemm_forward", o + 200, 200, stream=7, launch_us=o + 90)
        b.annotation("FSDP::post_forward (blocks.0)", o + 395, 3)
        if backward_labels:
            b.annotation("FSDP::pre_backward (blocks.0)", o + 420, 10)
        b.kernel("sm90_xmma_gemm_backward", o + 430, 160, stream=7, launch_us=o + 432)
        if backward_labels:
            b.annotation("FSDP::post_backward_reduce (blocks.0)", o + 500, 20)
        b.cpu_op("c10d::_reduce_scatter_base_", o + 505, 10,
                 **{"Input Dims": [[RS_NUMEL // 2], [RS_NUMEL], [], [], [], []],
                    "Input type": ["float", "float", "", "", "", ""]})
        b.kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", o + 600, 100, stream=20, launch_us=o + 508)
        b.cpu_op("c10d::allreduce_", o + 720, 5, **{"Input Dims": [[[1]], [], [], [], [], []],
                                                    "Input type": ["TensorList", "", "", "", "", ""]})
        b.kernel(ALL_REDUCE, o + 720, optimizer_all_reduce_us, stream=20, launch_us=o + 722)
    return b


def write_run(folder: Path, **kwargs: float | bool) -> Path:
    for rank in range(2):
        doc = rank_trace(rank, **kwargs).document()
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
        (folder / f"rank{rank}.trace.json").write_text(json.dumps(doc))
    return folder


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return analyse([write_run(tmp_path_factory.mktemp("other"))], cache=False).summary.to_json()


def test_communication_no_unit_issued_is_a_finding_with_the_purposes_figure(summary: dict) -> None:
    assert summary["overlap"]["by_purpose"]["other"] == {"comm_ms": pytest.approx(0.210),
                                                         "exposed_ms": pytest.approx(0.210)}
    found = [f for f in summary["findings"] if f["kind"] == "exposed_other"]
    assert len(found) == 1
    finding = found[0]
    # one figure: the finding's time is the summary's exposed communication by purpose, other
    assert finding["lost_ms_per_step"] == pytest.approx(0.210) == summary["overlap"]["by_purpose"]["other"]["exposed_ms"]
    # which collectives, a step, and when: the barrier before the backward pass, the all-reduce after it
    assert "2 all_reduce a step on rank 0" in finding["message"], finding["message"]
    assert ("1 of them a step issued after the backward pass (the optimizer step, or what the script runs before its "
            "next step): the training script's own there") in finding["message"], finding["message"]
    # nothing of FSDP's moves it: no knob, and why; a GPU replay leaves it out of the step it predicts
    assert finding["knob"] == "" and finding["why_not"] == f"{OUTSIDE_UNITS_WHY_NOT}; {OUTSIDE_UNITS_GPU_REPLAY}"
    action = next(a for a in summary["actions"] if a["cause"] == "outside_units")
    assert action["lost_ms_per_step"] == pytest.approx(0.210) and not action.get("apply_code")
    # FSDP's own communication is untouched by it: 100 µs of all-gather and 100 µs of reduce-scatter
    assert summary["overlap"]["by_purpose"]["fsdp_all_gather"]["exposed_ms"] == pytest.approx(0.100)
    assert summary["overlap"]["by_purpose"]["fsdp_reduce_scatter"]["exposed_ms"] == pytest.approx(0.100)


def test_below_the_noise_floor_no_finding(tmp_path: Path) -> None:
    # 10 + 5 µs a step: under the findings' floor (20 µs), counted by purpose but not said as a finding
    summary = analyse([write_run(tmp_path, optimizer_all_reduce_us=5)], cache=False).summary.to_json()
    assert summary["overlap"]["by_purpose"]["other"]["exposed_ms"] == pytest.approx(0.015)
    assert not [f for f in summary["findings"] if f["kind"] == "exposed_other"]


def test_without_backward_labels_when_they_were_issued_is_not_known(tmp_path: Path) -> None:
    # no backward label: the reduce-scatter is no unit's either (100 µs, exposed), beside the barrier and the
    # all-reduce; whether any ran after the backward pass cannot be told, and the finding says so
    summary = analyse([write_run(tmp_path, backward_labels=False)], cache=False).summary.to_json()
    other = summary["overlap"]["by_purpose"]["other"]
    assert other == {"comm_ms": pytest.approx(0.310), "exposed_ms": pytest.approx(0.310)}
    finding = next(f for f in summary["findings"] if f["kind"] == "exposed_other")
    assert finding["lost_ms_per_step"] == other["exposed_ms"]
    assert "when they were issued against the backward pass is not known" in finding["message"], finding["message"]
    assert "none issued after" not in finding["message"] and "script's own" not in finding["message"]


def test_the_bundled_zero3_run_names_deepspeeds_step(capsys: pytest.CaptureFixture[str], repo_root: Path) -> None:
    # the example trainer gives DeepSpeed one parameter group, whose norm ZeRO-3's step all-reduces once a
    # step after the backward pass (deepspeed/runtime/zero/stage3.py, get_grad_norm_direct; fp32, so no
    # overflow check)
    summary = json_here(capsys, "summary", "--json", "--no-cache", str(repo_root / "sample_traces" / "zero3-cpu-2rank"))
    finding = next(f for f in summary["findings"] if f["kind"] == "exposed_other")
    assert finding["lost_ms_per_step"] == summary["overlap"]["by_purpose"]["other"]["exposed_ms"] > 0
    assert "(1 all_reduce a step on rank 0; all issued after the backward pass (the optimizer step" \
        in finding["message"], finding["message"]
    assert "DeepSpeed's ZeRO-3 step all-reduces the gradients' norm" in finding["message"]
    # no all-gather after the step: the example keeps no persistent parameters (threshold 0), and the words
    # name none
    assert "persistent" not in finding["message"]
    assert finding["why_not"] == f"{OUTSIDE_UNITS_WHY_NOT}; {OUTSIDE_UNITS_CPU_REPLAY}"
