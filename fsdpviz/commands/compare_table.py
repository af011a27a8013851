"""The tables of ``fsdpviz compare`` in the terminal: the same numbers, marks and spreads as the page.

Every value, best mark (``*``) and spread comes from the :class:`~fsdpviz.analysis.compare.model.Comparison`
that the page and ``compare --json`` read, so the three never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsdpviz.analysis.compare.model import (
    GROUP_METRICS,
    HEADLINE_FIELDS,
    Comparison,
    HeadlineField,
    unit_index,
)
from fsdpviz.analysis.compare.units import BY_FQN, BY_PARAM_SIZES, group_values
from fsdpviz.commands.terminal import print_table
from fsdpviz.formatting import format_bytes, format_ms, format_pct
from fsdpviz.whatif.saved import NOT_PREDICTED, SavedPrediction, headline_value, not_predicted_why

BEST_MARK = "*"


def value_text(unit: str, value: Any) -> str:
    """A number as the terminal's compare tables write it, in the page's units ("-" when unknown; the page
    writes "n/a")."""
    if value is None:
        return "-"
    if unit == "ms":
        return format_ms(float(value))
    if unit == "%":
        return format_pct(float(value))
    if unit == "bytes":
        return format_bytes(float(value)) or "-"
    return f"{value:,}"


def _delta(field: HeadlineField, delta: Any) -> str:
    if delta is None:
        return ""
    sign = "+" if delta > 0 else "-" if delta < 0 else "±"
    if field.unit == "%":  # a difference of two shares is in points, not a share of either
        return f"{sign}{abs(delta):.1f} points"
    return f"{sign}{value_text(field.unit, abs(delta))}"


def headline_rows(comparison: Comparison) -> list[list[str]]:
    """[label, cell per run] for each headline number any run has: value, best mark, delta against
    the first run, and the run's step-to-step spread where known."""
    rows = []
    for field in HEADLINE_FIELDS:
        values = comparison.values[field.key]
        if all(v is None for v in values) or (field.unit == "bytes" and all(not v for v in values)):
            continue
        best = set(comparison.best[field.key])
        spreads = comparison.spread.get(field.key) or [None] * len(values)
        points = comparison.spread_points.get(field.key) or [None] * len(values)
        cells = []
        for i, value in enumerate(values):
            text = value_text(field.unit, value) + (f" {BEST_MARK}" if i in best else "")
            extra = [_delta(field, comparison.deltas[field.key][i])] if i > 0 else []
            if spreads[i] is not None and value is not None:
                extra.append(f"spread {format_ms(spreads[i])}")
            if points[i] is not None and value is not None:
                extra.append(f"spread {points[i]:.1f} points")
            extra = [e for e in extra if e]
            cells.append(text + (f" ({', '.join(extra)})" if extra else ""))
        rows.append([field.label, *cells])
    return rows


def prediction_rows(predictions: Sequence[tuple[str, SavedPrediction]]) -> list[list[str]]:
    """[label, cell per saved prediction] for each headline number a prediction holds (the page's
    predicted columns): value and delta against the run it was predicted from; "-" where it holds none."""
    rows = []
    for field in HEADLINE_FIELDS:
        cells = []
        for _, p in predictions:
            value, base = headline_value(p, field.key)
            delta = _delta(field, value - base) if value is not None and base is not None else ""
            cells.append(value_text(field.unit, value) + (f" ({delta})" if delta else ""))
        if any(c != "-" for c in cells) or prediction_gaps(predictions, field.key):
            rows.append([field.label, *cells])
    return rows


def prediction_gaps(predictions: Sequence[tuple[str, SavedPrediction]], key: str) -> list[str]:
    """Why a saved prediction holds no value of the headline row ``key`` where it says more than that
    whatif does not predict the row (a null peak: ``--no-memory``...): ``label: name: why`` each."""
    return [f"{label}'s {p.name}: {why}" for label, p in predictions
            if headline_value(p, key)[0] is None and (why := not_predicted_why(p, key)) != NOT_PREDICTED]


def unit_rows(comparison: Comparison) -> list[list[str]]:
    """[label, cell per run] for each unit group: the units of each run, then its numbers."""
    rows: list[list[str]] = []
    indexes = [unit_index(r) for r in comparison.runs]
    for group in comparison.match.groups:
        members = []
        for label in comparison.labels:
            units = group.members.get(label) or []
            held = group.held_by.get(label)
            members.append(" + ".join(units) if units else f"in {held}" if held else "-")
        rows.append([group.name, *members])
        values = [group_values(group, r.label, idx) for r, idx in zip(comparison.runs, indexes)]
        marks = comparison.unit_best.get(group.name, {})
        spreads = comparison.unit_spread.get(group.name, {})
        for metric, title, unit in GROUP_METRICS:
            row = [v.get(metric) for v in values]
            if all(v is None for v in row):
                continue
            best = set(marks.get(metric, []))
            spread = spreads.get(metric) or [None] * len(row)
            cells = [value_text(unit, v) + (f" {BEST_MARK}" if i in best else "")
                     + (f" (spread {format_ms(s)})" if s is not None and v is not None else "")
                     for i, (v, s) in enumerate(zip(row, spread))]
            rows.append([f"  {title}", *cells])
    return rows


def print_comparison(comparison: Comparison, predictions: Sequence[tuple[str, SavedPrediction]] = ()) -> None:
    """The headline and per-unit tables of a comparison on stdout, the runs' saved predictions (``(run
    label, prediction)``, as the page shows them), its findings, then its notes."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    labels = [escape(lb) for lb in comparison.labels]

    def head() -> Table:
        table = Table(title=f"runs side by side ({BEST_MARK} best beyond the noise and the step-to-step spread; deltas against "
                            f"{labels[0]})", title_justify="left")
        table.add_column("", no_wrap=True)
        for label in labels:
            table.add_column(label, justify="right", no_wrap=True)
        return table

    print_table(console, head, headline_rows(comparison), name_column=None)
    # how the runs were set up where they differ (the page's table has every row): what the numbers follow
    differing = [(name, values) for name, values in comparison.settings if name != "source" and len(set(values)) > 1]
    if differing:
        console.print("set up differently (the page lists every setting):")
        for name, values in differing:
            console.print(escape(f"  {name}: " + "; ".join(f"{lb} {v}" for lb, v in zip(comparison.labels, values))),
                          highlight=False)
    if predictions:
        def predicted() -> Table:
            table = Table(title="saved predictions (fsdpviz whatif --save): predicted, not recorded; deltas against the "
                                "run each was predicted from; - not predicted, or not known where a line below says why",
                                title_justify="left")
            table.add_column("", no_wrap=True)
            for label, p in predictions:
                table.add_column(escape(f"{label}: {p.name} ({p.mark})"), justify="right", no_wrap=True)
            return table

        print_table(console, predicted, prediction_rows(predictions), name_column=None)
        for field in HEADLINE_FIELDS:
            for gap in prediction_gaps(predictions, field.key):
                console.print(escape(f"- {field.label}, {gap}"), highlight=False)
    rows = unit_rows(comparison)
    if rows:
        basis = comparison.match.basis
        held = ("rows hold the same parameters in every run" if basis in (BY_FQN, BY_PARAM_SIZES)
                else "run.json lists no parameters: rows hold the same ones as far as that tells")

        def units() -> Table:
            table = Table(title=f"per-unit comparison (matched by {basis}; {held}; times are medians per step, "
                                "summed)", title_justify="left")
            table.add_column("unit group", no_wrap=True)
            for label in labels:
                table.add_column(label, justify="right", no_wrap=True)
            return table

        print_table(console, units, rows, name_column=None)
    # the findings say in words what the tables mark (the page and --json hold their evidence too)
    if comparison.findings:
        console.print("findings (what differs between the runs, and why as far as the traces show)")
        for finding in comparison.findings:
            console.print(escape(f"  {finding.message}"))
    for label, unit in comparison.match.whole_model.items():
        console.print(escape(f"note: {label} holds the whole model in one unit ({unit}): compare it on the "
                             "headline numbers."))
    for note in comparison.notes:
        console.print(escape(f"note: {note}"))
