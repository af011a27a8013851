"""How the simulator splits a step it ran, on programs whose timeline is known by construction: the model's
compute apart from FSDP's copies, as the summary splits a traced step (analysis/bound.py)."""

from __future__ import annotations

import pytest

from fsdpviz.replay.program import (
    ComputeOp,
    CopyOutOp,
    GatherOp,
    Program,
    ReduceOp,
    SegmentOp,
    SimGather,
    SimReduce,
)
from fsdpviz.replay.recorded import Segment
from fsdpviz.replay.simulate import run


def _program() -> Program:
    """Two units' forwards. On a GPU, with the host 1000 ns ahead of nothing:

    - a's copy-in 1000-1010 (nothing else runs), its all-gather 1010-1030 (exposed), its copy-out 1030-1035;
    - a's compute 1035-1135; b's copy-in 1035-1045 and all-gather 1045-1065 run under it;
    - b's copy-out 1135-1140, b's compute 1140-1190; the step's end waits for the device.
    """
    gathers = [SimGather(unit=u, phase="forward", bytes=1 << 20, host_ns=0.0, copy_in_ns=10.0, comm_ns=20.0,
                         copy_out_host_ns=3.0, copy_out_ns=5.0) for u in ("a", "b")]
    ops = [SegmentOp("pre", Segment(busy_ns=1000.0)), GatherOp(0), CopyOutOp(0), ComputeOp("a", "forward", 100.0),
           GatherOp(1), CopyOutOp(1), ComputeOp("b", "forward", 50.0), SegmentOp("post", Segment(sync_at=[0.0]))]
    return Program(ops=ops, gathers=gathers, reduces=[], units=["a", "b"], unit_bytes={"a": 1 << 20, "b": 1 << 20})


def test_on_a_gpu_compute_is_the_models_and_fsdps_copies_are_those_nothing_else_covers() -> None:
    sim = run(_program(), gpu=True)
    assert sim.compute_ns == pytest.approx(150.0)  # a's 100 and b's 50: no copy-out in it
    # a's copy-in and both copy-outs (10 + 5 + 5); b's copy-in ran under a's compute and is the model's time
    assert sim.fsdp_copy_ns == pytest.approx(20.0)
    # a's all-gather alone is exposed; b's ran under a's compute
    assert sim.comm_ns == pytest.approx(40.0) and sim.exposed_comm_ns == pytest.approx(20.0)


def test_on_a_cpu_the_threads_copy_outs_are_fsdps_not_the_models() -> None:
    # the thread runs everything in turn: 1000 ns before, then per unit its all-gather (waited for), its
    # copy-out on the host (3 ns) and its compute
    sim = run(_program(), gpu=False)
    assert sim.compute_ns == pytest.approx(150.0)
    assert sim.fsdp_copy_ns == pytest.approx(6.0)
    assert sim.step_ns == pytest.approx(1000.0 + 2 * (20.0 + 3.0) + 150.0)


def _backward(serial: bool) -> Program:
    """A backward on a GPU: unit b's gradients reduce (100 ns) while unit a's parameters gather (80 ns);
    each gather holds the host for its 90 ns label, as gloo's on CUDA tensors do (the host blocks until
    its collective has run)."""
    gathers = [SimGather(unit="a", phase="backward", bytes=1 << 20, host_ns=90.0, copy_in_ns=0.0, comm_ns=80.0,
                         copy_out_host_ns=0.0, copy_out_ns=0.0)]
    reduces = [SimReduce(unit="b", bytes=1 << 20, comm_ns=100.0, ar_bytes=0, ar_ns=0.0)]
    ops = [SegmentOp("pre", Segment(busy_ns=1000.0)), ComputeOp("b", "backward", 50.0), ReduceOp(0), GatherOp(0),
           CopyOutOp(0), ComputeOp("a", "backward", 50.0), SegmentOp("post", Segment(sync_at=[0.0]))]
    return Program(ops=ops, gathers=gathers, reduces=reduces, units=["a", "b"],
                   unit_bytes={"a": 1 << 20, "b": 1 << 20}, serial_collectives=serial)


def _spans(serial: bool) -> dict[str, tuple[float, float]]:
    return {s.kind: (s.start, s.end) for s in run(_backward(serial), gpu=True).spans
            if s.kind in ("all_gather", "reduce_scatter")}


def test_a_host_backends_collectives_queue_behind_one_another() -> None:
    # NCCL: the host launches b's compute (1000-1050 on the GPU) and its reduce-scatter, which runs on
    # its stream from that compute's end (1050-1150); a's gather on its own from the end of its 90 ns
    # label (1090-1170): side by side
    assert _spans(False) == {"reduce_scatter": (1050.0, 1150.0), "all_gather": (1090.0, 1170.0)}
    # gloo: one queue, and the gather's collective runs inside its label, so it starts when the label
    # does, as soon as the reduce-scatter ahead of it is done (1150-1230)
    assert _spans(True) == {"reduce_scatter": (1050.0, 1150.0), "all_gather": (1150.0, 1230.0)}
    serial = run(_backward(True), gpu=True)
    assert serial.comm_ns == pytest.approx(180.0)  # 100 + 80, one after the other
