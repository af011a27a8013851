"""Compare runs: the same headline numbers side by side, deltas, best values, settings and caveats.

Users change one thing (wrap policy, prefetch, ``reshard_after_forward``), record again and want to
know which run is faster, which peaks lower, and why. :func:`compare_runs` takes each run's
summary (:class:`fsdpviz.analysis.summary.Summary`) and, when available, its ``analyse_run`` result
and run.json, and returns a :class:`Comparison`: the headline table with deltas against the first
run and the best value of each row marked, the settings that differ, the units matched across runs
(:mod:`fsdpviz.analysis.compare.units`), findings in words (:mod:`fsdpviz.analysis.compare.findings`)
and notes on what makes runs hard to compare (world size, framework, model, device).

Deltas are ``run_i - run_0`` of the numbers each run's summary reports, rounded as the summary rounds
them, so ``compare --json`` agrees with the individual ``summary --json`` outputs. Pure: no I/O.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from fsdpviz.analysis.compare.clocks import (
    LEVEL_FIELDS,
    different_clocks,
    levels_differ,
    pace_notes,
    ranked_on_clock,
)
from fsdpviz.analysis.compare.findings import PACE_NOTE_START, PACE_RATIO, build_findings, is_clear, noise_ms
from fsdpviz.analysis.compare.memory import drift_bytes, drift_unknown, step_levels, step_rise_bytes
from fsdpviz.analysis.compare.model import (
    HEADLINE_FIELDS,
    LOWER,
    Comparison,
    bucketed_units,
    total_params,
    unit_index,
)
from fsdpviz.analysis.compare.spread import (
    MEASURED,
    MEMORY_NOISE,
    STEP_SHARES,
    clear_best,
    group_spread_ms,
    group_spread_why,
    headline_spread_ms,
    headline_spread_points,
    headline_spread_why,
)
from fsdpviz.analysis.compare.units import (
    BY_FQN,
    BY_PARAM_SIZES,
    MAX_METRICS,
    SUM_METRICS,
    RunUnit,
    UnitMatch,
    group_values,
    match_units,
    splits_bucket,
)
from fsdpviz.errors import UsageError
from fsdpviz.formatting import mib_change_text, mib_text

if TYPE_CHECKING:
    import pandas as pd

    from fsdpviz.analysis.pipeline import LabelledRun


# Launcher flags that differ between runs without meaning anything (free ports, rendezvous ids).
NOISE_FLAGS: Final = frozenset({"--master_port", "--master-port", "--master_addr", "--master-addr",
                                "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_id", "--rdzv-id"})


def field_value(summary: dict[str, Any], key: str) -> float | int | None:
    """A headline number of one summary's JSON (``Summary.to_json()``, what ``summary --json`` prints)
    by its dotted key (``overlap.overlap_pct``); ``n_units`` and ``largest_unit_bytes`` are derived."""
    if key == "n_units":
        return len(summary.get("units") or [])
    if key == "largest_unit_bytes":
        sizes = [u.get("param_bytes") for u in summary.get("units") or [] if u.get("param_bytes")]
        return max(sizes) if sizes else None
    value: Any = summary
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _delta(a: float | None, b: float | None, digits: int | None) -> float | int | None:
    if a is None or b is None:
        return None
    return int(a - b) if digits is None else round(float(a) - float(b), digits)


def best_indices(values: Sequence[float | int | None], better: str | None) -> list[int]:
    """Runs holding the best value of a row; none when no direction is better or all are equal."""
    known = [(i, v) for i, v in enumerate(values) if v is not None]
    if better is None or len(known) < 2 or len({v for _, v in known}) == 1:
        return []
    target = min(v for _, v in known) if better == LOWER else max(v for _, v in known)
    return [i for i, v in known if v == target]


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Labels made unique by a ``#2``, ``#3`` suffix on repeats (tables and JSON key by label); a suffix
    that another label already is (``x``, ``x``, ``x #2``) moves on to the next free one."""
    taken = set(labels)
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        if label not in seen:
            seen[label] = 1
            out.append(label)
            continue
        n = seen[label] + 1
        while f"{label} #{n}" in taken:
            n += 1
        seen[label] = n
        taken.add(f"{label} #{n}")
        out.append(f"{label} #{n}")
    return out


def run_units(run: LabelledRun) -> list[RunUnit]:
    """The run's units for matching: the analysis' unit table, else run.json's, else the summary's;
    with the parameters run.json records for each unit (FQN and numel). A unit of no parameters of its own
    that the summary has no entry for is left out where the summary lists units: it ran nothing of its own
    in the analysed steps (ZeRO-3's root around its submodules), so a group holding it would have none of
    its figures to add up, and every sum of the group would read as unknown. A unit that holds parameters,
    or whose size is unknown, stays: its group's sums are unknown without it."""
    table: pd.DataFrame | None = run.analysis.units
    listed = run.run.units if run.run is not None else []
    params = {u.unit: tuple((str(f), int(n)) for f, n in u.params) for u in listed}
    summarised = {u.name for u in run.summary.units}
    if summarised:
        if table is not None and len(table):
            idle = ~table["unit"].astype(str).isin(summarised).to_numpy() & (table["param_bytes"] == 0).to_numpy()
            table = table[~idle]
        listed = [u for u in listed if u.unit in summarised or u.param_bytes != 0]
    if table is not None and len(table):
        return [RunUnit(name=str(r.unit), order=int(r.order),
                        param_bytes=int(r.param_bytes) if r.param_bytes >= 0 else None, parent=str(r.parent),
                        params=params.get(str(r.unit), ()))
                for r in table.sort_values("order").itertuples()]
    if listed:
        return [RunUnit(name=u.unit, order=u.order if u.order >= 0 else i,
                        param_bytes=u.param_bytes if u.param_bytes >= 0 else None, parent=u.parent,
                        params=params.get(u.unit, ()))
                for i, u in enumerate(listed)]
    return [RunUnit(name=u.name, order=u.order if u.order >= 0 else i, param_bytes=u.param_bytes)
            for i, u in enumerate(run.summary.units)]


def compare_runs(runs: Sequence[LabelledRun]) -> Comparison:
    """Compare two or more runs (the first is the baseline of the deltas)."""
    if len(runs) < 2:
        raise UsageError("compare needs at least two runs")
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise UsageError(f"run labels must differ: {', '.join(labels)}")
    levels = [step_levels(r.traces, list(r.summary.steps))
              for r in runs]
    measured: dict[str, list[float | int | None]] = {"step_rise_bytes": [step_rise_bytes(lv) if lv is not None else None for lv in levels]}
    as_json = [r.summary.to_json() for r in runs]  # the numbers exactly as each run's summary --json has them
    values = {f.key: measured[f.key] if not f.in_summary else [field_value(j, f.key) for j in as_json]
              for f in HEADLINE_FIELDS}
    deltas = {f.key: [_delta(v, values[f.key][0], f.digits) for v in values[f.key]] for f in HEADLINE_FIELDS}
    # a time figure is ranked only among the runs of one clock (compare/clocks.py); the table shows all
    ranked = ranked_on_clock(runs)
    rank_values = {f.key: [v if f.unit != "ms" or i in ranked else None for i, v in enumerate(values[f.key])]
                   for f in HEADLINE_FIELDS}
    best = {f.key: best_indices(rank_values[f.key], f.better) for f in HEADLINE_FIELDS}
    match = match_units({r.label: run_units(r) for r in runs})
    drift = [drift_bytes(lv) if lv is not None else None for lv in levels]
    drift_why = {lb: why for lb, lv in zip(labels, levels, strict=True) if (why := drift_unknown(lv))}
    withheld = {}
    if any(d is not None for d in drift):
        # A climbing level makes peaks depend on how many steps were profiled: no "best" peak.
        for key in ("memory.peak_allocated_bytes", "memory.peak_reserved_bytes"):
            best[key] = []
            withheld[key] = "the allocated level at step start drifts across steps (see notes)"
    spread = {f.key: [headline_spread_ms(r, f.key) for r in runs] for f in HEADLINE_FIELDS if f.unit == "ms"}
    # a star beats the noise between the two runs' per-step means, then their spreads, as the findings
    # read them (in that order): a star the step finding calls within noise would say two things of a row
    for key, column in NOISE_COLUMNS.items():
        if why := within_noise(runs, rank_values[key], spread[key], best[key], column):
            best[key], withheld[key] = [], why
    for key, spreads in spread.items():
        if key not in MEASURED:  # no spread at all: withheld below, with that reason
            continue
        best[key], why = clear_best(rank_values[key], spreads, best[key])
        if why:
            withheld[key] = why
    points = {key: [headline_spread_points(r, key) for r in runs] for key in STEP_SHARES}
    for key, spreads in points.items():
        best[key], why = clear_best(values[key], spreads, best[key], unit="points")
        if why:
            withheld[key] = why
    for f in HEADLINE_FIELDS:  # a timed figure with no spread to beat cannot be told from noise
        if f.unit in ("ms", "%") and best[f.key] and f.key not in MEASURED:
            best[f.key] = []
            withheld[f.key] = "its step-to-step spread is not measured, so a difference cannot be told from noise"
        elif f.unit == "bytes" and best[f.key]:
            best[f.key], why = clear_bytes(values[f.key], best[f.key])
            if why:
                withheld[f.key] = why
    # a time row with fewer than two runs on one clock, and peaks of levels that count different things,
    # are not compared at all: that reason before any other
    def known(row: Sequence[float | int | None]) -> int:
        return sum(v is not None for v in row)

    if clock_why := different_clocks(runs):
        for f in HEADLINE_FIELDS:
            if f.unit == "ms" and f.better is not None and known(values[f.key]) >= 2 and known(rank_values[f.key]) < 2:
                best[f.key], withheld[f.key] = [], clock_why
    if level_why := levels_differ(runs):
        for key in LEVEL_FIELDS:
            if known(values[key]) >= 2:
                best[key], withheld[key] = [], level_why
    notes = comparability_notes(runs, match) + drift_notes(labels, drift, values["step_rise_bytes"]) \
        + untold_drift_notes(labels, drift_why, values["memory.peak_allocated_bytes"]) + unseen_notes(runs) \
        + pace_notes(runs)
    unknown = {key: {r.label: headline_spread_why(r, key) for r, s in zip(runs, spreads) if s is None}
               for key, spreads in (*spread.items(), *points.items())}
    comparison = Comparison(labels=labels, runs=list(runs), values=values, deltas=deltas, best=best,
                            settings=settings_rows(runs), match=match, drift=drift, drift_unknown=drift_why,
                            notes=notes,
                            best_withheld=withheld, spread=spread, spread_points=points,
                            spread_unknown={k: v for k, v in unknown.items() if v}, ranked=ranked)
    unit_marks(comparison)
    comparison.findings = build_findings(comparison)
    return comparison


def clear_bytes(values: Sequence[float | int | None], best: list[int]) -> tuple[list[int], str]:
    """The best runs of a row of bytes that hold more than :data:`MEMORY_NOISE` less than every other run,
    the memory finding's rule (a few bytes apart is not a better run), and why a star is withheld: the
    spreads' rule with each run's :data:`MEMORY_NOISE` of its own bytes as its spread."""
    marks, why = clear_best(values, [None if v is None else MEMORY_NOISE * float(v) for v in values], best, "bytes")
    if why:
        which = "the runs are" if len(values) == 2 else "the lowest runs are"
        return [], f"{which} within {MEMORY_NOISE:.0%} of each other (the rule compare's memory finding reads bytes by)"
    return marks, ""


def within_noise(runs: Sequence[LabelledRun], values: Sequence[float | int | None], spreads: Sequence[float | None],
                 best: Sequence[int], column: str) -> str:
    """Why a time row's best runs do not beat the noise between their per-step means and another run's
    (the STEP_TIMES ``column``; the findings' test), "" where they do. A pair with no spread at all is
    left to the spread rule, which says it is not ranked."""
    for i in best:
        vi = values[i]
        if vi is None:
            continue
        for j, v in enumerate(values):
            if j in best or v is None or (spreads[i] is None and spreads[j] is None):
                continue
            noise = noise_ms(runs[i], runs[j], column)
            if not is_clear(float(vi), float(v), noise):
                return (f"the difference ({abs(float(v) - float(vi)):.3g} ms) is within noise (the largest of 2 standard "
                        f"errors, {noise:.3g} ms, 5 % of the larger value and 0.02 ms)")
    return ""


# The headline times whose best mark must also beat the noise between two runs' per-step means (the
# STEP_TIMES column each is read from), as the step and exposed-communication findings do
NOISE_COLUMNS: Final = {"step_time_ms": "step_ns", "overlap.exposed_comm_ms": "exposed_comm_ns"}
RANKED_UNIT_METRICS: Final = tuple(m for m in (*SUM_METRICS, *MAX_METRICS) if m != "param_bytes")


def unit_marks(comparison: Comparison) -> None:
    """The best run of each unit group's numbers (lower is better), kept only beyond the runs'
    step-to-step spread (:mod:`fsdpviz.analysis.compare.spread`); the page and the terminal show these."""
    drifting = any(d is not None for d in comparison.drift)  # peaks then depend on the step: not ranked
    level_why = levels_differ(comparison.runs)
    indexes = [unit_index(r) for r in comparison.runs]
    for group in comparison.match.groups:
        values = [group_values(group, r.label, idx) for r, idx in zip(comparison.runs, indexes)]
        marks: dict[str, list[int]] = {}
        spreads: dict[str, list[float | None]] = {}
        why: dict[str, str] = {}
        for metric in RANKED_UNIT_METRICS:
            row = [v[metric] for v in values]
            spreads[metric] = [group_spread_ms(r, group, metric) for r in comparison.runs]
            known = [v for v in row if v is not None]
            if (metric in MAX_METRICS and drifting) or len(known) < 2 or len(set(known)) == 1:
                marks[metric] = []
                continue
            if group.bytes_differ:
                marks[metric], why[metric] = [], "its units hold different parameter bytes in the runs"
                continue
            # times only among the runs of one clock; peaks of levels that count different things not at all
            if metric.endswith("_bytes") and level_why:
                marks[metric], why[metric] = [], level_why
                continue
            if not metric.endswith("_bytes") and comparison.ranked is not None and len(comparison.ranked) < len(row):
                row = [v if comparison.is_ranked(i) else None for i, v in enumerate(row)]
                if len([v for v in row if v is not None]) < 2:
                    marks[metric], why[metric] = [], "the runs are on different clocks, fewer than two on one (see the notes)"
                    continue
            if metric.endswith("_bytes"):  # no spread for bytes: the memory finding's rule
                marks[metric], reason = clear_bytes(row, best_indices(row, LOWER))
            else:
                marks[metric], reason = clear_best(row, spreads[metric], best_indices(row, LOWER))
            if reason:
                why[metric] = reason
        comparison.unit_best[group.name] = marks
        comparison.unit_spread[group.name] = spreads
        unknown = {m: {r.label: group_spread_why(r, group, m) for r, v in zip(comparison.runs, row) if v is None}
                   for m, row in spreads.items()}
        comparison.unit_spread_unknown[group.name] = {m: v for m, v in unknown.items() if v}
        comparison.unit_best_withheld[group.name] = why


# --- settings ----------------------------------------------------------------------------------

def _unit_setting(run: LabelledRun, key: str) -> str:
    units = run.run.units if run.run is not None else []
    if not units:
        return "n/a"
    values = [getattr(u, key) for u in units]
    if key == "reshard_after_forward":
        known = [v for v in values if v is not None]
        if not known:
            return "n/a"
        on = [u.unit for u, v in zip(units, values) if v]
        off = [u.unit for u, v in zip(units, values) if v is False]
        if not off:
            return "yes (every unit)"
        if not on:
            return "no (every unit)"
        return f"{len(on)} of {len(known)} units (not {', '.join(off[:3])}{' …' if len(off) > 3 else ''})"
    lists = [v for v in values if isinstance(v, list)]
    if lists:
        depth = max(len(v) for v in lists)
        return f"explicit, {depth} unit(s) ahead" if depth else "none"
    distinct = sorted({str(v) for v in values if v is not None})
    return ", ".join(distinct) if distinct else "n/a"


def _dtype(run: LabelledRun) -> str:
    dtypes = sorted({u.dtype.removeprefix("torch.") for u in (run.run.units if run.run else []) if u.dtype})
    return ", ".join(dtypes) or "n/a"


def command_args(command: Sequence[str]) -> list[str]:
    """A command as option/value words, launcher noise (ports, rendezvous ids) left out."""
    words: list[str] = []
    skip = False
    for i, word in enumerate(command):
        if skip:
            skip = False
            continue
        flag = word.split("=", 1)[0]
        if flag in NOISE_FLAGS:
            skip = "=" not in word and i + 1 < len(command)
            continue
        if word.startswith("-") and i + 1 < len(command) and not command[i + 1].startswith("-") \
                and "=" not in word:
            words.append(f"{word} {command[i + 1]}")
            skip = True
        else:
            words.append(word)
    return words


def _differing_args(runs: Sequence[LabelledRun]) -> list[str]:
    commands = [command_args(r.run.command if r.run is not None else []) for r in runs]
    if not any(commands):
        return ["n/a"] * len(runs)
    common = set.intersection(*(set(c) for c in commands if c))
    # a run without a recorded command (traces only) has none to be the same as: unknown, not "(same)"
    return [(" ".join(w for w in c if w not in common) or "(same)") if c else "n/a" for c in commands]


def settings_rows(runs: Sequence[LabelledRun]) -> list[tuple[str, list[str]]]:
    """Text rows of the headline table: what each run was and how it was set up."""
    def steps(r: LabelledRun) -> str:
        s = r.summary.steps
        return ", ".join(map(str, s)) if len(s) <= 4 else f"{s[0]}–{s[-1]} ({len(s)})"

    rows = [
        ("framework", [r.summary.framework for r in runs]),
        ("device", [r.summary.device for r in runs]),
        ("steps analysed", [steps(r) for r in runs]),
        ("parameter dtype", [_dtype(r) for r in runs]),
        ("reshard after forward", [_unit_setting(r, "reshard_after_forward") for r in runs]),
        ("forward prefetch", [_unit_setting(r, "forward_prefetch") for r in runs]),
        ("backward prefetch", [_unit_setting(r, "backward_prefetch") for r in runs]),
        ("command (what differs)", _differing_args(runs)),
        ("source", [r.source for r in runs]),
    ]
    return rows


# --- comparability -----------------------------------------------------------------------------

def _differ(label: str, values: Sequence[Any], labels: Sequence[str]) -> str:
    return f"{label}: " + ", ".join(f"{lb} {v}" for lb, v in zip(labels, values))


def comparability_notes(runs: Sequence[LabelledRun], match: UnitMatch) -> list[str]:
    """Why some numbers should not be compared directly (every run is still shown)."""
    labels = [r.label for r in runs]
    notes = []
    # one recording given more than once: its figures agree by construction. Runs are one where they read
    # the same trace files (a run folder and its traces/ folder) or carry one run.json id (a copy)
    files = [sorted(os.path.realpath(p) for p in r.traces.sources) or [os.path.realpath(r.source)] for r in runs]
    ids = [r.run.run_id if r.run is not None else "" for r in runs]
    seen: dict[int, list[str]] = {}  # the first of each recording -> the labels it was given under
    for i, r in enumerate(runs):
        first = next(j for j in range(i + 1) if files[j] == files[i] or (ids[i] and ids[j] == ids[i]))
        seen.setdefault(first, []).append(r.label)
    for same in (lbs for lbs in seen.values() if len(lbs) > 1):
        said = ", ".join(same[:-1]) + f" and {same[-1]}"
        notes.append(f"{said} are one recording, given {len(same)} times: they compare the run with itself, so "
                     "they agree to the figure.")
    sizes = [r.summary.world_size for r in runs]
    if len(set(sizes)) > 1:
        notes.append(_differ("World sizes differ", sizes, labels) + ". Step time and per-rank memory depend "
                     "on the world size (each rank holds 1/N of the sharded state): compare with care.")
    frameworks = [r.summary.framework for r in runs]
    if len(set(frameworks)) > 1:
        notes.append(_differ("Frameworks differ", frameworks, labels) + ". Their units, labels and memory "
                     "accounting differ.")
    devices = [r.summary.device for r in runs]
    if len(set(devices)) > 1:
        notes.append(_differ("Devices differ", devices, labels) + ". GPU overlap counts kernels on the "
                     "device's streams, CPU overlap counts the threads that ran ops and collectives: these numbers "
                     "are not comparable.")
    if clock_why := different_clocks(runs):
        notes.append(f"Clocks differ: {clock_why}.")
    if level_why := levels_differ(runs):
        notes.append(f"Memory levels differ: {level_why}. Their peaks get no best mark; the memory a step adds "
                     "(peak less the level at the step's start) counts the same in each.")
    totals = [total_params(r) for r in runs]
    if all(t is not None for t in totals) and len(set(totals)) > 1:
        notes.append(_differ("Parameter counts differ", [f"{t:,}" for t in totals], labels)
                     + ". The runs train different models.")
    elif any(g.bytes_differ for g in match.groups):
        odd = [g.name for g in match.groups if g.bytes_differ]
        notes.append(f"Units matched by {match.basis} hold different parameter bytes ({', '.join(odd[:4])}): their "
                     "per-unit numbers are not like for like and get no best mark.")
    if match.groups:
        exact = match.basis in (BY_FQN, BY_PARAM_SIZES)
        why = ("the runs' units list their parameters, which differ in names and in sizes" if match.params_listed
               else "run.json lists no parameters of the units: recorded by an older fsdpviz, or traces only")
        notes.append(f"Units are matched by {match.basis}: each row of the per-unit comparison holds the same "
                     "parameters in every run" + ("." if exact else f" as far as the {match.basis} tell ({why})."))
    for r in runs:
        if not r.summary.units:
            notes.append(f"{r.label}: no FSDP units in the traces; only whole-step numbers are compared.")
        buckets = bucketed_units(r)
        split = [g.name for g in match.groups if splits_bucket(g.members.get(r.label, []), buckets)]
        if split:
            notes.append(f"{r.label}: its collectives carry several units at once (buckets), and a bucket's exposed "
                         "time counts for the one unit that waited on it; a unit group that holds part of a bucket "
                         "has no exposed communication of its own there, nor a spread of it, so it is not compared: "
                         f"{', '.join(split[:3])}{' …' if len(split) > 3 else ''}.")
        status = r.run.status if r.run is not None else ""
        if status and status != "ok":
            notes.append(f"{r.label}: the recorded run ended with status {status!r}; its numbers may be partial.")
        if len(r.summary.steps) < 2:
            notes.append(f"{r.label}: only {len(r.summary.steps)} step analysed: a figure taken from its analysed "
                         "steps has no step-to-step spread (spread_unknown says which), so a difference in it is held "
                         "to the other run's spread, and beside another such run not ranked.")
    if pace := _pace_note(runs, clock_why):
        notes.append(pace)
    if all(d == "cpu" for d in devices):
        notes.append("All runs are CPU runs (gloo): the training thread waits out each collective FSDP issues, "
                     "a prefetched one too, so little or nothing of it overlaps compute, and steps run longer than "
                     "the same settings give on GPUs, where collectives run on their own CUDA streams. The ranking "
                     "of the runs may differ there.")
    return notes


def _pace_note(runs: Sequence[LabelledRun], clock_why: str | None) -> str:
    """Where runs of the same command and the same recorded FSDP settings (parameter dtype, resharding,
    prefetch), on one clock, differ in the model's compute by :data:`PACE_RATIO` or more: what the machine's
    pace does to every difference between them; "" otherwise. ``clock_why``: :func:`different_clocks` of
    the runs (runs on different clocks differ by the profiler's cost: the clocks' note says so)."""
    if len(runs) < 2 or clock_why or any(a != "(same)" for a in _differing_args(runs)):
        return ""
    if len({_dtype(r) for r in runs}) > 1:
        return ""
    for key in ("reshard_after_forward", "forward_prefetch", "backward_prefetch"):
        if len({_unit_setting(r, key) for r in runs}) > 1:
            return ""
    computes = [r.summary.overlap.compute_ms for r in runs]
    known = [c for c in computes if c is not None and math.isfinite(c) and c > 0]
    if len(known) < len(runs) or max(known) < PACE_RATIO * min(known):
        return ""
    said = ", ".join(f"{r.label} {c:,.1f} ms" for r, c in zip(runs, known))
    return (f"{PACE_NOTE_START} with the same recorded FSDP settings: {said} a step "
            f"({max(known) / min(known):.2f}x). The same command and settings run the same model code, so a "
            "difference this large is most likely the machine's pace (another machine, another load, other library "
            "versions), and every difference between these runs holds it: record the runs to compare one after "
            "another on one machine.")


def drift_notes(labels: Sequence[str], drift: Sequence[int | None], rise: Sequence[float | int | None]) -> list[str]:
    """Runs whose allocated level at step start climbs from step to step (see compare_memory)."""
    drifting = [(lb, d) for lb, d in zip(labels, drift) if d is not None]
    if not drifting:
        return []
    mib = ", ".join(f"{lb} {mib_change_text(d)}" for lb, d in drifting)
    rises = ", ".join(f"{lb} {mib_text(r)}" for lb, r in zip(labels, rise) if r is not None)
    note = (f"Allocated memory at step start climbs across the analysed steps ({mib}) even after the frees the "
            "profiler did not see were placed (gloo's threads free blocks without a profiler event; fsdpviz "
            "takes those out where their collective completed or their address was reused), so peaks depend on "
            f"how many steps were profiled. Compare the memory a step adds instead ({rises}); the findings do.")
    return [note]


def untold_drift_notes(labels: Sequence[str], why: dict[str, str], peaks: Sequence[float | int | None]) -> list[str]:
    """Runs with a peak whose drift cannot be told (:func:`~fsdpviz.analysis.compare.memory.drift_unknown`)."""
    return [f"{lb}: whether its allocated level at step start climbs from step to step cannot be told "
            f"({why[lb]}); its peak is compared as it is" for lb, peak in zip(labels, peaks) if lb in why
            and peak is not None]


def unseen_notes(runs: Sequence[LabelledRun]) -> list[str]:
    """Runs with blocks whose free the profiler did not see: their peaks leave them out."""
    from fsdpviz.analysis.figures import not_seen_freed_text

    return [f"{r.label}: not seen freed, {not_seen_freed_text(r.summary.memory)}." for r in runs
            if r.summary.memory.not_seen_freed is not None]


# --- JSON --------------------------------------------------------------------------------------

def comparison_json(comparison: Comparison) -> dict[str, Any]:
    """``fsdpviz compare --json``: each run's summary dict (plus its label), the deltas and more."""
    runs = []
    for r in comparison.runs:
        summary = r.summary.to_json()
        summary["label"] = r.label
        runs.append(summary)
    return {
        "labels": comparison.labels,
        "baseline": comparison.labels[0],
        "runs": runs,
        "deltas": comparison.deltas,
        "best": {k: [comparison.labels[i] for i in v] for k, v in comparison.best.items()},
        "best_withheld": comparison.best_withheld,
        "ranked_on_one_clock": [lb for i, lb in enumerate(comparison.labels) if comparison.is_ranked(i)],
        "unit_groups": [group_json(comparison, g) for g in comparison.match.groups],
        "unit_match_basis": comparison.match.basis,
        "spread_ms": comparison.spread,
        "spread_points": comparison.spread_points,
        "spread_unknown": comparison.spread_unknown,
        "whole_model_runs": comparison.match.whole_model,
        "step_rise_bytes": comparison.values["step_rise_bytes"],
        "memory_drift_bytes": comparison.drift,
        "memory_drift_unknown": comparison.drift_unknown,
        "findings": [f.to_json() for f in comparison.findings],
        "notes": comparison.notes,
    }


def group_json(comparison: Comparison, group: Any) -> dict[str, Any]:
    """One unit group with its summed per-unit numbers per run."""
    out = group.to_json()
    out["values"] = {r.label: group_values(group, r.label, unit_index(r)) for r in comparison.runs}
    labels = comparison.labels
    out["best"] = {m: [labels[i] for i in v] for m, v in comparison.unit_best.get(group.name, {}).items()}
    out["spread_ms"] = {m: dict(zip(labels, v)) for m, v in comparison.unit_spread.get(group.name, {}).items()}
    out["spread_unknown"] = comparison.unit_spread_unknown.get(group.name, {})
    out["best_withheld"] = comparison.unit_best_withheld.get(group.name, {})
    return out
