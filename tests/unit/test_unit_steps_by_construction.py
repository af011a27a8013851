"""The per-unit step table and the cross-rank skew on tables whose answer is known by construction.

Both are reduced with numpy over group codes (fsdpviz/analysis/unit_overlap.py ``unit_steps``,
fsdpviz/structure/crossrank.py ``collective_skew``); these hold their times, sizes, exposures, leads,
depths, early and late ranks and units to values worked out by hand from the spans: a pass with
several gathers (first, last, summed), a gather several units share (its time split by their sizes,
its exposure the first computing unit's), the rows with nothing of a kind (-1 / 0), the ties, and rows
a hand-made table may hold with a gap in its key.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdpviz.analysis.unit_overlap import unit_steps
from fsdpviz.structure.crossrank import collective_skew
from fsdpviz.structure.intervals import union_intervals
from fsdpviz.trace import schema

UNKNOWN_BYTES = -1


def _spans(rows: list[tuple]) -> pd.DataFrame:
    """SPANS rows of rank 0, step 1, micro 0: (unit, phase, kind, start, end, bytes, issue)."""
    frame = pd.DataFrame(rows, columns=["unit", "phase", "kind", "start_ns", "end_ns", "bytes", "issue_ns"])
    return schema.conform(frame.assign(rank=0, step=1, lane="main", n_units=1, micro=0), schema.SPANS)


# Unit a gathers [0, 100] (nothing computes: all exposed), computes [100, 300]; b's gather [150, 250]
# runs under a's compute (hidden, one unit ahead), b computes [300, 400]. Backward: b computes [500, 600]
# and reduces [600, 700] (nothing computes then), a computes [700, 800] and reduces [800, 900].
SPANS = [("a", "forward", "all_gather", 0, 100, 64, 0), ("a", "forward", "compute", 100, 300, UNKNOWN_BYTES, 100),
         ("b", "forward", "all_gather", 150, 250, 32, 140), ("b", "forward", "compute", 300, 400, UNKNOWN_BYTES, 300),
         ("b", "backward", "compute", 500, 600, UNKNOWN_BYTES, 500),
         ("b", "backward", "reduce_scatter", 600, 700, 32, 600),
         ("a", "backward", "compute", 700, 800, UNKNOWN_BYTES, 700),
         ("a", "backward", "reduce_scatter", 800, 900, 64, 800)]
WINDOWS = pd.DataFrame({"rank": 0, "step": 1, "micro": 0, "unit": ["a", "b", "b", "a"],
                        "phase": ["forward", "forward", "backward", "backward"],
                        "start_ns": [0, 140, 480, 690], "end_ns": [300, 400, 700, 900]})


def _compute(spans: pd.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    comp = spans[(spans["kind"] == "compute").to_numpy()]
    return {0: union_intervals(comp["start_ns"].to_numpy(np.int64), comp["end_ns"].to_numpy(np.int64))}


def test_every_column_is_the_spans_own() -> None:
    spans = _spans(SPANS)
    us = unit_steps(spans, WINDOWS, _compute(spans)).set_index(["unit", "phase"])
    assert list(us.index) == [("a", "forward"), ("b", "forward"), ("b", "backward"), ("a", "backward")]
    a, b = us.loc[("a", "forward")], us.loc[("b", "forward")]
    assert (a["compute_ns"], a["compute_start_ns"], a["compute_end_ns"]) == (200, 100, 300)
    assert (a["ag_ns"], a["ag_exposed_ns"], a["ag_bytes"], a["ag_issue_ns"], a["ag_start_ns"], a["ag_end_ns"]) == (
        100, 100, 64, 0, 0, 100)
    assert (b["ag_ns"], b["ag_exposed_ns"], b["ag_bytes"], b["ag_issue_ns"]) == (100, 0, 32, 140)
    assert b["prefetch_lead_ns"] == 50 and b["issue_depth"] == 1  # a computed while b's gather ran
    assert a["prefetch_lead_ns"] == 0 and (a["window_start_ns"], a["window_end_ns"]) == (0, 300)
    for unit in ("a", "b"):  # no gather in backward: -1 where a time or a size, 0 where a duration
        back = us.loc[(unit, "backward")]
        assert (back["ag_ns"], back["ag_exposed_ns"]) == (0, 0)
        assert (back["ag_bytes"], back["ag_start_ns"], back["ag_issue_ns"]) == (-1, -1, -1)
        assert np.isnan(back["prefetch_lead_ns"]) and back["issue_depth"] == schema.NO_DEPTH
        assert (back["compute_ns"], back["rs_ns"], back["rs_exposed_ns"], back["ar_ns"]) == (100, 100, 100, 0)
    assert (us["n_passes"] == 1).all()


def test_a_pass_with_two_gathers_and_a_gather_two_units_share() -> None:
    """Units a and b share one gather [0, 100] (a ZeRO-3 bucket: one row per unit, ``n_units`` 2) and
    compute [100, 200] and [200, 300]; c gathers twice, [400, 450] and [460, 500] (issued at 390 and
    455, 8 bytes each), and computes [520, 560] and [570, 600]. Nothing computes while any gather runs."""
    rows = [("a", "forward", "all_gather", 0, 100, 64, 0), ("b", "forward", "all_gather", 0, 100, 64, 0),
            ("a", "forward", "compute", 100, 200, UNKNOWN_BYTES, 100),
            ("b", "forward", "compute", 200, 300, UNKNOWN_BYTES, 200),
            ("c", "forward", "all_gather", 400, 450, 8, 390), ("c", "forward", "all_gather", 460, 500, 8, 455),
            ("c", "forward", "compute", 520, 560, UNKNOWN_BYTES, 520),
            ("c", "forward", "compute", 570, 600, UNKNOWN_BYTES, 570)]
    spans = _spans(rows)
    spans.loc[:1, "n_units"] = 2
    windows = pd.DataFrame({"rank": 0, "step": 1, "micro": 0, "unit": ["a", "b", "c"], "phase": "forward",
                            "start_ns": [0, 0, 380], "end_ns": [200, 300, 600]})
    us = unit_steps(spans, windows, _compute(spans), unit_bytes={"a": 1, "b": 3}).set_index("unit")
    # the shared gather's 100 ns split 1:3 by the units' sizes; its exposure is a's, which computes first
    assert (us.loc["a", "ag_ns"], us.loc["a", "ag_exposed_ns"]) == (25, 100)
    assert (us.loc["b", "ag_ns"], us.loc["b", "ag_exposed_ns"]) == (75, 0)
    c = us.loc["c"]
    assert (c["ag_ns"], c["ag_exposed_ns"], c["ag_bytes"]) == (90, 90, 16)  # 50 + 40 ns, 8 + 8 bytes
    assert (c["ag_issue_ns"], c["ag_start_ns"], c["ag_end_ns"]) == (390, 400, 500)  # the first, the first, the last
    assert (c["compute_start_ns"], c["compute_end_ns"], c["compute_ns"], c["prefetch_lead_ns"]) == (520, 600, 70, 20)
    assert c["issue_depth"] == 0  # a's and b's compute ended before c's first gather started
    assert (c["window_start_ns"], c["window_end_ns"]) == (380, 600)


def test_a_hand_made_row_without_a_unit_changes_no_other_row() -> None:
    """A row whose unit is missing (a hand-made table; conformed spans have none) is kept apart: the
    units' rows are what they are without it (the table of the test above, worked out by hand)."""
    whole = _spans(SPANS)
    gap = pd.concat([whole, whole.iloc[[2]].assign(start_ns=160, end_ns=170)], ignore_index=True)
    gap["unit"] = gap["unit"].astype(object)
    gap.loc[len(gap) - 1, "unit"] = np.nan
    expected = unit_steps(whole, WINDOWS, _compute(whole))
    got = unit_steps(gap, WINDOWS, _compute(gap))
    named = got[got["unit"].notna().to_numpy()].reset_index(drop=True)
    pd.testing.assert_frame_equal(named, expected)
    [row] = got[got["unit"].isna().to_numpy()].to_dict(orient="records")  # its own row, nothing counted
    assert (row["ag_ns"], row["ag_exposed_ns"], row["ag_bytes"], row["ag_start_ns"]) == (0, 0, -1, -1)


def _collectives(rows: list[tuple]) -> pd.DataFrame:
    """One collective's rows: (rank, start, unit, kind), step 1, group g, all_gather, seq 0."""
    frame = pd.DataFrame(rows, columns=["rank", "start_ns", "unit", "kind"])
    return frame.assign(step=1, pg="g", comm="all_gather", seq=0, phase="forward").astype(
        {"unit": "string", "kind": "string", "pg": "string", "comm": "string", "phase": "string"})


def test_skew_names_the_early_and_late_rank_and_the_unit_as_the_reference_rank_saw_it() -> None:
    # ranks 1 and 2 start together first (the lower is the early one); rank 0 starts 150 ns later
    coll = _collectives([(0, 250, "", ""), (2, 100, "blocks.1", "all_gather"), (1, 100, "blocks.0", "all_gather")])
    [row] = collective_skew(coll, ref_rank=0).to_dict(orient="records")
    assert (row["early_rank"], row["late_rank"], row["first_start_ns"], row["start_skew_ns"]) == (1, 0, 100, 150)
    assert row["n_ranks"] == 3
    assert row["unit"] == "blocks.0"  # the reference rank named none: the lowest rank that did
    assert collective_skew(coll, ref_rank=2).iloc[0]["unit"] == "blocks.1"  # the reference rank's own


def test_skew_ties_and_gaps() -> None:
    # the latest start is shared by ranks 3 and 1: the lower one is the late rank
    tie = _collectives([(3, 300, "", ""), (1, 300, "", ""), (2, 100, "", "")])
    [row] = collective_skew(tie, ref_rank=0).to_dict(orient="records")
    assert (row["late_rank"], row["early_rank"], row["unit"]) == (1, 2, "")
    # a kind with a gap names no unit: the reference rank's row is passed over for the lowest rank's
    gaps = _collectives([(0, 200, "blocks.0", "all_gather"), (1, 150, "x", pd.NA)])
    assert collective_skew(gaps, ref_rank=1).iloc[0]["unit"] == "blocks.0"
    # seen on one rank only: not a cross-rank collective
    assert collective_skew(_collectives([(0, 100, "a", "all_gather")]), ref_rank=0).empty


def test_skew_keeps_collectives_apart_by_their_whole_key() -> None:
    """Two collectives of one step and group (the first and second all-gather of each rank) that start
    at the same time: two rows, each of two ranks, in key order where their first starts tie."""
    coll = pd.concat([_collectives([(0, 100, "", ""), (1, 130, "", "")]),
                      _collectives([(0, 160, "", ""), (1, 100, "", "")]).assign(seq=1)], ignore_index=True)
    out = collective_skew(coll, ref_rank=0)
    assert out["seq"].tolist() == [0, 1] and out["n_ranks"].tolist() == [2, 2]
    assert out["start_skew_ns"].tolist() == [30, 60] and out["late_rank"].tolist() == [1, 0]
    assert out["early_rank"].tolist() == [0, 1] and out.index.tolist() == [0, 1]
