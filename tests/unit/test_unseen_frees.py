"""Blocks the CPU profiler never saw freed: when they died, and a level without them.

One rank's allocator samples written by hand, as torch's CPU profiler writes them when a gloo thread
frees a block: no free event, and a running total that never comes down. What is alive at every
instant is known by construction, so the settled level must be exactly that.

    t   event                                                  alive after (bytes)
    100 A +1000 @1  inside the issuing op of collective 1      1000
        (issued 90-110, completes at 300)
    150 B  +500 @2  an activation                              1500
    200 D +2000 @3  in FSDP::all_gather (180-260), before its  3500   <- the true peak
        collective 2 is issued (220-230, completes at 500)
    300 -- collective 1 completes: gloo frees A (unseen)       2500
    400 B  -500 @2                                             2000
    500 -- collective 2 completes: gloo frees D (unseen)          0
    600 E +1000 @1  (A's address again)                        1000
    650 F  +300 @4  never freed, made for no collective        1300
    700 E -1000 @1                                              300
    800 G  +300 @5  made for no collective                      600
    ... G freed unseen
    900 H  +300 @5  (G's address again: G had died)             600
    950 H  -300 @5                                              300
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.unseen_frees import ADDRESS_REUSE, COLLECTIVE_END, settle, unseen_frees
from fsdpviz.structure.intervals import union_intervals
from fsdpviz.trace import schema

# (t, delta, addr) as the profiler recorded them: no event for the frees of A, D and G
EVENTS = [(100, 1000, 1), (150, 500, 2), (200, 2000, 3), (400, -500, 2), (600, 1000, 1), (650, 300, 4),
          (700, -1000, 1), (800, 300, 5), (900, 300, 5), (950, -300, 5)]
# what is alive after each instant (the table above), the frees the profiler missed included
ALIVE = {100: 1000, 150: 1500, 200: 3500, 300: 2500, 400: 2000, 500: 0, 600: 1000, 650: 1300, 700: 300,
         800: 600, 900: 600, 950: 300}


def profiler_samples() -> pd.DataFrame:
    t, delta, addr = (np.array(c, dtype=np.int64) for c in zip(*EVENTS))
    return schema.conform(pd.DataFrame({"rank": 0, "device": "cpu", "t_ns": t, "allocated_bytes": np.cumsum(delta),
                                        "reserved_bytes": 0, "delta_bytes": delta, "addr": addr}), schema.MEMORY)


def collectives() -> pd.DataFrame:
    return pd.DataFrame({"rank": [0, 0], "issue_lane": ["main", "main"], "issue_ns": [90, 220],
                         "end_ns": [300, 500], "start_ns": [120, 240]})


def issuing_ops() -> pd.DataFrame:
    return pd.DataFrame({"kind": [schema.KIND_CPU_OP] * 2, "lane": ["main", "main"], "start_ns": [90, 220],
                         "dur_ns": [20, 10], "name": ["c10d::_reduce_scatter_base_", "c10d::_allgather_base_"]})


def found() -> pd.DataFrame:
    gather_label = union_intervals(np.array([180], np.int64), np.array([260], np.int64))
    return unseen_frees(0, profiler_samples(), collectives(), issuing_ops(), gather_label)


def test_each_unseen_free_is_found_at_its_death() -> None:
    got = found().sort_values("alloc_ns").reset_index(drop=True)
    assert got[["addr", "bytes", "alloc_ns", "free_ns"]].values.tolist() == [
        [1, 1000, 100, 300],  # gloo's copy: when its collective completed
        [3, 2000, 200, 500],  # the all-gather's output: when the collective issued after it completed
        [5, 300, 800, 900],  # made for no collective: when its address was handed out again
    ]
    assert got["basis"].tolist() == [COLLECTIVE_END, COLLECTIVE_END, ADDRESS_REUSE]


def test_the_settled_level_is_what_is_alive() -> None:
    raw = profiler_samples()
    assert raw["allocated_bytes"].max() == 4300  # the profiler's own peak counts A, D and G after their death
    settled = settle(raw, found())
    level = dict(zip(settled["t_ns"].tolist(), settled["allocated_bytes"].tolist()))
    assert level == ALIVE
    assert settled["allocated_bytes"].max() == 3500


def test_settled_samples_pair_every_block() -> None:
    """The frees put in pair with their allocations (the reused address too), so the categories and
    a second look find nothing left unseen."""
    settled = settle(profiler_samples(), found())
    freed_at, _ = mcat.pair_frees(settled["addr"].to_numpy(np.int64), settled["delta_bytes"].to_numpy(np.int64))
    made = settled["delta_bytes"].to_numpy(np.int64) > 0
    alive = settled["addr"].to_numpy(np.int64)[made & (freed_at < 0)]
    assert alive.tolist() == [4]  # F alone: never freed, made for no collective
    again = unseen_frees(0, settled, collectives(), issuing_ops(),
                         union_intervals(np.array([180], np.int64), np.array([260], np.int64)))
    assert again.empty


def _labels(rows: list[tuple[int, int, str]]) -> pd.DataFrame:
    return pd.DataFrame({"start_ns": np.array([r[0] for r in rows], np.int64),
                         "end_ns": np.array([r[1] for r in rows], np.int64),
                         "unit": np.array([r[2] for r in rows], dtype=object)})


def _free_times(gathers: list[tuple[int, int, str]], copy_outs: list[tuple[int, int, str]]) -> dict[int, int]:
    """Per address, when ``unseen_frees`` frees its block, with FSDP2's gather labels ``gathers`` (the
    interval set too) and copy-out labels ``copy_outs`` (start, end, unit)."""
    starts = np.array([g[0] for g in gathers], np.int64)
    ends = np.array([g[1] for g in gathers], np.int64)
    got = unseen_frees(0, profiler_samples(), collectives(), issuing_ops(), union_intervals(starts, ends),
                       _labels(gathers), _labels(copy_outs))
    return dict(zip(got["addr"].tolist(), got["free_ns"].tolist()))


def test_an_all_gather_output_lives_until_its_copy_out_ends() -> None:
    """D, the all-gather output made in unit u's gather label (180-260) before the collective's op, is
    read by u's copy-out (520-560) after the collective completes (500): it dies no earlier than 560.
    A, made inside collective 1's own op (90-110) though a gather label of unit v holds it too, is gloo's
    copy, not an output: it still dies when its collective completes (300), whatever v's copy-out."""
    gathers = [(80, 115, "v"), (180, 260, "u")]
    assert _free_times(gathers, [(400, 450, "v"), (520, 560, "u")]) == {1: 300, 3: 560, 5: 900}
    # the copy-out is looked for only before the unit's next gather: after u is gathered again (510),
    # a copy-out reads that gather's output, not D
    assert _free_times([*gathers, (510, 515, "u")], [(520, 560, "u")]) == {1: 300, 3: 500, 5: 900}
    # no copy-out of u, or no labels at all: the collective's end, as before
    assert _free_times(gathers, [(520, 560, "v")]) == {1: 300, 3: 500, 5: 900}
    assert _free_times([(180, 260, "u")], []) == {1: 300, 3: 500, 5: 900}
