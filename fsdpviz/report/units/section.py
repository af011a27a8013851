"""The per-unit section of the page: a sortable table and bar charts of the analysis' unit stats."""

from __future__ import annotations

from typing import TYPE_CHECKING

import holoviews as hv
import pandas as pd

from fsdpviz.analysis.figures import peak_place
from fsdpviz.analysis.memory_categories import TITLES
from fsdpviz.formatting import bytes_scale, format_bytes, format_ms
from fsdpviz.report.html import Fact, Section
from fsdpviz.report.style import MEMORY_CATEGORY_COLORS
from fsdpviz.report.timeline.units import unit_label
from fsdpviz.report.units import plots
from fsdpviz.report.units.table import METRIC_COLORS, TABLE_COLUMNS, TIMER_COLUMNS, html_table

if TYPE_CHECKING:
    from fsdpviz.analysis.memory import MemoryModel
    from fsdpviz.report.data import ReportData

HOWTO_UNITS = (
    "One row per FSDP unit in forward order; times are medians per step over ranks and analysed steps, "
    "each column its own (so a unit's exposed communication, the median of its per-step total, can "
    "exceed the median all-gather plus the median reduce-scatter where a wait lands in a different "
    "collective each step), peaks are maxima. Click a column header to sort. Exposed communication is the part of a unit's "
    "collectives during which the rank computed nothing. Prefetch lead is how long before the unit's "
    "compute started its all-gather had finished: negative means compute waited for it. Unsharded "
    "bytes (parameters + gradients) are what a unit adds to memory while gathered; compare with the "
    "measured peak. Times are the profiled steps', moved to the run's clock as the step's parts are: "
    "the profiler's share taken out where it slowed them. Forward and backward are the unit's own "
    "compute; where fsdpviz's timers timed every unit, the timers' columns give the unit's own work in "
    "each pass (nested units, gathers and reductions left out) in a step the profiler did not record."
)
NOTE_NO_UNIT_STATS = "No per-unit numbers: the analysis found no FSDP unit in the analysed steps."
NOTE_SIZES_FROM_TRACE = (
    "Parameter counts come from the trace: the size and dtype of each unit's all-gathered buffer "
    "(unsharded, padded to the shard group, in the gathered dtype), as the run has no unit table."
)


def units_section(data: ReportData) -> Section | None:
    """The section, or None when the traces carry no FSDP units."""
    tables = data.unit_tables
    if not data.has_units:
        return None
    if tables is None or tables.table.empty:
        return Section(key="units", title="Per unit", howto=HOWTO_UNITS, notes=[NOTE_NO_UNIT_STATS])
    table = tables.table
    facts = []
    worst = table.sort_values("exposed_comm_ms", ascending=False).iloc[0]
    if pd.notna(worst["exposed_comm_ms"]) and float(worst["exposed_comm_ms"]) > 0:  # no unit to name otherwise
        facts.append(Fact(label="most exposed comm", value=format_ms(float(worst["exposed_comm_ms"])),
                          hint=f"per step, unit {worst['unit_name']}"))
    mem = data.summary.memory
    if mem.peak_allocated_bytes is not None:  # the run's peak, as the headline and the terminal give it
        place = peak_place(mem)
        facts.append(Fact(label="highest peak allocated", value=format_bytes(float(mem.peak_allocated_bytes)),
                          hint=place + ("; " if place else "") + "a unit's peak column counts its whole window, "
                               "nested units included"))
    facts.append(Fact(label="units", value=str(len(table))))
    columns = [c for c in TABLE_COLUMNS if c[0] not in TIMER_COLUMNS or table[c[0]].notna().any()]
    mem_max = float(tables.memory["bytes"].max()) if not tables.memory.empty else 0.0
    divisor, mem_unit = bytes_scale(mem_max)
    memory = tables.memory.assign(bytes=tables.memory["bytes"] / divisor)
    views = [
        plots.unit_bars(tables.times, tables.units, value="ms",
                        value_dim=hv.Dimension("unit_ms", label="time per step", unit="ms"),
                        title="time per unit (median per step)", colors=_colors(tables.times)),
        plots.unit_bars(tables.exposed, tables.units, value="ms",
                        value_dim=hv.Dimension("exposed_ms", label="exposed", unit="ms"),
                        title="exposed communication per unit (no compute running on the rank)",
                        colors=_colors(tables.exposed)),
        plots.unit_bars(tables.leads, tables.units, value="ms",
                        value_dim=hv.Dimension("lead_ms", label="prefetch lead", unit="ms"),
                        title="prefetch lead: all-gather end to compute start (negative: compute waited)",
                        colors={"forward": METRIC_COLORS["forward"], "backward": METRIC_COLORS["backward"]}),
        plots.unit_bars(memory, tables.units, value="bytes",
                        value_dim=hv.Dimension("memory_units", label="memory", unit=mem_unit),
                        title="unsharded parameters + gradients vs measured peak allocated",
                        colors=_colors(tables.memory)),
    ]
    categories = unit_categories(data)
    if not categories.empty:
        divisor, cat_unit = bytes_scale(float(categories.groupby("unit_name")["bytes"].sum().max()))
        views.append(plots.category_bars(
            categories.assign(bytes=categories["bytes"] / divisor), tables.units,
            value_dim=hv.Dimension("category_bytes", label="memory", unit=cat_unit),
            title="what each unit's peak holds, by category (its highest window peak)",
            colors=MEMORY_CATEGORY_COLORS, titles=TITLES))
    notes = [NOTE_SIZES_FROM_TRACE] if data.summary.units_source and "trace" in data.summary.units_source else []
    said = model_note(data)
    if said:
        notes.append(said)
    return Section(key="units", title="Per unit", howto=HOWTO_UNITS, facts=facts, notes=notes,
                   tables=[html_table(table, columns)], views={"units": views})


def unit_categories(data: ReportData) -> pd.DataFrame:
    """Long table ``unit_name``, ``category``, ``bytes``: each unit's peak by category."""
    rows = [{"unit_name": unit_label(u.name), "category": c, "bytes": float(b)}
            for u in data.summary.units if u.peak_categories is not None
            for c, b in u.peak_categories.categories.items() if b is not None]  # unknown: not drawn
    return pd.DataFrame(rows, columns=["unit_name", "category", "bytes"])


def model_note(data: ReportData) -> str | None:
    """The ZeRO arithmetic beside what the run's highest peak held (one sentence), when both exist;
    a category that cannot be known reads "unknown"."""
    model, mem = data.memory_model, data.summary.memory
    if model is None or not mem.categories:
        return None
    cats = mem.categories

    def text(value: int | None) -> str:
        return format_bytes(float(value)) if value is not None else "unknown"

    sharded = [cats["sharded_params"], cats["gradients"], cats["optimizer_state"]]
    held = sum(v for v in sharded if v is not None) if all(v is not None for v in sharded) else None
    peak = mem.categories_at.allocated_bytes if mem.categories_at is not None else None
    parts = (f"parameters {text(cats['sharded_params'])}, gradients {text(cats['gradients'])}, "
             f"optimizer {text(cats['optimizer_state'])}")
    # a sum with an unknown part is unknown: the parts are said, and that their sum is not known
    state = f"{text(held)} ({parts})" if held is not None else f"{parts} (their sum unknown)"
    return (f"At the run's highest peak ({text(peak)}), the sharded state held {state}; the ZeRO "
            f"arithmetic gives {format_bytes(float(model.sharded_state_bytes))} for all three "
            f"({_state_words(model)}), and {format_bytes(float(model.unsharded_params_bytes))} for the "
            f"two largest units' unsharded parameters against {text(cats['unsharded_params'])} measured.")


def _state_words(model: MemoryModel) -> str:
    """The ZeRO arithmetic of the sharded state in words (the formula ``(s+s+K)*params/shards``)."""
    s, k = model.sharded_bytes_per_param, model.optimizer_bytes_per_param
    master = (f" ({model.master_bytes_per_param} B of it DeepSpeed's fp32 master copy of the parameters)"
              if model.master_bytes_per_param else "")
    per_param = f"{s} B of parameter + {s} B of gradient + {k} B of optimizer state{master} per parameter"
    if model.formula.startswith("sum over units"):  # units sharded over groups of different sizes
        return f"{per_param}, for each unit's parameters split over its own shard group"
    return f"{per_param}, times {model.param_count:,} parameters, split over {model.shards} ranks"


def _colors(data: pd.DataFrame) -> dict[str, str]:
    return {m: METRIC_COLORS.get(m, "#888888") for m in dict.fromkeys(data["metric"])}
