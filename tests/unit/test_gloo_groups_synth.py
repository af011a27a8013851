"""gloo collectives of two process groups with tensors of one size, on a hand-written CPU trace whose
answer is known by construction (times in µs):

    main thread       fsdpviz.group 1  10-20   c10d::_allgather_base_ (shard 64)  12-15
                      fsdpviz.group 2  30-40   c10d::_allgather_base_ (shard 64)  32-35
    gloo pg 2 thread  gloo:all_gather (64)  40-60      <- group 2's, run first
    gloo pg 1 thread  gloo:all_gather (64)  200-260    <- group 1's, held up behind other work

Group 1's call comes first, its run last. In issue order by size, group 1's call would get the run at
40-60: with the groups named, it gets 200-260. A trace whose threads do not name their groups
(recorded without fsdpviz) keeps the old pairing: it has nothing else to go by.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from helpers.kineto import MAIN_TID, TraceBuilder

from fsdpviz.structure.collectives import find_collectives, thread_group
from fsdpviz.trace.loader import load_traces

SHARD = 64
GATHER_ARGS = {"Input Dims": [[2 * SHARD], [SHARD], [], [], []], "Input type": ["float", "float", "", "", ""]}


def _trace(tmp_path: Path, *, named: bool) -> pd.DataFrame:
    b = TraceBuilder(rank=0, world_size=2, base_time_ns=1_700_000_000_000_000_000)
    b.thread(MAIN_TID, "python")
    b.thread(2001, "gloo pg 1" if named else "pt_gloo_runloop")
    b.thread(2002, "gloo pg 2" if named else "pt_gloo_runloop")
    b.step(1, 0, 1000)
    for group, start in (("1", 10), ("2", 30)):
        b.annotation(f"fsdpviz.group {group}", start, 10)
        b.cpu_op("c10d::_allgather_base_", start + 2, 3, **GATHER_ARGS)
    b.cpu_op("gloo:all_gather", 40, 20, tid=2002, **{"Input Dims": [[SHARD]], "Input type": ["float"]})
    b.cpu_op("gloo:all_gather", 200, 60, tid=2001, **{"Input Dims": [[SHARD]], "Input type": ["float"]})
    b.write(tmp_path / "rank0.trace.json")
    traces = load_traces([tmp_path])
    return find_collectives(traces.events, traces.lanes)


def test_each_call_gets_its_own_groups_run(tmp_path: Path) -> None:
    coll = _trace(tmp_path, named=True).set_index("pg")
    base = 1_700_000_000_000_000_000
    assert sorted(coll.index) == ["1", "2"]
    assert (coll.loc["1", "issue_ns"] - base, coll.loc["1", "start_ns"] - base, coll.loc["1", "end_ns"] - base) \
        == (12_000, 200_000, 260_000)
    assert (coll.loc["2", "issue_ns"] - base, coll.loc["2", "start_ns"] - base, coll.loc["2", "end_ns"] - base) \
        == (32_000, 40_000, 60_000)


def test_unnamed_threads_pair_by_size_in_issue_order(tmp_path: Path) -> None:
    coll = _trace(tmp_path, named=False).sort_values("issue_ns")
    base = 1_700_000_000_000_000_000
    # nothing tells the groups apart: the first call gets the first run (the call's label still names it)
    assert (coll["start_ns"] - base).tolist() == [40_000, 200_000]
    assert coll["pg"].tolist() == ["1", "2"]


@pytest.mark.parametrize(("name", "group"), [
    ("gloo pg 3", "3"), ("python / gloo pg 12", "12"), ("pt_gloo_runloop", ""), ("python", ""),
])
def test_thread_group(name: str, group: str) -> None:
    assert thread_group(name) == group
