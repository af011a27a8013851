"""Plot data for the per-unit Gantt: the analysis' unit spans of one step, laid out per lane.

Input is the analysis' ``spans`` table (schema.SPANS: one row per piece of a unit's work:
copy-in, all-gather, copy-out, compute, reshard, reduce-scatter, all-reduce) and its per
(rank, step, unit, phase) metrics (``prefetch_lead_ns``). This module only selects the step,
assigns rows, colours and hover texts, marks the exposed part of each collective (the
communication time the overlap analysis found uncovered by computation on that rank) and places
each unit's memory peak on the curve. It computes no metric of its own.

Lane labels name what runs there ("rank 0 · stream 24 · all_gather") because stream numbers alone
mean nothing to a reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.formatting import NS_PER_MS, format_bytes, format_ms
from fsdpviz.report.style import PHASE_HATCH
from fsdpviz.report.timeline import events
from fsdpviz.report.timeline.steps import StepChoice, cap_segments, to_ms
from fsdpviz.report.timeline.view import StepView, exposed_on_segments
from fsdpviz.structure import label_rules

NO_UNIT = ""  # spans outside every unit: the analysis makes only the optimizer step one
NO_UNIT_LABEL = "optimizer step"
# The training loop's other work outside every unit, named on the Gantt: (label, colour, rule).
LOOP_PARTS = (
    ("zero_grad", "#c7c7c7", label_rules.is_zero_grad),
    ("data loading", "#8c6d31", label_rules.is_data_loading),
)
LOOP_PART_COLORS = {label: color for label, color, _ in LOOP_PARTS}


def unit_label(unit: str) -> str:
    """How a unit is named on the page (the optimizer step's spans belong to no unit)."""
    return NO_UNIT_LABEL if unit == NO_UNIT else unit


def unit_order(units: pd.DataFrame, spans: pd.DataFrame) -> list[str]:
    """Units in forward order: the unit table's ``order`` first, then units seen only in spans,
    by their first forward start."""
    known = units.sort_values("order")["unit"].astype(str).tolist() if not units.empty else []
    seen = set(known)
    if spans.empty:
        return known
    first = spans.groupby("unit", sort=False)["start_ns"].min().sort_values(kind="stable")
    return known + [str(u) for u in first.index if str(u) not in seen]


def _lane_roles(spans: pd.DataFrame) -> dict[tuple[int, str], str]:
    """The span kind that dominates each lane, to name it: counted over all ranks together, so that
    a lane of the same name reads the same on every rank (per rank, two gloo threads that each
    carry gathers and reductions would swap names from rank to rank)."""
    counts = spans.assign(lane=spans["lane"].astype(str), kind=spans["kind"].astype(str)).groupby(
        ["lane", "kind"]).size().rename("n").reset_index()
    counts = counts.sort_values(["lane", "n", "kind"], ascending=[True, False, True], kind="stable")
    top = dict(zip(counts.drop_duplicates("lane")["lane"], counts.drop_duplicates("lane")["kind"]))
    pairs = spans[["rank", "lane"]].drop_duplicates()
    return {(int(r), str(lane)): top[str(lane)] for r, lane in zip(pairs["rank"], pairs["lane"])}


def unit_rows(lanes: pd.DataFrame, spans: pd.DataFrame, ranks: Sequence[int],
              roles_from: pd.DataFrame | None = None) -> pd.DataFrame:
    """Gantt rows for the lanes that carry unit spans, in the loader's lane order per rank; each
    lane named by the span kind that dominates it in ``roles_from`` (default ``spans``: pass every
    step's spans so that a lane keeps its name from step to step)."""
    used = spans[["rank", "lane"]].drop_duplicates()
    rows = events.lane_rows(lanes, ranks, used=used)
    missing = used[~used.set_index(["rank", "lane"]).index.isin(rows.set_index(["rank", "lane"]).index)]
    if not missing.empty:  # lanes the loader does not list (should not happen; keep them visible)
        extra = missing.assign(lane_kind="", row=0, label="")
        rows = pd.concat([rows, extra], ignore_index=True).sort_values(["rank", "row"], kind="stable")
        rows["row"] = np.arange(len(rows))
    roles = _lane_roles(spans if roles_from is None else roles_from)
    rows["label"] = [f"rank {int(r)} · {lane} · {roles.get((int(r), str(lane)), '')}".rstrip(" ·")
                     for r, lane in zip(rows["rank"], rows["lane"])]
    return rows.reset_index(drop=True)


def lead_lookup(unit_steps: pd.DataFrame | None) -> pd.DataFrame | None:
    """``rank, step, unit, phase, lead_ns`` from the analysis' per-unit-step metrics, if any."""
    if unit_steps is None or unit_steps.empty or "prefetch_lead_ns" not in unit_steps.columns:
        return None
    out = unit_steps[["rank", "step", "unit", "phase", "prefetch_lead_ns"]].rename(
        columns={"prefetch_lead_ns": "lead_ns"})
    return out


def unit_segments(spans: pd.DataFrame, rows: pd.DataFrame, choice: StepChoice, colors: Mapping[str, str],
                  leads: pd.DataFrame | None, max_segments: int) -> tuple[pd.DataFrame, bool]:
    """Spans of ``choice``'s step as Gantt segments with colour, hatch and hover texts."""
    mine = spans[spans["step"] == choice.step].copy()
    mine["lane"] = mine["lane"].astype(str)
    mine = mine.merge(rows[["rank", "lane", "row"]], on=["rank", "lane"], how="inner")
    if leads is not None:
        mine = mine.merge(leads, on=["rank", "step", "unit", "phase"], how="left")
        is_gather = mine["kind"] == vocabulary.ALL_GATHER
        mine.loc[~is_gather, "lead_ns"] = np.nan
    else:
        mine["lead_ns"] = np.nan
    merged = False
    if len(mine) > max_segments:
        # Aggregate per unit, phase and kind on each lane: the unit's work stays visible as blocks.
        keys = ["row", "rank", "lane", "unit", "phase", "kind"]
        capped, merged = cap_segments(mine, keys, max_segments)
        extra = mine.groupby(keys, observed=True).agg(bytes=("bytes", "max"), lead_ns=("lead_ns", "max"),
                                                      step=("step", "first")).reset_index()
        mine = capped.merge(extra, on=keys, how="left")
    else:
        mine["n_merged"] = 1
    seg = to_ms(mine, choice.origin_ns)
    seg["start_ms"] = seg["x0_ms"]
    seg["color"] = seg["unit"].map(lambda u: colors.get(str(u), "#888888"))
    seg["unit_name"] = seg["unit"].astype(str).map(unit_label)
    seg["hatch"] = seg["phase"].map(lambda p: PHASE_HATCH.get(str(p), " "))
    seg["bytes_text"] = [format_bytes(b) for b in seg["bytes"]]
    seg["lead_text"] = [format_ms(v / NS_PER_MS) if pd.notna(v) else "" for v in seg["lead_ns"]]
    return seg.reset_index(drop=True), merged


def loop_segments(events: pd.DataFrame | None, rows: pd.DataFrame, choice: StepChoice) -> pd.DataFrame:
    """``zero_grad`` and data-loading ranges of ``choice``'s step on the Gantt's lanes, as segments
    named by what they are (LOOP_PARTS); empty when the traces hold none."""
    if events is None or events.empty:
        return pd.DataFrame()
    mine = events[(events["step"] == choice.step).to_numpy()]
    names = mine["name"].astype(str).to_numpy()
    parts = []
    for label, _, rule in LOOP_PARTS:
        hit = mine[rule(names)] if len(names) else mine
        if not hit.empty:
            parts.append(hit.assign(unit_name=label))
    if not parts:
        return pd.DataFrame()
    hits = pd.concat(parts, ignore_index=True)
    hits = hits.assign(lane=hits["lane"].astype(str), end_ns=hits["start_ns"] + hits["dur_ns"])
    hits = hits.merge(rows[["rank", "lane", "row"]], on=["rank", "lane"], how="inner")
    seg = to_ms(hits, choice.origin_ns)
    return seg.assign(unit=seg["unit_name"], kind=vocabulary.COMPUTE, phase="", start_ms=seg["x0_ms"],
                      color=seg["unit_name"].map(LOOP_PART_COLORS), hatch=" ", bytes_text="", lead_text="",
                      n_merged=1)[
        ["row", "rank", "lane", "step", "unit", "unit_name", "kind", "phase", "start_ns", "end_ns", "x0_ms",
         "x1_ms", "dur_ms", "start_ms", "color", "hatch", "bytes_text", "lead_text", "n_merged"]]


def units_view(spans: pd.DataFrame, lanes: pd.DataFrame, choice: StepChoice, *, colors: Mapping[str, str],
               exposed: pd.DataFrame, memory_curve: pd.DataFrame, unit_steps: pd.DataFrame | None,
               max_segments: int, ranks: Sequence[int] | None = None,
               events: pd.DataFrame | None = None) -> StepView:
    """The per-unit Gantt tab of ``choice``'s step (see module docstring); ``events``: the drawn
    ranks' trace events, for the loop's work outside every unit (``loop_segments``)."""
    step_spans = spans[spans["step"] == choice.step]
    ranks = sorted(int(r) for r in step_spans["rank"].unique()) if ranks is None else list(ranks)
    step_spans = step_spans[step_spans["rank"].isin(ranks)]
    rows = unit_rows(lanes, step_spans, ranks, roles_from=spans[spans["rank"].isin(ranks)])
    segments, merged = unit_segments(step_spans, rows, choice, colors, lead_lookup(unit_steps), max_segments)
    loop = loop_segments(events[events["rank"].isin(ranks)] if events is not None else None, rows, choice)
    if not loop.empty:
        segments = pd.concat([segments, loop], ignore_index=True)
    comm = segments[segments["kind"].isin(vocabulary.UNIT_COLLECTIVES)]
    comm = comm.assign(start_ns=comm["start_ns"].astype(np.int64), end_ns=comm["end_ns"].astype(np.int64))
    exposed_pieces = exposed_on_segments(comm, exposed, choice, ["unit", "kind", "phase"])
    notes = []
    if merged:
        notes.append(f"{choice.label}: more than {max_segments:,} unit spans; each unit's spans of one "
                     "kind and phase on a lane were joined (hover shows how many).")
    return StepView(kind="units", choice=choice, rows=rows, segments=segments, color_by="unit_name",
                    exposed=exposed_pieces, memory=memory_curve, merged=merged, notes=notes)


def place_unit_peaks(unit_steps: pd.DataFrame | None, spans: pd.DataFrame, memory: pd.DataFrame,
                     choice: StepChoice, ranks: Sequence[int]) -> pd.DataFrame:
    """Where each unit's peak (per rank and phase, as the analysis reports it) lies on the curve.

    The analysis gives the peak bytes of a unit's window (``window_start_ns``..``window_end_ns``,
    else the extent of the unit's spans of that phase); the marker goes at the first allocator
    sample inside that window that reaches it, or at ``peak_t_ns`` when the analysis provides the
    time itself. Returns ``rank``, ``unit``,
    ``phase``, ``t_ns``, ``peak_bytes``.
    """
    cols = ["rank", "unit", "phase", "t_ns", "peak_bytes"]
    if unit_steps is None or unit_steps.empty or "peak_allocated_bytes" not in unit_steps.columns:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    mine = unit_steps[(unit_steps["step"] == choice.step) & unit_steps["rank"].isin(list(ranks))
                      & (unit_steps["peak_allocated_bytes"] > 0)]
    if mine.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols})
    if "peak_t_ns" in mine.columns:
        out = mine.rename(columns={"peak_allocated_bytes": "peak_bytes", "peak_t_ns": "t_ns"})
        return out[cols].reset_index(drop=True)
    if {"window_start_ns", "window_end_ns"} <= set(mine.columns):
        mine = mine[mine["window_start_ns"] >= 0].rename(
            columns={"window_start_ns": "w_start", "window_end_ns": "w_end"})
    else:  # the unit's own spans bound its window
        windows = spans[spans["step"] == choice.step].groupby(["rank", "unit", "phase"], observed=True).agg(
            w_start=("start_ns", "min"), w_end=("end_ns", "max")).reset_index()
        mine = mine.merge(windows, on=["rank", "unit", "phase"], how="inner")
    rows = []
    for rank, group in mine.groupby("rank", sort=True):
        samples = memory[memory["rank"] == rank].sort_values("t_ns")
        if samples.empty:
            continue
        t = samples["t_ns"].to_numpy(np.int64)
        alloc = samples["allocated_bytes"].to_numpy(np.int64)
        for unit, phase, peak, lo, hi in zip(group["unit"], group["phase"], group["peak_allocated_bytes"],
                                             group["w_start"], group["w_end"]):
            a, b = np.searchsorted(t, lo, side="left"), np.searchsorted(t, hi, side="right")
            hit = np.flatnonzero(alloc[a:b] >= peak)
            if len(hit):
                rows.append((int(rank), str(unit), str(phase), int(t[a + hit[0]]), int(peak)))
    return pd.DataFrame(rows, columns=cols)
