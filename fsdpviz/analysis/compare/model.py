"""What a comparison of runs is: its headline rows and the :class:`Comparison` they fill.

:mod:`fsdpviz.analysis.compare.runs` builds a :class:`Comparison`
(:func:`~fsdpviz.analysis.compare.runs.compare_runs`) and :mod:`fsdpviz.analysis.compare.findings`
reads one; both import this module and neither imports the other's answer back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, cast

import msgspec
import pandas as pd

from fsdpviz.analysis.compare.units import BUCKET_KEY, UnitMatch, all_known
from fsdpviz.structure.records import Finding
from fsdpviz.vocabulary import UNIT_COLLECTIVES

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import LabelledRun

LOWER: Final = "lower"
HIGHER: Final = "higher"


@dataclass(frozen=True, slots=True)
class HeadlineField:
    """One numeric row of the headline table."""

    key: str  # dotted path into the summary's JSON; the key of ``deltas`` in ``compare --json``
    label: str
    unit: str  # "ms", "%", "bytes" or "" (a count)
    better: str | None  # LOWER / HIGHER, or None when neither is better
    digits: int | None = 3  # rounding of deltas (None: integers)
    in_summary: bool = True  # False: measured by the comparison itself (not a summary number)


HEADLINE_FIELDS: Final = (
    HeadlineField("step_time_ms", "step time", "ms", LOWER),
    HeadlineField("overlap.overlap_pct", "overlap", "%", HIGHER, 2),
    HeadlineField("overlap.exposed_comm_ms", "exposed comm / step", "ms", LOWER),
    HeadlineField("overlap.comm_ms", "communication / step", "ms", LOWER),
    HeadlineField("overlap.compute_ms", "model compute / step", "ms", None),
    HeadlineField("overlap.fsdp_overhead_ms", "FSDP per-unit work / step", "ms", LOWER),
    HeadlineField("overlap.idle_ms", "idle / step (host wait + other idle)", "ms", LOWER),
    HeadlineField("memory.peak_allocated_bytes", "peak allocated", "bytes", LOWER, None),
    HeadlineField("memory.peak_reserved_bytes", "peak reserved", "bytes", LOWER, None),
    HeadlineField("step_rise_bytes", "memory a step adds (peak − level at step start)", "bytes", LOWER, None,
                  in_summary=False),
    HeadlineField("n_units", "FSDP units", "", None, None),
    HeadlineField("largest_unit_bytes", "largest unit (unsharded params)", "bytes", None, None),
    HeadlineField("world_size", "world size", "", None, None),
)

# The per-unit rows of the page and the terminal: (summary ``units`` key, title, unit).
GROUP_METRICS: Final = (
    ("param_bytes", "unsharded parameters", "bytes"),
    ("exposed_comm_ms", "exposed comm / step", "ms"),
    ("all_gather_ms", "all-gather / step", "ms"),
    ("forward_ms", "forward compute", "ms"),
    ("backward_ms", "backward compute", "ms"),
    ("reduce_scatter_ms", "reduce-scatter / step", "ms"),
    ("peak_allocated_bytes", "peak allocated in its windows", "bytes"),
)


@dataclass(kw_only=True, slots=True)
class Comparison:
    """Everything the compare page and ``compare --json`` show (see the module docstring)."""

    labels: list[str]
    runs: list[LabelledRun]
    values: dict[str, list[float | int | None]]  # headline field key -> value per run
    deltas: dict[str, list[float | int | None]]  # key -> run_i - run_0 (None where a value is missing)
    best: dict[str, list[int]]  # key -> indices of the runs with the best value (empty: no best)
    settings: list[tuple[str, list[str]]]  # (row label, text per run), rows that describe the runs
    match: UnitMatch
    drift: list[int | None] = field(default_factory=list)  # per run: growth of the level at step start
    drift_unknown: dict[str, str] = field(default_factory=dict)  # run label -> why its drift cannot be told
    best_withheld: dict[str, str] = field(default_factory=dict)  # key -> why its row has no best mark
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    spread: dict[str, list[float | None]] = field(default_factory=dict)  # key -> per run step-to-step range
    spread_points: dict[str, list[float | None]] = field(default_factory=dict)  # the same of shares, in points
    unit_best: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # group -> metric -> best runs
    unit_spread: dict[str, dict[str, list[float | None]]] = field(default_factory=dict)  # group -> metric -> per run
    unit_best_withheld: dict[str, dict[str, str]] = field(default_factory=dict)  # group -> metric -> why no star
    spread_unknown: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> run label -> why no spread
    unit_spread_unknown: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)  # group -> metric -> same
    ranked: list[int] | None = None
    """The runs whose time figures are ranked against each other (None: all of them), all where they
    share one clock (:func:`fsdpviz.analysis.compare.clocks.ranked_on_clock`)."""

    def is_ranked(self, i: int) -> bool:
        """Whether run ``i``'s time figures are ranked against the others'."""
        return self.ranked is None or i in self.ranked


def unit_index(run: LabelledRun) -> dict[str, dict[str, Any]]:
    """The summary's ``units`` entries by unit name, as JSON values (what groups sum), each with the units
    its collectives were bucketed with (:data:`~fsdpviz.analysis.compare.units.BUCKET_KEY`)."""
    buckets = bucketed_units(run)
    out = {}
    for u in run.summary.units:
        entry = msgspec.to_builtins(u)
        if u.name in buckets:
            entry[BUCKET_KEY] = sorted(buckets[u.name])
        out[u.name] = entry
    return out


_BUCKETS_MEMO: Final = "compare.bucketed_units"


def total_params(run: LabelledRun) -> int | None:
    """The run's parameter elements: the memory model's count, else its units' (None: unknown)."""
    model = run.analysis.memory_model
    if model is not None and model.param_count:
        return model.param_count
    numels = all_known([u.param_numel for u in run.summary.units])
    return sum(numels) if numels and all(n > 0 for n in numels) else None


def bucketed_units(run: LabelledRun) -> dict[str, frozenset[str]]:
    """Per unit whose all-gathers or reduce-scatters carried other units too (ZeRO-3's buckets: one
    collective, a row per unit it carried): those units, with the units their own buckets carried in turn
    (so a group either holds all of them or splits a bucket). Read once per run."""
    memo = run.result.memo
    if _BUCKETS_MEMO not in memo:
        memo[_BUCKETS_MEMO] = _bucketed(run.analysis.spans)
    return cast("dict[str, frozenset[str]]", memo[_BUCKETS_MEMO])


def _bucketed(spans: pd.DataFrame | None) -> dict[str, frozenset[str]]:
    if spans is None or spans.empty:
        return {}
    rows = spans[((spans["n_units"] > 1) & spans["kind"].isin(UNIT_COLLECTIVES)).to_numpy()]
    if rows.empty:
        return {}
    parent: dict[str, str] = {}

    def root(u: str) -> str:
        while parent.setdefault(u, u) != u:
            u = parent[u]
        return u

    for units in rows.groupby(["rank", "step", "kind", "lane", "start_ns"])["unit"]:
        first, *rest = (root(str(u)) for u in units[1].unique())
        for r in rest:
            parent[r] = first
    groups: dict[str, set[str]] = {}
    for u in parent:
        groups.setdefault(root(u), set()).add(u)
    return {u: frozenset(groups[root(u)]) for u in parent if len(groups[root(u)]) > 1}
