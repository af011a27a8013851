"""The torchtitan shape: FSDP2 opens the root's bare ``FSDP::pre_backward`` inside the backward of the
unit that computes first in backward (``[norm, output]``). That unit's gradients are still its own
work; the root's own work is only what no unit claims."""

from __future__ import annotations

from pathlib import Path

from helpers.kineto import TraceBuilder

from fsdpviz.analysis.run import analyse_run
from fsdpviz.trace import load_traces

LABEL = "norm, output"  # FSDP2 labels a unit of two modules by both FQNs
UNIT = "[norm, output]"  # fsdpviz names it as one unit


def _trace(rank: int) -> TraceBuilder:
    """One step (µs): forward root [0, 100] around the unit [40, 80]; backward: the unit's window
    [200, 400] with the root's pre_backward [210, 220] inside it, the unit's gradient ops [230, 300],
    then the root's own gradient op [420, 450] in its window [205, 480]."""
    b = TraceBuilder(rank=rank, backend="gloo")
    b.step(3, 0, 500)
    b.annotation("FSDP::root_pre_forward", 0, 5)
    b.annotation("FSDP::pre_forward", 5, 5)
    b.cpu_op("aten::embedding", 12, 20)  # the root's own forward
    b.annotation(f"FSDP::pre_forward ({LABEL})", 40, 5)
    b.cpu_op("aten::linear", 50, 20)  # the unit's forward
    b.annotation(f"FSDP::post_forward ({LABEL})", 75, 5)
    b.annotation("FSDP::post_forward", 95, 5)
    b.annotation(f"FSDP::pre_backward ({LABEL})", 200, 8)
    b.annotation("FSDP::pre_backward", 210, 10)  # the root's, inside the unit's backward
    b.cpu_op("autograd::engine::evaluate_function: MmBackward0", 230, 70)  # the unit's gradients
    b.annotation(f"FSDP::post_backward_reduce ({LABEL})", 350, 50)
    b.cpu_op("autograd::engine::evaluate_function: EmbeddingBackward0", 420, 30)  # the root's
    b.annotation("FSDP::root_post_backward_callback", 460, 20)
    b.annotation("FSDP::post_backward_reduce", 462, 15)
    return b


def test_unit_keeps_its_backward_and_the_root_keeps_the_rest(tmp_path: Path) -> None:
    for rank in (0, 1):
        _trace(rank).write(tmp_path / f"rank{rank}.trace.json")
    analysis = analyse_run(load_traces([tmp_path], cache=False), steps=[3])
    stats = analysis.unit_stats.set_index("unit")
    # the unit's backward is its gradient op (70 µs), not 0; the root's is its own op (30 µs) only
    assert stats.loc[UNIT, "backward_ns"] == 70_000
    assert stats.loc["(root)", "backward_ns"] == 30_000
    assert stats.loc[UNIT, "forward_ns"] == 20_000 and stats.loc["(root)", "forward_ns"] == 20_000
    pieces = analysis.spans[(analysis.spans["kind"] == "compute") & (analysis.spans["phase"] == "backward")]
    # no compute span is claimed twice
    assert pieces.groupby("rank").apply(lambda p: (p["end_ns"] - p["start_ns"]).sum()).tolist() == [100_000] * 2
