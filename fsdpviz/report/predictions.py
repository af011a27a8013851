"""The report's *Predicted settings* section: predictions saved with ``fsdpviz whatif --save``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsdpviz.formatting import format_bytes, format_change, format_ms
from fsdpviz.report.html import HtmlTable, Section, TableCell
from fsdpviz.whatif.saved import not_predicted_why

if TYPE_CHECKING:
    from fsdpviz.report.data import ReportData
    from fsdpviz.whatif.saved import SavedPrediction

HOWTO = (
    "Settings predicted from this recording with `fsdpviz whatif --save` — not recorded. Each row is the "
    "model's prediction for the whole run under that setting, next to the recording; the change is "
    "against the recording. `fsdpviz whatif --help` says how a prediction is made; its replay line says how "
    "closely the model reproduces this recording. A column marked unreliable is one whatif called so when it "
    "was saved (its cells' hints say why): read it as a direction, not a figure; one marked within the spread "
    "moves the step by less than the recording's own step-to-step spread."
)
FIELDS = (("step time", "step_time_ms", "ms"), ("exposed communication", "exposed_comm_ms", "ms"),
          ("peak allocated", "peak_allocated_bytes", "bytes"))


def _text(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    return format_bytes(float(value)) or "n/a" if unit == "bytes" else format_ms(float(value))


def predictions_table(saved: list[SavedPrediction]) -> HtmlTable:
    """Recorded, then one column per saved prediction (marked predicted)."""
    baseline = saved[0].baseline
    columns = ["", "recorded", *(f"{p.name} ({p.mark})" for p in saved)]
    rows = []
    for label, key, unit in FIELDS:
        row = [TableCell(text=label, header=True),  # a null peak's cell says why (null where it is known)
               TableCell(text=_text(baseline.get(key), unit),
                         hint=str(baseline.get("peak_unknown") or "") if key == "peak_allocated_bytes" else "")]
        for p in saved:
            value = p.predicted.get(key)
            # a null peak says why, in whatif's words (the note saved with it)
            why = not_predicted_why(p, "memory.peak_allocated_bytes") if value is None and key == "peak_allocated_bytes" else ""
            row.append(TableCell(text=_text(value, unit), sub=format_change(p.baseline.get(key), value, unit),
                                 hint=(why or "predicted by fsdpviz whatif") + (f"; {p.caveats}" if p.caveats else "")))
        rows.append(row)
    return HtmlTable(columns=columns, rows=rows)


def predictions_section(data: ReportData) -> Section | None:
    if not data.predictions:
        return None
    return Section(key="predictions", title="Predicted settings", howto=HOWTO,
                   tables=[predictions_table(data.predictions)])
