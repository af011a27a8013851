"""Where the host's wait for a CPU collective begins (``replay.recording._with_wait_start``), on spans
built by hand: the answer is known by construction."""

from __future__ import annotations

import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.replay.recording import _with_wait_start

AG, COMPUTE = vocabulary.ALL_GATHER, "compute"


def _spans(rows: list[tuple[str, str, int, int, int]]) -> pd.DataFrame:
    """(kind, lane, issue, start, end) per row, in a shuffled index as the analysis hands them over."""
    frame = pd.DataFrame(rows, columns=["kind", "lane", "issue_ns", "start_ns", "end_ns"])
    return frame.set_axis([10 * i + 7 for i in range(len(frame))])


def test_a_collective_waits_from_its_issue_when_nothing_runs_before_it() -> None:
    out = _with_wait_start(_spans([(AG, "gloo 0", 100, 100, 200), (COMPUTE, "main", 250, 250, 300),
                                   (AG, "gloo 0", 400, 400, 450)]))
    assert out["wait_from_ns"].tolist() == [100, 250, 400]  # compute keeps its issue


def test_a_collective_queued_behind_one_on_the_other_gloo_thread_waits_from_its_end() -> None:
    """ZeRO-3's prefetches: B is issued while A runs on the other gloo thread; B's own wait starts
    when A ends (read per thread, it started at B's issue and counted A's time twice)."""
    out = _with_wait_start(_spans([(AG, "gloo 0", 0, 0, 100), (AG, "gloo 1", 10, 12, 160),
                                   (AG, "gloo 0", 20, 101, 170)]))
    assert out["wait_from_ns"].tolist() == [0, 100, 160]


def test_rows_of_one_collective_share_its_wait_start() -> None:
    """A bucket that gathered three units is three rows with the same times: all wait from the end of
    the collective before them, however many rows the bucket has."""
    out = _with_wait_start(_spans([(AG, "gloo 1", 0, 0, 50)] + [(AG, "gloo 0", 5, 6, 90)] * 3))
    assert out["wait_from_ns"].tolist() == [0, 50, 50, 50]
