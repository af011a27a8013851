"""Plot data for the time-line views: which step to draw, lane rows, and capped span segments.

The Gantt of a step is the most detailed view of the report and the one that stops scaling first:
a GPU step can hold tens of thousands of kernels per rank, and a browser draws ~1e5 rectangles
before zooming turns sluggish (headless Chromium, bokeh's canvas: 1e5 spans draw in about 3 s and
zoom at ~0.5 s a frame; see docs/performance.md).
So the page shows one representative step (the median one, and the slowest one), and when a
step holds more segments than the budget, neighbouring segments of the same lane, colour and
kind are merged, tolerating growing gaps, until the step fits. Merged segments keep their count
(``n_merged``) so the hover says what was aggregated.

Everything here is pandas on the analysis tables: times stay integer ns until the final
conversion to ms relative to the step's origin (the earliest start of that step on any rank),
so that ranks share one time axis and their skew stays visible.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from fsdpviz.formatting import NS_PER_MS
from fsdpviz.structure.intervals import merge_rows
from fsdpviz.trace.schema import NO_STEP

# Spans drawn on one page, all Gantt tabs together (see module docstring).
MAX_PAGE_SEGMENTS = 100_000


@dataclass(frozen=True, slots=True)
class StepChoice:
    """A step chosen for the time-line views, with the window drawn for it."""

    label: str  # "median step 12"
    step: int
    origin_ns: int  # earliest start of the step over all ranks: x = 0 ms
    end_ns: int  # latest end of the step over all ranks
    duration_ms: float  # end - origin, the step's wall time across ranks


def step_wall_times(steps: pd.DataFrame) -> pd.DataFrame:
    """Per step: earliest start and latest end over ranks, and the wall time in ms.

    ``steps`` is a STEPS table. Returns columns ``step``, ``origin_ns``, ``end_ns``,
    ``duration_ms``, sorted by step.
    """
    if steps.empty:
        return pd.DataFrame({"step": pd.Series(dtype="int64"), "origin_ns": pd.Series(dtype="int64"),
                             "end_ns": pd.Series(dtype="int64"), "duration_ms": pd.Series(dtype="float64")})
    wall = steps.groupby("step", sort=True).agg(origin_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    wall["duration_ms"] = (wall["end_ns"] - wall["origin_ns"]) / NS_PER_MS
    return wall.reset_index()


def choose_steps(steps: pd.DataFrame, analysed: Sequence[int] | None = None) -> list[StepChoice]:
    """The median step (by wall time) and, when different, the slowest one.

    The median is the lower median, so it is a step that happened, never an average of two.
    ``analysed`` restricts the choice to the analysis window when given.
    """
    wall = step_wall_times(steps)
    if analysed is not None and len(analysed):
        wall = wall[wall["step"].isin(list(analysed))]
    if wall.empty:
        return []
    ordered = wall.sort_values(["duration_ms", "step"], kind="stable").reset_index(drop=True)
    median = (len(ordered) - 1) // 2
    slowest = len(ordered) - 1
    choices = [_choice("median step", ordered, median)]
    if int(ordered["step"].iloc[slowest]) != int(ordered["step"].iloc[median]):
        choices.append(_choice("slowest step", ordered, slowest))
    return choices


def _choice(kind: str, wall: pd.DataFrame, pos: int) -> StepChoice:
    # Column by column: a row Series would upcast the int64 ns to float64 and lose precision.
    step = int(wall["step"].iloc[pos])
    return StepChoice(label=f"{kind} {step}", step=step, origin_ns=int(wall["origin_ns"].iloc[pos]),
                      end_ns=int(wall["end_ns"].iloc[pos]), duration_ms=float(wall["duration_ms"].iloc[pos]))


def whole_trace_choice(events: pd.DataFrame) -> StepChoice | None:
    """The whole recording as one "step", for traces without ProfilerStep ranges."""
    if events.empty:
        return None
    origin = int(events["start_ns"].min())
    end = int((events["start_ns"] + events["dur_ns"]).max())
    return StepChoice(label="whole trace", step=NO_STEP, origin_ns=origin, end_ns=end,
                      duration_ms=(end - origin) / NS_PER_MS)


def cap_segments(df: pd.DataFrame, keys: Sequence[str], max_segments: int,
                 label: str | None = None) -> tuple[pd.DataFrame, bool]:
    """Merge same-``keys`` neighbours with growing gaps until at most ``max_segments`` rows remain.

    Returns the merged table and whether separate (non-overlapping) intervals had to be joined to
    fit the budget. ``df`` must carry ``start_ns``/``end_ns``; rows get ``n_merged`` and
    ``busy_ns``. The gap doubles from 1 µs, so the result keeps as much detail as the budget allows.
    """
    merged = merge_rows(df, keys, gap_ns=0, label=label)
    if len(merged) <= max_segments:
        return merged, False
    gap_ns = 1_000
    span_ns = int(df["end_ns"].max() - df["start_ns"].min()) if len(df) else 0
    while len(merged) > max_segments and gap_ns <= max(span_ns, 1):
        merged = merge_rows(df, keys, gap_ns=gap_ns, label=label)
        gap_ns *= 2
    return merged, True


def to_ms(df: pd.DataFrame, origin_ns: int) -> pd.DataFrame:
    """Add ``x0_ms``/``x1_ms`` (relative to ``origin_ns``) and ``dur_ms`` to a table of intervals."""
    out = df.copy()
    out["x0_ms"] = (out["start_ns"] - origin_ns) / NS_PER_MS
    out["x1_ms"] = (out["end_ns"] - origin_ns) / NS_PER_MS
    out["dur_ms"] = (out["end_ns"] - out["start_ns"]) / NS_PER_MS
    return out
