"""FSDP2's own autograd function is FSDP's per-unit work, never a unit's model compute.

FSDP2 runs a unit's post-backward through ``RegisterPostBackwardFunction``, an autograd function it
applies to the unit's forward inputs: its backward (``RegisterPostBackwardFunctionBackward``) holds the
``FSDP::post_backward_*`` labels and, outside them, the dispatch of the hook, at every unit boundary.
One unit for two blocks runs one such node, not two, so the time is FSDP's, like the hook functions of
DeepSpeed and module backward hooks. The autograd engine's ``evaluate_function`` range around the node
also adds the node's output gradients into an input that feeds more than the unit: that add is the
model's, and stays compute.

Truth: the node's events in the bundled FSDP2 recording (their names are FSDP2's own) against the
analysis' compute spans of the same rank and thread; and the same recording with one gradient add
written into the engine's range after the node, whose place is known by construction.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fsdpviz.analysis.pipeline import analyse

NODE = "RegisterPostBackwardFunction"
WRAPPER = "autograd::engine::evaluate_function: RegisterPostBackwardFunctionBackward"
SAMPLE = "fsdp2-cpu-2rank"
SAMPLE_TRACES_DIR = Path(__file__).resolve().parents[2] / "sample_traces"


def _overlap_ns(a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray) -> int:
    """Total time where an interval of ``a`` meets one of ``b`` (pairs summed)."""
    total = 0
    for s, e in zip(a_start.tolist(), a_end.tolist()):
        total += int(np.clip(np.minimum(b_end, e) - np.maximum(b_start, s), 0, None).sum())
    return total


def _intervals(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    start = rows["start_ns"].to_numpy(np.int64)
    return start, start + rows["dur_ns"].to_numpy(np.int64)


def _compute(run: Any, rank: int) -> tuple[np.ndarray, np.ndarray]:
    spans = run.analysis.spans
    compute = spans[((spans["rank"] == rank) & (spans["kind"] == "compute")).to_numpy()]
    assert len(compute) > 0
    return compute["start_ns"].to_numpy(np.int64), compute["end_ns"].to_numpy(np.int64)


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp2_post_backward_node_is_not_compute(rank: int, sample_run: Callable[[str], Any]) -> None:
    run = sample_run(SAMPLE)
    events = run.traces.events
    events = events[((events["rank"] == rank) & (events["lane"] == "main")).to_numpy()]
    names = events["name"].astype(str)
    nodes = events[names.str.startswith(NODE).to_numpy()]
    backward = nodes[nodes["name"].astype(str).str.endswith("Backward").to_numpy()]
    assert len(backward) > 0
    n_start, n_end = _intervals(nodes)
    b_start, b_end = _intervals(backward)
    l_start, l_end = _intervals(events[names.str.startswith("FSDP::").to_numpy()])
    # the node holds host time outside FSDP's labels, what counting it as compute would add...
    assert int((b_end - b_start).sum()) - _overlap_ns(b_start, b_end, l_start, l_end) > 0
    # ...and no model op: every aten op that starts inside it starts inside one of FSDP's labels
    ops = events[names.str.startswith("aten::").to_numpy()]
    o_start = ops["start_ns"].to_numpy(np.int64)
    in_node = ((o_start[:, None] >= b_start[None, :]) & (o_start[:, None] < b_end[None, :])).any(axis=1)
    in_label = ((o_start[:, None] >= l_start[None, :]) & (o_start[:, None] < l_end[None, :])).any(axis=1)
    assert in_node.any() and not (in_node & ~in_label).any()
    assert _overlap_ns(n_start, n_end, *_compute(run, rank)) == 0


def test_a_gradient_add_after_the_node_stays_compute(tmp_path: Path) -> None:
    """An input that feeds more than its unit gets its gradients added inside the engine's range
    around FSDP2's node, after the node: model work, so it stays compute."""
    folder = tmp_path / SAMPLE
    shutil.copytree(SAMPLE_TRACES_DIR / SAMPLE, folder, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    path = folder / "traces" / "rank0.trace.json.gz"
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    wrappers = [e for e in events if e.get("name") == WRAPPER]
    inner = [e for e in events if e.get("name") == f"{NODE}Backward"]
    added = 0
    for w in wrappers:
        node = next(e for e in inner if e["tid"] == w["tid"] and w["ts"] <= e["ts"] < w["ts"] + w["dur"])
        after = node["ts"] + node["dur"]
        room = w["ts"] + w["dur"] - after
        if room > 2.0:  # the engine's tail after the node: the add goes there
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": w["pid"], "tid": w["tid"],
                           "ts": after + 0.5, "dur": round(room - 1.0, 3), "args": {}})
            added += 1
    assert added > 0
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    run = analyse([folder], cache=False, progress=False)
    parsed = run.traces.events
    adds = parsed[((parsed["rank"] == 0) & (parsed["name"].astype(str) == "aten::add_")).to_numpy()]
    a_start, a_end = _intervals(adds)
    w_rows = parsed[((parsed["rank"] == 0) & (parsed["name"].astype(str) == WRAPPER)).to_numpy()]
    w_start, w_end = _intervals(w_rows)
    placed = ((a_start[:, None] >= w_start[None, :]) & (a_end[:, None] <= w_end[None, :])).any(axis=1)
    assert placed.sum() == added
    c_start, c_end = _compute(run, 0)
    assert _overlap_ns(a_start[placed], a_end[placed], c_start, c_end) == int((a_end - a_start)[placed].sum())
