"""Plot data for the per-unit section: the analysis' per-unit medians as a table and as bars.

Input is the analysis' ``unit_stats`` (schema.UNIT_STATS: one row per unit, medians over ranks
and steps, peaks as maxima). Output: a display table in ms and bytes, and long tables for grouped
bar charts (one row per unit and metric). Units stay in forward order on every chart, so a reader
can scan from the first block to the last; colours come from the page's unit palette.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from fsdpviz.formatting import NS_PER_MS, bytes_scale
from fsdpviz.report.html import HtmlTable, TableCell
from fsdpviz.report.timeline.units import unit_label

# (column in UNIT_STATS, label on the page)
TIME_METRICS = (
    ("all_gather_ns", "all-gather"),
    ("forward_ns", "forward"),
    ("backward_ns", "backward"),
    ("reduce_scatter_ns", "reduce-scatter"),
)
COMM_TIMES = frozenset({"all_gather_ns", "reduce_scatter_ns"})  # of TIME_METRICS: moved by comm_scale
EXPOSED_METRICS = (
    ("forward_ag_exposed_ns", "forward all-gather"),
    ("backward_ag_exposed_ns", "backward all-gather"),
    ("rs_exposed_ns", "reduce-scatter"),
)
LEAD_METRICS = (
    ("forward_prefetch_lead_ns", "forward"),
    ("backward_prefetch_lead_ns", "backward"),
)
MEMORY_METRICS = (
    ("unsharded_bytes", "unsharded params + grads"),
    ("forward_peak_allocated_bytes", "peak allocated (forward)"),
    ("backward_peak_allocated_bytes", "peak allocated (backward)"),
)
METRIC_COLORS = {
    "all-gather": "#f58518", "forward": "#4c78a8", "backward": "#72b7b2", "reduce-scatter": "#e45756",
    "forward all-gather": "#f58518", "backward all-gather": "#ffbf79", "unsharded params + grads": "#9d9d9d",
    "peak allocated (forward)": "#4c78a8", "peak allocated (backward)": "#72b7b2",
}
# How a GPU pass's figure is taken (docs/concepts.md, units[]): said in the forward and backward hints.
GPU_PASS = ("On a GPU: its kernels from the first to the last on each stream, and the gaps between them; where the "
            "run is on the timers' clock, less the profiler's share, taken out as it is of the step's idle time.")
# What the timers' figure holds beside the trace's compute (record/instrument.py opens a unit before FSDP's
# own pre-forward hook and closes it after its post-forward one; record/timers.py takes out what nests).
TIMED_WORK = ("It holds the framework's own work for the unit in that pass (FSDP's hooks and its copies into and "
              "out of the gathered parameters; DeepSpeed's alike), which the forward and backward columns leave out, "
              "and the timers' own cost; nested units and the time the training thread spent in gathers and "
              "reductions are left out. On CPU under FSDP it is the larger of the two, by up to a few times on a "
              "small unit; on a GPU it is the time between CUDA events around the unit's kernels, on another clock "
              "than the trace's, and either can be the larger.")
TIMED = "as fsdpviz's timers clocked it in the steps the profiler did not slow"
# The unit table's columns: (column of UnitTables.table, header, how its cells read, definition shown
# on hover). Every header names its unit; "bytes" columns get theirs (KiB, MiB, GiB) from their values.
TABLE_COLUMNS = (
    ("order", "#", "count", "The unit's place in forward order."),
    ("unit_name", "unit", "text", "The FSDP unit: the module that fully_shard / FSDP / ZeRO-3 wrapped."),
    ("param_numel", "parameters (count)", "count", "Number of parameter elements the unit holds."),
    ("param_scope", "parameters counted", "text",
     "global: the whole parameters; local: one rank's part after tensor parallelism."),
    ("unsharded_bytes", "unsharded params + grads", "bytes",
     "Memory the unit adds while gathered: its full parameters and their gradients."),
    ("all_gather_ms", "all-gather (ms)", "ms", "Time per step the unit's parameter all-gathers ran."),
    ("forward_ms", "forward (ms)", "ms",
     f"The unit's own forward compute per step, on the run's clock. {GPU_PASS}"),
    ("backward_ms", "backward (ms)", "ms",
     f"The unit's own backward compute per step, on the run's clock. {GPU_PASS}"),
    ("forward_timer_ms", "forward, timers (ms)", "ms", f"The unit's forward per step {TIMED}. {TIMED_WORK}"),
    ("backward_timer_ms", "backward, timers (ms)", "ms", f"The unit's backward per step {TIMED}. {TIMED_WORK}"),
    ("reduce_scatter_ms", "reduce-scatter (ms)", "ms", "Time per step the unit's gradient reduce-scatters ran."),
    ("exposed_comm_ms", "exposed comm (ms)", "ms",
     ("Exposed communication: the part of the unit's collectives during which the rank computed nothing, "
      "so it waited. Lower is better.")),
    ("forward_lead_ms", "forward prefetch lead (ms)", "ms",
     ("Prefetch lead: how long before the unit's forward compute began its all-gather had finished. "
      "Negative: the compute waited for the gather.")),
    ("backward_lead_ms", "backward prefetch lead (ms)", "ms",
     ("Prefetch lead in backward: how long before the unit's backward compute began its all-gather had "
      "finished. Negative: the compute waited.")),
    ("peak_bytes", "peak allocated", "bytes", "The highest allocated memory measured while the unit ran."),
)


@dataclass(kw_only=True, slots=True)
class UnitTables:
    """The per-unit section's data."""

    table: pd.DataFrame  # one row per unit, TABLE_COLUMNS (bytes in bytes, times in ms) + ``color``
    times: pd.DataFrame  # long: unit_name, metric, ms
    exposed: pd.DataFrame  # long: unit_name, metric, ms
    leads: pd.DataFrame  # long: unit_name, metric, ms
    memory: pd.DataFrame  # long: unit_name, metric, bytes
    units: list[str]  # display names in forward order


def _ms(series: pd.Series) -> pd.Series:
    return series.astype("float64") / NS_PER_MS


def _long(stats: pd.DataFrame, metrics: tuple[tuple[str, str], ...], value: str, scale: float) -> pd.DataFrame:
    parts = []
    for col, label in metrics:
        if col not in stats.columns:
            continue
        values = stats[col].astype("float64")
        values = values.where(values >= 0) if value == "bytes" else values  # -1 = unknown bytes
        parts.append(pd.DataFrame({"unit_name": stats["unit_name"], "metric": label, value: values / scale}))
    if not parts:
        return pd.DataFrame({"unit_name": pd.Series(dtype=str), "metric": pd.Series(dtype=str),
                             value: pd.Series(dtype="float64")})
    return pd.concat(parts, ignore_index=True).dropna(subset=[value])


# Columns only runs with per-unit timers have (the section leaves them out otherwise).
TIMER_COLUMNS = ("forward_timer_ms", "backward_timer_ms")


# table column -> the summary's per-unit field it shows (``summary --json`` ``units[]``)
SUMMARY_COLUMNS = (
    ("param_numel", "param_numel"), ("all_gather_ms", "all_gather_ms"), ("forward_ms", "forward_ms"),
    ("backward_ms", "backward_ms"), ("reduce_scatter_ms", "reduce_scatter_ms"),
    ("exposed_comm_ms", "exposed_comm_ms"), ("forward_lead_ms", "forward_prefetch_lead_ms"),
    ("backward_lead_ms", "backward_prefetch_lead_ms"), ("peak_bytes", "peak_allocated_bytes"),
    ("forward_timer_ms", "forward_timer_ms"), ("backward_timer_ms", "backward_timer_ms"),
)


def _summary_value(unit: Any, key: str) -> float | None:
    value = getattr(unit, key, None) if unit is not None else None
    if value is None:
        return None
    return float(value)


def unit_tables(stats: pd.DataFrame, colors: Mapping[str, str],
                timed: Mapping[str, tuple[float | None, float | None]] | None = None,
                scopes: Mapping[str, str | None] | None = None,
                summary_units: Mapping[str, Any] | None = None, scale: float = 1.0,
                comm_scale: float | None = None) -> UnitTables:
    """Display table and bar data from UNIT_STATS (rows in forward order); ``timed``: per unit its
    forward and backward as the timers clock them in unprofiled steps (the summary's ``*_timer_ms``);
    ``scopes``: per unit the summary's ``param_scope`` (None: unknown, an empty cell);
    ``summary_units``: the summary's ``units`` entries by name, whose numbers the table then shows
    (SUMMARY_COLUMNS), so that the page's table and the terminal's agree to the digit; ``scale``: what
    moves the traced times to the run's clock, as the summary's are (``bound.device_scale``), ``comm_scale``
    the collectives' (``bound.comm_scale``; None: ``scale``)."""
    comm = scale if comm_scale is None else comm_scale
    stats = stats.sort_values("order", kind="stable").reset_index(drop=True)
    stats = stats.assign(unit_name=stats["unit"].astype(str).map(unit_label))
    table = pd.DataFrame({
        "order": stats["order"].astype("int64"),
        "unit_name": stats["unit_name"],
        "param_numel": stats["param_numel"].where(stats["param_numel"] >= 0),
        "param_scope": [(scopes or {}).get(str(u)) for u in stats["unit"]],
        "unsharded_bytes": stats["unsharded_bytes"].where(stats["unsharded_bytes"] >= 0).astype("float64"),
        "all_gather_ms": _ms(stats["all_gather_ns"]),
        "forward_ms": _ms(stats["forward_ns"]),
        "backward_ms": _ms(stats["backward_ns"]),
        **{col: pd.Series([(timed or {}).get(str(u), (None, None))[i] for u in stats["unit"]], dtype="float64")
           for i, col in enumerate(TIMER_COLUMNS)},
        "reduce_scatter_ms": _ms(stats["reduce_scatter_ns"]),
        "exposed_comm_ms": _ms(stats["exposed_comm_ns"]),
        "forward_lead_ms": _ms(stats["forward_prefetch_lead_ns"]),
        "backward_lead_ms": _ms(stats["backward_prefetch_lead_ns"]),
        "peak_bytes": stats["peak_allocated_bytes"].where(stats["peak_allocated_bytes"] >= 0).astype("float64"),
        "color": [colors.get(str(u), "#888888") for u in stats["unit"]],
    })
    if summary_units:
        # the numbers exactly as the summary (terminal, --json, notebook) has them, by unit
        for col, key in SUMMARY_COLUMNS:
            table[col] = pd.Series([_summary_value(summary_units.get(str(u)), key) for u in stats["unit"]],
                                   dtype="float64")
    if summary_units:  # the bars are the table's figures (a GPU pass's gaps moved as the summary's are)
        times = _long(table, tuple((f"{col.removesuffix('_ns')}_ms", label) for col, label in TIME_METRICS), "ms", 1.0)
    else:
        times = pd.concat([_long(stats, (metric,), "ms", NS_PER_MS / (comm if metric[0] in COMM_TIMES else scale))
                           for metric in TIME_METRICS], ignore_index=True)
    return UnitTables(
        table=table,
        times=times,
        exposed=_long(stats, EXPOSED_METRICS, "ms", NS_PER_MS / comm),
        leads=_long(stats, LEAD_METRICS, "ms", NS_PER_MS / scale),
        memory=_long(stats, MEMORY_METRICS, "bytes", 1.0),
        units=stats["unit_name"].tolist(),
    )


def html_table(table: pd.DataFrame, columns: Sequence[tuple[str, str, str, str]]) -> HtmlTable:
    """The unit table as an HTML table (headers wrap instead of being cut, and define their term on
    hover), sortable by a click on a header; an unknown value is "-" and sorts last."""
    scales = {}
    for col, _, kind, _ in columns:
        if kind == "bytes":
            known = table[col].dropna()
            scales[col] = bytes_scale(float(known.max()) if len(known) else 0.0)
    headers = [f"{title} ({scales[col][1]})" if col in scales else title for col, title, _, _ in columns]
    rows = []
    for _, record in table.iterrows():
        cells = []
        for col, _, kind, _ in columns:
            value = record[col]
            if kind == "text":
                cells.append(TableCell(text="-" if value is None or pd.isna(value) else str(value), left=True))
                continue
            if value is None or pd.isna(value):
                cells.append(TableCell(text="-", sort_key=float("nan")))
                continue
            number = float(value)
            if kind == "count":
                text = f"{int(number):,}"
            elif kind == "ms":
                text = f"{number:.3f}"
            else:
                scaled = number / scales[col][0]
                text = f"{scaled:,.1f}" if scaled >= 100 else f"{scaled:.3g}" if scaled >= 1 else f"{scaled:.2f}"
            cells.append(TableCell(text=text, sort_key=number))
        rows.append(cells)
    return HtmlTable(columns=headers, rows=rows, hints=[hint for *_, hint in columns], sortable=True,
                     key="unit-table", left_columns={i for i, (_, _, kind, _) in enumerate(columns) if kind == "text"})
