"""FSDP2's own autograd function is FSDP's per-unit work, never a unit's model compute.

FSDP2 runs a unit's post-backward through ``RegisterPostBackwardFunction``, an autograd function it
applies to the unit's forward inputs: its backward node (``RegisterPostBackwardFunctionBackward``)
holds the ``FSDP::post_backward`` labels and, outside them, the autograd engine's and Python's
dispatch of the hook, at every unit boundary. One unit for two blocks runs one such node, not two, so
the time is FSDP's, like the hook functions of DeepSpeed and module backward hooks.

Truth: the node's events in the bundled FSDP2 recording (their names are FSDP2's own), against the
analysis' compute spans of the same rank and thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

NODE = "RegisterPostBackwardFunction"


def _overlap_ns(a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray) -> int:
    """Total time where an interval of ``a`` meets one of ``b`` (pairs summed)."""
    total = 0
    for s, e in zip(a_start.tolist(), a_end.tolist()):
        total += int(np.clip(np.minimum(b_end, e) - np.maximum(b_start, s), 0, None).sum())
    return total


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp2_post_backward_node_is_not_compute(rank: int, sample_run: Callable[[str], Any]) -> None:
    run = sample_run("fsdp2-cpu-2rank")
    events = run.traces.events
    events = events[(events["rank"] == rank).to_numpy()]
    names = events["name"].astype(str)
    nodes = events[names.str.removeprefix("autograd::engine::evaluate_function: ").str.startswith(NODE).to_numpy()]
    backward_nodes = nodes[nodes["name"].astype(str).str.endswith("Backward").to_numpy()]
    assert len(backward_nodes) > 0
    start = nodes["start_ns"].to_numpy(np.int64)
    end = start + nodes["dur_ns"].to_numpy(np.int64)
    # the nodes hold host time outside FSDP's labels: what counting them as compute would add
    labels = events[names.str.startswith("FSDP::").to_numpy()]
    l_start = labels["start_ns"].to_numpy(np.int64)
    l_end = l_start + labels["dur_ns"].to_numpy(np.int64)
    b_start = backward_nodes["start_ns"].to_numpy(np.int64)
    b_end = b_start + backward_nodes["dur_ns"].to_numpy(np.int64)
    outside = int((b_end - b_start).sum()) - _overlap_ns(b_start, b_end, l_start, l_end)
    assert outside > 0
    spans = run.analysis.spans
    compute = spans[((spans["rank"] == rank) & (spans["kind"] == "compute")).to_numpy()]
    assert len(compute) > 0
    assert _overlap_ns(start, end, compute["start_ns"].to_numpy(np.int64), compute["end_ns"].to_numpy(np.int64)) == 0
