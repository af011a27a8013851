"""Plot data of the time-line views: step choice, interval merging, capping, exposed pieces."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fsdpviz.formatting import NS_PER_MS
from fsdpviz.report.timeline import steps as timeline
from fsdpviz.structure import intervals


def _steps(durations_ms: dict[int, list[float]], skew_ns: int = 0) -> pd.DataFrame:
    rows = []
    t = 1_000_000_000
    for step, per_rank in sorted(durations_ms.items()):
        for rank, dur_ms in enumerate(per_rank):
            start = t + rank * skew_ns
            rows.append({"rank": rank, "step": step, "start_ns": start, "end_ns": start + int(dur_ms * NS_PER_MS)})
        t += int(max(per_rank) * NS_PER_MS) + 10 * NS_PER_MS
    return pd.DataFrame(rows)


def test_choose_steps_picks_lower_median_and_slowest_by_wall_time() -> None:
    # GIVEN steps whose wall time over both ranks is 10, 30, 20, 50 ms (rank 1 sets the wall time)
    steps = _steps({3: [8, 10], 4: [12, 30], 5: [20, 5], 6: [50, 1]})
    # WHEN choosing
    choices = timeline.choose_steps(steps)
    # THEN the lower median of (10, 20, 30, 50) is 20 ms -> step 5; the slowest is step 6
    assert [c.step for c in choices] == [5, 6]
    assert choices[0].label == "median step 5"
    assert choices[1].duration_ms == pytest.approx(50.0)


def test_choose_steps_origin_is_earliest_rank_and_respects_window() -> None:
    steps = _steps({1: [10, 10], 2: [40, 40], 3: [20, 20]}, skew_ns=2 * NS_PER_MS)
    steps[["start_ns", "end_ns"]] += 1_795_339_020_862_150_503  # wall-clock ns: float64 would round
    choices = timeline.choose_steps(steps, analysed=[1, 3])
    assert [c.step for c in choices] == [1, 3]  # step 2 (slowest overall) is outside the window
    first = steps[steps["step"] == 1]
    assert choices[0].origin_ns == first["start_ns"].min()
    assert choices[0].end_ns == first["end_ns"].max()
    assert choices[0].duration_ms == pytest.approx(12.0)  # 10 ms + 2 ms of skew


def test_single_step_gives_one_choice() -> None:
    assert [c.label for c in timeline.choose_steps(_steps({7: [5.0]}))] == ["median step 7"]
    assert timeline.choose_steps(_steps({})) == []


def test_merge_intervals_unions_per_group_and_counts() -> None:
    df = pd.DataFrame({
        "row": [0, 0, 0, 0, 1],
        "unit": ["a", "a", "a", "b", "a"],
        "start_ns": [0, 50, 200, 60, 0],
        "end_ns": [100, 120, 300, 70, 10],
    })
    out = intervals.merge_rows(df, ["row", "unit"]).sort_values(["row", "unit", "start_ns"])
    assert out[["row", "unit", "start_ns", "end_ns", "n_merged"]].values.tolist() == [
        [0, "a", 0, 120, 2], [0, "a", 200, 300, 1], [0, "b", 60, 70, 1], [1, "a", 0, 10, 1]]
    assert out["busy_ns"].tolist() == [170, 100, 10, 10]
    bridged = intervals.merge_rows(df, ["row", "unit"], gap_ns=80)
    assert len(bridged[(bridged["row"] == 0) & (bridged["unit"] == "a")]) == 1


def test_cap_segments_respects_budget_and_keeps_total_count() -> None:
    rng = np.random.default_rng(1)
    n = 5_000
    starts = np.sort(rng.integers(0, 10_000_000, n))
    df = pd.DataFrame({"row": rng.integers(0, 4, n), "unit": rng.choice(["a", "b"], n),
                       "start_ns": starts, "end_ns": starts + rng.integers(100, 2_000, n)})
    capped, merged = timeline.cap_segments(df, ["row", "unit"], max_segments=300)
    assert merged and len(capped) <= 300
    assert capped["n_merged"].sum() == n  # every input span is accounted for
    # nothing crosses groups: every merged segment lies within its group's original extent
    for (row, unit), grp in capped.groupby(["row", "unit"]):
        orig = df[(df["row"] == row) & (df["unit"] == unit)]
        assert grp["start_ns"].min() == orig["start_ns"].min()
        assert grp["end_ns"].max() == orig["end_ns"].max()
    untouched, merged = timeline.cap_segments(df.iloc[:10], ["row", "unit"], max_segments=300)
    assert not merged and untouched["n_merged"].sum() == 10


def test_intersect_intervals_cuts_rows_by_cover_of_same_rank() -> None:
    spans = pd.DataFrame({"rank": [0, 0, 1], "unit": ["a", "b", "a"],
                          "start_ns": [0, 100, 0], "end_ns": [100, 300, 100]})
    exposed = pd.DataFrame({"rank": [0, 0, 0, 1], "start_ns": [20, 90, 250, 500], "end_ns": [40, 150, 260, 600]})
    out = intervals.cover_rows(spans, exposed).sort_values(["unit", "start_ns"])
    assert out[["unit", "start_ns", "end_ns"]].values.tolist() == [
        ["a", 20, 40], ["a", 90, 100], ["b", 100, 150], ["b", 250, 260]]
    assert set(out["rank"]) == {0}  # rank 1's exposure lies outside its span


def test_clip_and_to_ms() -> None:
    df = pd.DataFrame({"start_ns": [0, 5 * NS_PER_MS, 50 * NS_PER_MS], "end_ns": [10 * NS_PER_MS, 20 * NS_PER_MS, 60 * NS_PER_MS]})
    out = timeline.to_ms(intervals.clip_rows(df, 8 * NS_PER_MS, 30 * NS_PER_MS), 8 * NS_PER_MS)
    assert out[["x0_ms", "x1_ms", "dur_ms"]].values.tolist() == [[0.0, 2.0, 2.0], [0.0, 12.0, 12.0]]
