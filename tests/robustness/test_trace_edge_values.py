"""Values at the edges of what a trace can hold, each once broke the loader (found by the
property tests in ``test_fuzz_traces.py``): integers beyond int64, times beyond the int64
nanosecond range, ranks, world sizes and step numbers beyond int32, NaN literals beside oddly
typed fields. Each must be skipped and counted (or ignored), never crash or wrap around.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fsdpviz.trace import load_traces


def test_times_beyond_the_int64_ns_range_are_skipped(tmp_path: Path) -> None:
    """Regression: a duration or timestamp beyond the int64 nanosecond range is skipped and
    counted, not wrapped into a negative duration."""
    doc = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1e300},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1e300, "dur": 5.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 10**30},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": -1e300, "dur": 5.0},
    ]}
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    with np.errstate(all="raise"):  # no "invalid value encountered in cast" on the way
        traces = load_traces([path], cache=False)
    assert traces.events["dur_ns"].tolist() == [5000]
    assert traces.ranks["n_skipped"].tolist() == [4]
    assert math.isfinite(traces.events["start_ns"].iloc[0])


@pytest.mark.parametrize("step_name", ["ProfilerStep#99999999999999999999", "ProfilerStep#2147483648"])
def test_step_numbers_beyond_int32_are_not_steps(tmp_path: Path, step_name: str) -> None:
    doc = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": step_name, "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 100.0, "dur": 100.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 120.0, "dur": 5.0},
    ]}
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(doc))
    traces = load_traces([path], cache=False)
    assert traces.steps["step"].tolist() == [3]


_OK = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 5.0}
BEYOND_INT64 = {
    "External id": {**_OK, "args": {"External id": 2**63 + 5}},
    "pid": {**_OK, "pid": 2**63 + 5},
    "stream": {**_OK, "cat": "kernel", "args": {"stream": 2**64 - 1, "device": 0}},
    "Total Allocated": {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10.0,
                        "args": {"Total Allocated": 2**63 + 1, "Device Type": 0}},
    "memory sample time": {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1e300,
                           "args": {"Total Allocated": 5, "Device Type": 0}},
    "Device Id": {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10.0,
                  "args": {"Total Allocated": 5, "Device Type": 1, "Device Id": 2**63 + 1}},
    "message size": {**_OK, "name": "record_param_comms", "args": {
        "Collective name": "allgather", "In msg nelems": 2**63 + 1, "Out msg nelems": 2**64 - 1, "dtype": "Float"}},
}


@pytest.mark.parametrize("field", sorted(BEYOND_INT64))
def test_integers_beyond_int64_skip_their_event(field: str, tmp_path: Path) -> None:
    """Regression: JSON integers of 2**63 and more overflowed numpy columns (OverflowError)."""
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"traceEvents": [_OK, BEYOND_INT64[field]]}))
    traces = load_traces([path], cache=False)
    assert len(traces.events) == 1 and traces.ranks["n_skipped"].tolist() == [1]
    assert traces.memory.empty


def test_gathered_bytes_beyond_int64_are_unknown(tmp_path: Path) -> None:
    event = {**_OK, "cat": "user_annotation", "name": "gloo:all_gather", "tid": 2,
             "args": {"Input Dims": [[2**62, 2**62]], "Input type": ["float"]}}
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"traceEvents": [_OK, event]}))
    traces = load_traces([path], cache=False)
    assert traces.events["comm_bytes"].tolist() == [-1, -1] and traces.events["comm"].tolist() == ["", "all_gather"]


@pytest.mark.parametrize(("header", "rank", "world_size"), [
    ({"distributedInfo": {"rank": 2**63 + 1, "world_size": 2}}, 3, -1),  # the whole header is unreadable
    ({"distributedInfo": {"rank": 2**40, "world_size": 2}}, 3, 2),
    ({"distributedInfo": {"rank": 0, "world_size": 2**32 + 1}}, 0, -1),
    ({"baseTimeNanoseconds": 2**63 + 1}, 3, -1),
    ({"baseTimeNanoseconds": 9 * 10**18}, 3, -1),
])
def test_absurd_header_numbers_are_ignored(header: dict[str, Any], rank: int, world_size: int,
                                           tmp_path: Path) -> None:
    """Regression: a rank or world size beyond int32 wrapped around (world size 2**32 + 1 became 1),
    a huge base time overflowed every timestamp."""
    path = tmp_path / "rank3.json"  # the rank in the file name is the fallback
    path.write_text(json.dumps({**header, "traceEvents": [_OK]}))
    traces = load_traces([path], cache=False)
    assert traces.rank_ids == [rank] and traces.ranks["world_size"].tolist() == [world_size]
    assert traces.events["start_ns"].tolist() == [10_000] and traces.events["dur_ns"].tolist() == [5_000]


def test_nan_literal_beside_an_oddly_typed_field(tmp_path: Path) -> None:
    """Regression: a string duration before a NaN literal made the file "not a Kineto trace"."""
    path = tmp_path / "odd.json"
    path.write_text('{"traceEvents": [' + json.dumps(_OK) + ', {"ph": "X", "cat": "cpu_op", "name": "s", "pid": 1, '
                    '"tid": 1, "ts": 1, "dur": "5"}, {"ph": "X", "cat": "cpu_op", "name": "n", "pid": 1, "tid": 1, '
                    '"ts": 1, "dur": NaN}]}')
    traces = load_traces([path], cache=False)
    assert len(traces.events) == 1 and traces.ranks["n_skipped"].tolist() == [2]
