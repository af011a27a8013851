"""Plot data for the "all events" view: what each CPU thread and GPU stream was busy with.

This view needs only the loader's tables, so it works for every trace, with or without FSDP
labels (e.g. DDP jobs on GPU). Each lane's events in the step are sorted into a few categories and
merged into busy intervals per category: nested CPU ops become one interval per burst, and a
stream's back-to-back kernels one block, which keeps the page small without hiding gaps.

Categories (drawing order: later ones are drawn on top):
- ``CPU ops``: CPU operators and runtime calls (kernel launches) on a CPU thread;
- ``compute``: GPU kernels that are not communication;
- ``memcpy / memset``: GPU copies and fills;
- ``communication``: NCCL kernels, gloo collectives on their worker threads, and the CPU ops that
  issue or wait for a collective (``c10d::...``).
Other ``record_function`` annotations are left out: they are ranges around other events, not work.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from fsdpviz.report.style import COMM_COLOR, COMPUTE_COLOR, OTHER_COLOR
from fsdpviz.report.timeline.steps import StepChoice, cap_segments, to_ms
from fsdpviz.structure.intervals import clip_rows
from fsdpviz.trace import schema

CAT_CPU = "CPU ops"
CAT_COMPUTE = "compute"
CAT_COPY = "memcpy / memset"
CAT_COMM = "communication"
CATEGORIES = (CAT_CPU, CAT_COMPUTE, CAT_COPY, CAT_COMM)
CATEGORY_COLORS = {CAT_CPU: "#b9c9dc", CAT_COMPUTE: COMPUTE_COLOR, CAT_COPY: OTHER_COLOR, CAT_COMM: COMM_COLOR}

def lane_rows(lanes: pd.DataFrame, ranks: Sequence[int], used: pd.DataFrame | None = None) -> pd.DataFrame:
    """One Gantt row per (rank, lane), ranks in order and lanes in the loader's display order.

    ``used`` (columns ``rank``, ``lane``) keeps only lanes that have something to draw. Returns
    ``row`` (0 = top), ``rank``, ``lane``, ``lane_kind`` and ``label`` ("rank 0 · main").
    """
    rows = lanes[lanes["rank"].isin(list(ranks))].copy()
    rows["lane"] = rows["lane"].astype(str)
    if used is not None:
        keep = set(zip(used["rank"].astype(int), used["lane"].astype(str)))
        rows = rows[[(int(r), lane) in keep for r, lane in zip(rows["rank"], rows["lane"])]]
    rows = rows.sort_values(["rank", "order", "lane"], kind="stable").reset_index(drop=True)
    rows["row"] = np.arange(len(rows), dtype=np.int64)
    rows["label"] = [f"rank {int(r)} · {lane}" for r, lane in zip(rows["rank"], rows["lane"])]
    return rows[["row", "rank", "lane", "lane_kind", "label"]]


def classify_events(events: pd.DataFrame) -> pd.Series:
    """The drawing category of each event (see module docstring); ``""`` for events not drawn."""
    kind = events["kind"].astype(str).to_numpy()
    comm = events["comm"].astype(str).to_numpy() != ""
    out = np.full(len(events), "", dtype=object)
    cpu = np.isin(kind, [schema.KIND_CPU_OP, schema.KIND_RUNTIME])
    out[cpu] = CAT_CPU
    out[kind == schema.KIND_KERNEL] = CAT_COMPUTE
    out[np.isin(kind, [schema.KIND_MEMCPY, schema.KIND_MEMSET])] = CAT_COPY
    # gloo collectives are user_annotation ranges on their worker threads, so annotations count
    # when they are communication.
    out[comm & (cpu | (kind == schema.KIND_KERNEL) | (kind == schema.KIND_ANNOTATION))] = CAT_COMM
    return pd.Series(out, index=events.index, name="category")


def event_segments(events: pd.DataFrame, rows: pd.DataFrame, choice: StepChoice,
                      max_segments: int) -> tuple[pd.DataFrame, bool]:
    """Busy intervals per (lane row, category) during ``choice``'s step, at most ``max_segments``.

    Returns the segments (``row``, ``rank``, ``lane``, ``category``, ``start_ns``, ``end_ns``,
    ``n_merged``, ``busy_ns``, ``name`` of the longest event, ``x0_ms``, ``x1_ms``, ``dur_ms``,
    ``color``) and whether segments were merged beyond plain overlap to fit the budget.
    """
    window = _in_window(events, choice)
    window = window.assign(category=classify_events(window))
    window = window[window["category"] != ""]
    keyed = window.assign(lane=window["lane"].astype(str), name=window["name"].astype(str))
    keyed = keyed.merge(rows[["rank", "lane", "row"]], on=["rank", "lane"], how="inner")
    keyed = clip_rows(keyed[["row", "rank", "lane", "category", "name", "start_ns", "end_ns"]],
                           choice.origin_ns, choice.end_ns)
    segments, capped = cap_segments(keyed, ["row", "category"], max_segments, label="name")
    segments = segments.merge(rows[["row", "rank", "lane"]], on="row", how="left")
    segments = to_ms(segments, choice.origin_ns)
    segments["color"] = segments["category"].map(CATEGORY_COLORS)
    order = {cat: i for i, cat in enumerate(CATEGORIES)}
    segments = segments.sort_values(by=["category", "row", "start_ns"], key=lambda c: c.map(order)
                                    if c.name == "category" else c, kind="stable")
    return segments.reset_index(drop=True), capped


def _in_window(events: pd.DataFrame, choice: StepChoice) -> pd.DataFrame:
    end = events["start_ns"] + events["dur_ns"]
    inside = (end > choice.origin_ns) & (events["start_ns"] < choice.end_ns)
    return events[inside].assign(end_ns=end[inside])
