"""Step-to-step spread of a run's numbers, and when a best value earns its star.

A compare table marks the best value of a row. Two recordings of one setting differ from each other
by about as much as one recording's steps differ among themselves, so a difference no larger than
that is not a property of the settings. Here a run's *spread* of a figure is the range (highest
minus lowest) of its per-step values over the steps the figure is taken from, each step's value
the median over ranks:

- ``step_time_ms``: the timers' clean unprofiled steps when the summary's step time is theirs
  (``step_time_source`` ``timers``), each rank's own, and of them the steps clean on every rank where
  those are enough (a script's own profiler may slow a step on one rank only), at least
  :data:`CLEAN_SPREAD_STEPS`; with fewer, the
  analysed steps as traced, moved to the step time by its ratio to the traced step, where they range
  wider than the clean ones (the profiler's jitter comes with them); else the analysed steps as traced;
- ``overlap.exposed_comm_ms`` and ``overlap.comm_ms``: the analysed steps' exposed and total
  communication, moved to the run's clock as the figures are (``bound.comm_scale``);
- ``overlap.overlap_pct``: the analysed steps' share of communication hidden behind compute, in
  percentage points (``spread_points``: a ratio has no spread in ms);
- a unit group's times: the group's units summed per step (forward and backward compute, all-gather,
  reduce-scatter, exposed communication), moved to the run's clock as the units' figures are.

A timed figure without per-step values (``overlap.idle_ms``) has no spread to beat: its row gets no
star, and ``best_withheld`` says why (:data:`MEASURED`).

:func:`clear_best` keeps the star of a row only when the best value beats every other run by more
than the larger of the two runs' spreads. A spread is None where a run has fewer than two steps of the
figure; a pair of which one run's is None is held to the other's, and a pair of which both are earns
no star (whatif advises nothing there either), ``best_withheld`` saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import pandas as pd

from fsdpviz.analysis.bound import comm_clock_scale
from fsdpviz.analysis.compare.model import bucketed_units
from fsdpviz.analysis.compare.units import EXPOSED_METRICS, splits_bucket
from fsdpviz.formatting import NS_PER_MS

if TYPE_CHECKING:
    from fsdpviz.analysis.compare.units import UnitGroup
    from fsdpviz.analysis.pipeline import LabelledRun

# Bytes closer than this share of the larger are the same memory (compare's memory finding and stars).
MEMORY_NOISE: Final = 0.02
# The fewest steps whose range is a spread at all (one step has none).
MIN_SPREAD_STEPS: Final = 2
# The fewest clean steps whose range stands as the step time's spread on its own: two steps' range is
# one difference, which can be any size below the steps' real spread (two clean steps of an H100
# recording 0.04 ms apart, where its runs vary about 10 % between recordings); three or more rarely
# come that close together. Fewer: the traced steps' range where it is the wider (:func:`step_values_ms`).
CLEAN_SPREAD_STEPS: Final = 3
# headline key -> STEP_TIMES column whose per-step values it summarises
STEP_COLUMNS: Final = {"overlap.exposed_comm_ms": "exposed_comm_ns", "overlap.comm_ms": "comm_ns"}
# headline key -> (STEP_TIMES communication column, its exposed part): the hidden share per step, in points
STEP_SHARES: Final = {"overlap.overlap_pct": ("comm_ns", "exposed_comm_ns")}
# headline keys whose step-to-step spread is measured (the rest of the timed ones get no star)
MEASURED: Final = frozenset({"step_time_ms", *STEP_COLUMNS, *STEP_SHARES})
# unit group metric -> (UNIT_STEPS columns summed, phase or "" for both)
UNIT_COLUMNS: Final = {
    "forward_ms": (("compute_clock_ns",), "forward"),
    "backward_ms": (("compute_clock_ns",), "backward"),
    "all_gather_ms": (("ag_ns",), ""),
    "reduce_scatter_ms": (("rs_ns",), ""),
    "exposed_comm_ms": (("ag_exposed_ns", "rs_exposed_ns", "ar_exposed_ns"), ""),
    "forward_exposed_all_gather_ms": (("ag_exposed_ns",), "forward"),
    "backward_exposed_all_gather_ms": (("ag_exposed_ns",), "backward"),
    "exposed_reduce_scatter_ms": (("rs_exposed_ns",), ""),
}


def _range(per_step: pd.Series) -> float | None:
    values = per_step.dropna().to_numpy(dtype=float)
    return round(float(values.max() - values.min()), 3) if len(values) >= MIN_SPREAD_STEPS else None


def traced_step_values_ms(step_times: pd.DataFrame) -> pd.Series | None:
    """Per analysed step, the median over ranks of the traced step time in ms (``RunAnalysis.step_times``)."""
    return None if step_times.empty else step_times.groupby("step")["step_ns"].median() / NS_PER_MS


def spread_ms(per_step: pd.Series | None) -> float | None:
    """The range of ``per_step`` values (None: fewer than :data:`MIN_SPREAD_STEPS`)."""
    return None if per_step is None else _range(per_step)


def step_values_ms(run: LabelledRun, key: str) -> pd.Series | None:
    """Per step (index), the median over ranks of the figure ``key`` in ms; None where the run has
    no per-step values of it."""
    summary = run.summary
    if key == "step_time_ms":
        profiler = summary.profiler
        if summary.step_time_source == "timers" and profiler is not None:
            from fsdpviz.structure.profiler_cost import clean_step_rows

            timers = run.traces.timers
            # each rank's own clean steps: a step clean on one rank may not be on another
            rows = (clean_step_rows(timers, run.traces.run) if timers is not None and not timers.empty
                    else pd.DataFrame())
            if not rows.empty:
                # where the ranks' clean steps differ, a step's median over other ranks would read the
                # ranks' offsets as spread: the steps clean on every rank, where there are enough of them
                ranks = rows["rank"].nunique()
                common = rows.groupby("step")["rank"].nunique()
                common = common[common == ranks].index
                if len(common) >= CLEAN_SPREAD_STEPS:
                    rows = rows[rows["step"].isin(common)]
            clean = rows.groupby("step")["ms"].median() if not rows.empty else None
            if clean is not None and len(clean) >= CLEAN_SPREAD_STEPS:
                return clean
            # too few clean steps to range over alone: the traced steps', moved to the run's clock by the
            # headline's ratio to the traced step (the profiler's own jitter with them), where they range
            # wider than the clean ones: a spread is never read narrower than any steps of the run show
            traced = traced_step_values_ms(run.analysis.step_times)
            step, traced_step = summary.step_time_ms, summary.traced_step_time_ms
            if traced is None or len(traced) < MIN_SPREAD_STEPS or not step or not traced_step:
                return clean
            moved = traced * (step / traced_step)
            if clean is None or (_range(moved) or 0.0) >= (_range(clean) or 0.0):
                return moved
            return clean
        return traced_step_values_ms(run.analysis.step_times)
    column = STEP_COLUMNS.get(key)
    times = run.analysis.step_times
    if column is None or times.empty:
        return None
    # the traced steps' values moved to the run's clock as its figure was (the bound's comm_scale)
    scale = comm_clock_scale(summary.bound)
    return scale * times.groupby("step")[column].median() / NS_PER_MS


def headline_spread_ms(run: LabelledRun, key: str) -> float | None:
    """The run's step-to-step spread of a headline figure (the module docstring), None if unknown."""
    values = step_values_ms(run, key)
    return None if values is None else _range(values)


def headline_spread_points(run: LabelledRun, key: str) -> float | None:
    """The run's step-to-step spread of a headline share (``overlap.overlap_pct``) in percentage
    points: per step the median over ranks of the hidden share of its communication; None if unknown."""
    columns = STEP_SHARES.get(key)
    times = run.analysis.step_times
    if columns is None or times.empty:
        return None
    comm = times[columns[0]].astype(float)
    hidden = 100.0 * (comm - times[columns[1]].astype(float)) / comm.where(comm > 0)
    return _range(hidden.groupby(times["step"]).median())


def group_spread_ms(run: LabelledRun, group: UnitGroup, metric: str) -> float | None:
    """The run's step-to-step spread of a unit group's time ``metric``, None if unknown."""
    spec = UNIT_COLUMNS.get(metric)
    names = group.members.get(run.label) or []
    steps = run.analysis.unit_steps
    if spec is None or not names or steps.empty or _split_exposure(run, group, metric):
        return None
    columns, phase = spec
    rows = steps[steps["unit"].isin(names)]
    if phase:
        rows = rows[rows["phase"] == phase]
    if rows.empty:
        return None
    if columns == ("compute_clock_ns",):  # a pass as the run's analysis moved it (summary.units)
        total = rows["compute_clock_ns"].astype(float)
    else:  # the units' clock (summary.units)
        total = comm_clock_scale(run.summary.bound) * rows[list(columns)].clip(lower=0).sum(axis=1)
    per_rank_step = total.groupby([rows["rank"], rows["step"]]).sum()
    return _range(per_rank_step.groupby(level="step").median() / NS_PER_MS)


# Why a spread is None: the words compare --json gives beside it (``spread_unknown``).
NOT_PER_STEP: Final = ("not kept per step: the bound splits each rank's analysed steps together into compute, FSDP's "
                       "per-unit work and idle, so this figure has no step-to-step spread")
FEW_STEPS: Final = "fewer than two {what} steps, so no step-to-step spread"
NO_UNITS: Final = "the run holds none of the group's units"
SPLIT_BUCKET: Final = ("its units share collectives (buckets) with units outside the group: a bucket's exposed time "
                       "counts for the one unit that waited on it, so the group has no exposed time of its own here")
BYTES_RULE: Final = ("bytes have no step-to-step spread here: compare holds them to the memory finding's rule ({noise:.0%} "
                     "apart), not to a spread")
NO_SHARE: Final = ("fewer than two analysed steps with communication: a step without any has no share of it hidden, so "
                   "no step-to-step spread")


def headline_spread_why(run: LabelledRun, key: str) -> str:
    """Why ``run`` has no step-to-step spread of the headline figure ``key`` (where
    :func:`headline_spread_ms` or :func:`headline_spread_points` gives None)."""
    if key not in MEASURED:
        return NOT_PER_STEP
    times = run.analysis.step_times
    if key in STEP_SHARES and times["step"].nunique() >= 2:
        with_comm = (times[STEP_SHARES[key][0]].groupby(times["step"]).max() > 0).sum()
        if with_comm < 2:
            return NO_SHARE
    timed = key == "step_time_ms" and run.summary.step_time_source == "timers"
    return FEW_STEPS.format(what="unprofiled timed or analysed" if timed else "analysed")


def _split_exposure(run: LabelledRun, group: UnitGroup, metric: str) -> bool:
    """Whether ``metric`` is an exposed time the group does not have in ``run``, its units sharing a bucket
    with units outside it (``compare.units.group_values`` gives it None there)."""
    return metric in EXPOSED_METRICS and splits_bucket(group.members.get(run.label) or [], bucketed_units(run))


def group_spread_why(run: LabelledRun, group: UnitGroup, metric: str) -> str:
    """Why ``run`` has no step-to-step spread of a unit group's ``metric`` (where :func:`group_spread_ms`
    gives None)."""
    if not group.members.get(run.label):
        return NO_UNITS
    if _split_exposure(run, group, metric):
        return SPLIT_BUCKET
    if metric.endswith("_bytes"):
        return BYTES_RULE.format(noise=MEMORY_NOISE)
    spec = UNIT_COLUMNS.get(metric)
    if spec is None:
        return NOT_PER_STEP
    return FEW_STEPS.format(what=f"analysed {spec[1]}" if spec[1] else "analysed")


def clear_best(values: Sequence[float | int | None], spreads: Sequence[float | None],
               best: Sequence[int], unit: str = "ms") -> tuple[list[int], str]:
    """The best runs of a row that beat every other run by more than the spread (in ``unit``), and
    why a star is withheld ("" when it is not). A pair where one run's spread is unknown is held to
    the other's: a difference within a spread that is known is no evidence, whatever the other run's.
    A pair where neither is known earns no star: nothing says the difference is measurable."""
    if not best:
        return [], ""
    for i in best:
        vi = values[i]
        for j, vj in enumerate(values):
            if j in best or vj is None or vi is None:
                continue
            known = [s for s in (spreads[i], spreads[j]) if s is not None]
            if not known:  # as whatif, which advises nothing where no spread is known
                return [], (f"neither run's step-to-step spread is known, so whether the difference "
                            f"({abs(float(vj) - float(vi)):.3g} {unit}) is measurable cannot be said")
            limit = max(known)
            if abs(float(vj) - float(vi)) <= limit:
                whose = "the runs'" if len(known) == 2 else "one run's (the other's is unknown)"
                return [], (f"the difference ({abs(float(vj) - float(vi)):.3g} {unit}) is within {whose} "
                            f"step-to-step spread ({limit:.3g} {unit})")
    return list(best), ""

