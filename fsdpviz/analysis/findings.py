"""Findings in words: where a step loses time to communication, why, and what to try.

Each finding is one unit pass (or one rank) and the time it loses per step: the median over ranks
and steps of its exposed all-gather, exposed reduce-scatter / all-reduce, or (for a straggler) the
extra exposed communication of the ranks waiting for it. Findings below a noise floor
(0.5 % of the step, at least 20 µs) are dropped; the rest are ranked by time lost.

The cause is read from the trace, and a knob is only suggested when the trace shows that cause:

- gather issued after the previous unit's compute had ended (issue depth 0), and not the first unit
  of the pass: nothing prefetched it -> turn on / deepen prefetch (FSDP2
  ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``, FSDP1
  ``forward_prefetch`` / ``backward_prefetch``, ZeRO-3 ``stage3_prefetch_bucket_size``);
- the first all-gather of the forward pass (or the first unit to compute in it): no compute comes
  before it to hide behind (ZeRO-3 often gathers the first modules, even the whole model, in one
  bucket there) -> no knob;
- first unit of the backward pass (it was resharded after forward and is gathered again) ->
  ``reshard_after_forward=False`` for it (FSDP2 / FSDP1), at the price of its unsharded size;
- gather prefetched (depth >= 1) but longer than the compute it overlapped: bandwidth-bound -> deeper
  prefetch when the pass computes longer than it gathers, else no knob;
- a reduce-scatter after which no unit computes any more has nothing to hide behind -> no knob;
- communication no FSDP unit issued (barriers, a framework's or the script's own all-reduces) that no
  compute hid -> no knob of FSDP's moves it (:func:`other_findings`).

Every time a finding states is on the run's clock: the trace's durations times ``scale``, the factor
the one de-profiler moves the run's device figures by (``bound.device_scale``,
:mod:`fsdpviz.structure.deprofile`; 1 where the run leads with the traced step), its collectives'
(all-gathers, reduce-scatters, all-reduces, their exposed parts) times ``comm_scale``, as the run's
exposed communication moved (``bound.comm_scale``; ``scale`` where not given), and a unit's own
compute as the run's analysis moved it (UNIT_STEPS ``compute_clock_ns``: on a GPU the idle inside a
pass moved as the step's). The noise floor is of the step on that clock too.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, cast

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.formatting import NS_PER_MS, ms_text
from fsdpviz.structure.intervals import total_ns, union_intervals
from fsdpviz.structure.profiler_cost import (
    HIGH_SLOWDOWN,
    NO_CLOSER_BASE,
    NOTABLE_SLOWDOWN,
    ProfilerCost,
)
from fsdpviz.structure.purposes import per_step_ns
from fsdpviz.trace import schema

NOISE_FRACTION: Final = 0.005
NOISE_FLOOR_NS: Final = 20_000

_PREFETCH_KNOB: Final = {
    (vocabulary.FSDP2, vocabulary.FORWARD): "explicit forward prefetch: module.set_modules_to_forward_prefetch([next units])",
    (vocabulary.FSDP2, vocabulary.BACKWARD): "explicit backward prefetch: module.set_modules_to_backward_prefetch([previous units])",
    (vocabulary.FSDP1, vocabulary.FORWARD): "FullyShardedDataParallel(..., forward_prefetch=True)",
    (vocabulary.FSDP1, vocabulary.BACKWARD): "FullyShardedDataParallel(..., backward_prefetch=BackwardPrefetch.BACKWARD_PRE)",
    (vocabulary.ZERO3, vocabulary.FORWARD): "a larger stage3_prefetch_bucket_size in the DeepSpeed config",
    (vocabulary.ZERO3, vocabulary.BACKWARD): "a larger stage3_prefetch_bucket_size in the DeepSpeed config",
}


# What a finding's cause is, as a word (``cause``): findings of one kind and cause read as one line
# (analysis/actions.py).
CAUSE_FIRST_GATHER: Final = "first_gather"
CAUSE_FIRST_COMPUTE: Final = "first_compute"
CAUSE_REGATHERED: Final = "regathered_in_backward"
CAUSE_NOT_PREFETCHED: Final = "not_prefetched"
CAUSE_STARTED_LATE: Final = "started_late"
CAUSE_OUTLASTS_COMPUTE: Final = "outlasts_compute"
CAUSE_NOTHING_LEFT: Final = "nothing_left"
CAUSE_OUTLASTS_AFTER: Final = "outlasts_compute_after"
# a reduction where the run's training thread waits out every collective (FSDP2 / FSDP1 on a CPU rank):
# no compute runs after it starts until it ends, so "outlasts the compute after it" would not be so
CAUSE_WAITED_OUT: Final = "waited_out"
OUTLASTS_AFTER_WORDS: Final = "it outlasts the compute that runs after it"
WAITED_OUT_WORDS: Final = ("the training thread waits it out: on a CPU rank FSDP runs no compute while its gloo "
                           "collective runs")
CAUSE_STRAGGLER: Final = "straggler"
CAUSE_PROFILER: Final = "profiler"
CAUSE_OUTSIDE_UNITS: Final = "outside_units"
# the profiler's finding past HIGH_SLOWDOWN: a caveat on every figure, which the actions never fold away
LARGELY_PROFILERS: Final = "the traced timeline every figure and prediction is read from is largely the profiler's own cost"
KIND_OTHER_COMM: Final = "exposed_other"

# Why a knob of FSDP's does not move communication no FSDP unit issued (the summary adds what whatif's
# replay of the run's device does with it: analysis/summary.py ``run_findings``).
OUTSIDE_UNITS_WHY_NOT: Final = (
    "not FSDP's communication: no wrap, prefetch or resharding setting moves it; a collective completes only when "
    "every rank has reached it, so its exposed time holds the other ranks' lag as well as its own transfer")
# Who issues collectives after the backward pass, as far as the framework's source says it, by the
# collectives' kind (deepspeed/runtime/zero/stage3.py: ``step`` all-reduces the norm of each parameter
# sub-group's gradients, ``get_grad_norm_direct``, and under fp16 its overflow flag, ``has_overflow``;
# ``_post_step`` all-gathers the persistent parameters)
_ZERO3_AFTER_BACKWARD: Final = {
    "all_reduce": "DeepSpeed's ZeRO-3 step all-reduces the gradients' norm (once per parameter sub-group) and, under "
                  "fp16, its overflow check",
    "all_gather": "DeepSpeed's ZeRO-3 step all-gathers its persistent parameters (those under "
                  "stage3_param_persistence_threshold) after the update",
}
_FSDP_AFTER_BACKWARD: Final = "the training script's own there, such as a gradient-norm clip or a loss averaged across ranks"


def _row(unit: str, phase: str, kind: str, lost: float, message: str, evidence: str, knob: str,
         rank: int = -1, cause: str = "", why_not: str = "") -> dict:
    return {"rank": rank, "unit": unit, "phase": phase, "kind": kind, "lost_ns": float(lost),
            "message": message, "evidence": evidence, "knob": knob, "cause": cause, "why_not": why_not}


_COMM_DURATIONS: Final = ("ag_ns", "ag_exposed_ns", "rs_ns", "rs_exposed_ns", "ar_ns", "ar_exposed_ns")


def _medians(unit_steps: pd.DataFrame, scale: float, comm_scale: float) -> pd.DataFrame:
    """Each unit pass's medians over ranks and steps, its durations moved to the run's clock: its
    collectives' by ``comm_scale``, its prefetch lead by ``scale``, its compute as the run's analysis moved
    it (UNIT_STEPS ``compute_clock_ns``)."""
    us = unit_steps.assign(depth=unit_steps["issue_depth"].where(unit_steps["issue_depth"] >= 0))
    med = us.groupby(["unit", "phase"]).agg(
        ag_ns=("ag_ns", "median"), ag_exposed_ns=("ag_exposed_ns", "median"),
        rs_ns=("rs_ns", "median"), rs_exposed_ns=("rs_exposed_ns", "median"),
        ar_ns=("ar_ns", "median"), ar_exposed_ns=("ar_exposed_ns", "median"),
        compute_ns=("compute_clock_ns", "median"), lead=("prefetch_lead_ns", "median"), depth=("depth", "median"),
        n=("step", "size"))
    med[list(_COMM_DURATIONS)] = med[list(_COMM_DURATIONS)].astype(float) * comm_scale
    med["lead"] = med["lead"].astype(float) * scale
    return med


def _pass_order(unit_steps: pd.DataFrame) -> dict[str, list[str]]:
    """Units of each pass in the order their compute starts (median over ranks and steps)."""
    out = {}
    for phase, rows in unit_steps[unit_steps["compute_start_ns"] >= 0].groupby("phase"):
        rel = rows["compute_start_ns"] - rows.groupby(["rank", "step"])["compute_start_ns"].transform("min")
        out[str(phase)] = rel.groupby(rows["unit"]).median().sort_values(kind="stable").index.tolist()
    return out


def _previous_ended_before_issue(spans: pd.DataFrame, unit: str, phase: str, prev: str) -> bool:
    """Whether, in most passes (rank, step, micro-batch), ``unit``'s gather was issued after
    ``prev``'s compute of the same pass had ended."""
    key = ["rank", "step", "micro"]
    in_phase = spans[(spans["phase"] == phase).to_numpy()]
    mine = in_phase[((in_phase["unit"] == unit) & (in_phase["kind"] == vocabulary.ALL_GATHER)).to_numpy()]
    theirs = in_phase[((in_phase["unit"] == prev) & (in_phase["kind"] == vocabulary.COMPUTE)).to_numpy()]
    both = pd.concat([mine.groupby(key)["issue_ns"].min(), theirs.groupby(key)["end_ns"].max()],
                     axis=1, join="inner")
    return bool(len(both)) and bool((both["issue_ns"] >= both["end_ns"]).mean() > 0.5)


def _first_gathers(spans: pd.DataFrame) -> tuple[set[tuple[str, str]], pd.Series]:
    """The (unit, phase) pairs whose gather is, in most micro-batches (rank, step, micro), the
    first all-gather of that phase; and per phase the median compute (ns) the units did in the
    micro-batch before that first gather started."""
    key = ["rank", "step", "micro", "phase"]
    ag = spans[(spans["kind"] == vocabulary.ALL_GATHER).to_numpy()]
    if ag.empty:
        return set(), pd.Series(dtype=float)
    first = ag.groupby(key)["start_ns"].min().rename("first_ns")
    mine = ag.groupby(key + ["unit"])["start_ns"].min().reset_index().join(first, on=key)
    share = (mine["start_ns"] == mine["first_ns"]).groupby([mine["unit"], mine["phase"]]).mean()
    firsts = {(str(u), str(p)) for (u, p), v in share.items() if v > 0.5}
    comp = spans[((spans["kind"] == vocabulary.COMPUTE) & (spans["unit"] != "")).to_numpy()].join(first, on=key)
    before = (np.minimum(comp["end_ns"], comp["first_ns"]) - comp["start_ns"]).clip(lower=0).fillna(0)
    per_pass = before.groupby([comp[c] for c in key]).sum().reindex(first.index, fill_value=0)
    return firsts, per_pass.groupby(level="phase").median()


def _shared(spans: pd.DataFrame, kind: str, scale: float) -> pd.DataFrame:
    """Per (unit, phase) whose ``kind`` collectives carried other units too (ZeRO-3 buckets):
    ``full_ns``, the whole duration per step of every ``kind`` collective of the unit's pass, the
    buckets and any of its own (median over rank-steps, on the run's clock), so that neither the unit's
    share nor its exposed time can read longer than them; and ``n_units``, the most units one carried."""
    of_kind = spans[(spans["kind"] == kind).to_numpy()]
    rows = of_kind[(of_kind["n_units"] > 1).to_numpy()]
    if rows.empty:
        return pd.DataFrame(columns=["full_ns", "n_units"])
    keys = pd.MultiIndex.from_frame(of_kind[["unit", "phase"]])
    rows_all = of_kind[keys.isin(pd.MultiIndex.from_frame(rows[["unit", "phase"]].drop_duplicates()))]
    dur = (rows_all["end_ns"] - rows_all["start_ns"]).groupby(
        [rows_all["rank"], rows_all["step"], rows_all["unit"], rows_all["phase"]]).sum()
    out = (dur.groupby(level=["unit", "phase"]).median() * scale).rename("full_ns").to_frame()
    out["n_units"] = rows.groupby(["unit", "phase"])["n_units"].max()
    return out


def _share_text(shared: pd.DataFrame, unit: str, phase: str, what: str, share_ns: float) -> str:
    """``"all-gather 2.90 ms a step, carrying up to 19 units (its share 0.55 ms)"``, or ``"all-gather 0.55 ms"``."""
    if (unit, phase) in shared.index:
        full_ns, n_units = shared["full_ns"][(unit, phase)], shared["n_units"][(unit, phase)]
        return (f"{what} {ms_text(float(full_ns) / NS_PER_MS)} a step, carrying up to {int(n_units)} units (its share "
                f"{ms_text(share_ns / NS_PER_MS)})")
    return f"{what} {ms_text(share_ns / NS_PER_MS)}"


def _bucket_words(shared: pd.DataFrame, unit: str, phase: str, what: str, share_ns: float) -> str:
    """`` (bucketed: reduce-scatters of up to 16 units, 3.00 ms a step in all, all their exposed time
    counted here; this unit's share 0.57 ms; each a median over ranks and steps)`` where ``unit``'s
    ``what`` collectives carried other units too (ZeRO-3's buckets; one a step, or one per micro-batch),
    "" otherwise: the unit's exposed time can then exceed its own share of the collectives. The words
    name the aggregation because the run's figures by purpose are another (each rank's mean, median over
    ranks): a bucket of every unit's reduce-scatters is the whole purpose, and one slow step moves a
    rank's mean more than the median over steps."""
    if (unit, phase) not in shared.index:
        return ""
    full_ns, n_units = shared["full_ns"][(unit, phase)], shared["n_units"][(unit, phase)]
    return (f" (bucketed: {what}s of up to {int(n_units)} units, {ms_text(float(full_ns) / NS_PER_MS)} a step in all, "
            f"all their exposed time counted here; this unit's share {ms_text(share_ns / NS_PER_MS)}; each a median over "
            "ranks and steps)")


def _unit_passes(med: pd.DataFrame) -> Iterator[tuple[str, str, pd.Series]]:
    """``(unit, phase, medians)`` for each row of a frame indexed by (unit, phase)."""
    for key, m in med.iterrows():
        unit, phase = cast(tuple[str, str], key)
        yield unit, phase, m


def _median_of(n: float) -> str:
    return f"median of {int(n)} measurements (one per rank and step)"


def _lead_words(lead_ns: float) -> str:
    """The prefetch lead in words: how long before the unit's compute its gather had finished."""
    if not np.isfinite(lead_ns):
        return "when the gather finished against the compute: unknown"
    if lead_ns >= 0:
        return f"the gather finished {ms_text(lead_ns / NS_PER_MS)} before the unit's compute began"
    return f"the unit's compute waited {ms_text(-lead_ns / NS_PER_MS)} for the gather"


def _depth_words(depth: float) -> str:
    """The issue depth in words: how many units ahead of its compute the gather was started."""
    if not np.isfinite(depth):
        return "how far ahead the gather started: unknown"
    ahead = round(depth)
    if ahead == 0:
        return "the gather started only after the previous unit's compute (not ahead of time)"
    return f"the gather started {ahead} unit{'s' if ahead > 1 else ''} ahead of its compute"


def _gathered_ns(spans: pd.DataFrame) -> pd.Series:
    """Per (rank, step, phase): the time some all-gather ran, as traced -- the union of the pass's gather
    spans, so that a collective several units share (ZeRO-3's buckets) counts once, as the summary's
    ``overlap.by_purpose`` counts it."""
    gathers = spans[spans["kind"] == vocabulary.ALL_GATHER]
    out = {key: float(total_ns(union_intervals(g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))))
           for key, g in gathers.groupby(["rank", "step", "phase"], sort=False)}
    index = pd.MultiIndex.from_tuples(list(out), names=["rank", "step", "phase"]) if out else None
    return pd.Series(list(out.values()), index=index, dtype=float)


def gather_findings(unit_steps: pd.DataFrame, spans: pd.DataFrame, framework: str, floor_ns: float,
                    med: pd.DataFrame, scale: float = 1.0, comm_scale: float | None = None) -> list[dict]:
    """One finding per unit pass whose all-gather is exposed beyond the noise floor (durations times
    ``scale``, the collectives' times ``comm_scale``: the module docstring). ``med``: :func:`_medians`
    of the same arguments."""
    comm_scale = scale if comm_scale is None else comm_scale
    rows: list[dict] = []
    exposed = ~(med["ag_exposed_ns"].to_numpy(float) < floor_ns)  # as the loop below reads it
    in_pass = med.index.get_level_values("phase").isin([vocabulary.FORWARD, vocabulary.BACKWARD])
    if not (exposed & in_pass).any():  # the causes below read the spans: only for a pass that has a finding
        return rows
    order = _pass_order(unit_steps)
    firsts, before_first = _first_gathers(spans)
    before_first = before_first * scale
    shared = _shared(spans, vocabulary.ALL_GATHER, comm_scale)
    totals = unit_steps.groupby(["rank", "step", "phase"]).agg(c=("compute_clock_ns", "sum"))
    totals["g"] = _gathered_ns(spans).reindex(totals.index).fillna(0.0) * comm_scale
    totals = totals.groupby("phase").median()
    for unit, phase, m in _unit_passes(med):
        if phase not in (vocabulary.FORWARD, vocabulary.BACKWARD) or m["ag_exposed_ns"] < floor_ns:
            continue
        seq = order.get(phase, [])
        pos = seq.index(unit) if unit in seq else -1
        prev = seq[pos - 1] if pos > 0 else None
        gather = _share_text(shared, unit, phase, "all-gather", m["ag_ns"])
        lead = ms_text(m["lead"] / NS_PER_MS) if np.isfinite(m["lead"]) else "n/a"
        median_of = _median_of(m["n"])
        evidence = (f"{gather}, exposed {ms_text(m['ag_exposed_ns'] / NS_PER_MS)}; {_lead_words(m['lead'])}; "
                    f"{_depth_words(m['depth'])}; own compute {ms_text(m['compute_ns'] / NS_PER_MS)}; {median_of}")
        head = (f"{unit}: all-gather exposed {ms_text(m['ag_exposed_ns'] / NS_PER_MS)}/step in {phase}"
                + _bucket_words(shared, unit, phase, "all-gather", m["ag_ns"]))
        knob = why_not = ""
        if phase == vocabulary.FORWARD and ((unit, phase) in firsts or pos == 0 or prev is None):
            if (unit, phase) in firsts:
                cause, code = "the first all-gather of the forward pass, with no compute before it to hide behind", CAUSE_FIRST_GATHER
                ahead = float(before_first.get(phase, 0.0))
                evidence = (f"{gather}, exposed {ms_text(m['ag_exposed_ns'] / NS_PER_MS)}; units' compute in the pass before "
                            f"it {ms_text(ahead / NS_PER_MS)}; its own compute began {lead} after the gather ended; {median_of}")
            else:
                cause, code = "the first unit to compute in the forward pass: nothing computes before it", CAUSE_FIRST_COMPUTE
        elif pos == 0 or prev is None:
            cause, code = "first unit of the backward pass: resharded after forward, so gathered again", CAUSE_REGATHERED
            if framework in (vocabulary.FSDP2, vocabulary.FSDP1):
                knob = (f"reshard_after_forward=False for {unit} (keeps its parameters gathered into "
                        "backward; costs its unsharded size in memory)")
        elif m["depth"] < 0.5:
            late = _previous_ended_before_issue(spans, unit, phase, prev)
            # a unit nested in prev (experts in their block) follows the part of prev's pass before it
            before = f"the part of {prev} before it ({prev} holds it)" if unit.startswith(prev + ".") else prev
            cause = (f"issued only after {before} had finished computing (nothing prefetched it)" if late
                     else f"started only after {before} had finished computing")
            code = CAUSE_NOT_PREFETCHED if late else CAUSE_STARTED_LATE
            knob = _PREFETCH_KNOB.get((framework, phase), "")
        else:
            cause, code = f"prefetched, but it outlasts the compute of {prev} before it", CAUSE_OUTLASTS_COMPUTE
            tot = totals.loc[phase] if phase in totals.index else None
            if tot is not None:  # what the knob below is decided on, said whichever way it goes
                evidence += (f"; the {phase} pass gathers {ms_text(tot['g'] / NS_PER_MS)} and computes "
                             f"{ms_text(tot['c'] / NS_PER_MS)} a step (medians over ranks and steps)")
            if tot is not None and tot["c"] > tot["g"]:
                knob = "prefetch one more unit ahead (the pass computes longer than it gathers; costs memory)"
            elif tot is not None:  # the cause is clear; what it leaves no knob for is said, not left blank
                why_not = (f"no deeper prefetch hides it: the {phase} pass gathers longer than it computes "
                           f"({ms_text(tot['g'] / NS_PER_MS)} against {ms_text(tot['c'] / NS_PER_MS)} a step, "
                           "medians over ranks and steps)")
        rows.append(_row(unit, phase, "exposed_all_gather", m["ag_exposed_ns"], f"{head}; {cause}", evidence, knob,
                         cause=code, why_not=why_not))
    return rows


def _nothing_left(spans: pd.DataFrame, kind: str) -> pd.Series:
    """Per (unit, phase): whether, in most passes (rank, step, micro-batch), no unit compute of
    the pass started after its ``kind`` collective began (nothing left to hide it behind)."""
    comm = spans[spans["kind"] == kind]
    comp = spans[(spans["kind"] == vocabulary.COMPUTE) & (spans["unit"] != "")]
    last_start = comp.groupby(["rank", "step", "micro"])["start_ns"].max().rename("last_compute_ns")
    c = comm.join(last_start, on=["rank", "step", "micro"])
    alone = (c["last_compute_ns"].isna() | (c["start_ns"] >= c["last_compute_ns"])).astype(float)
    return alone.groupby([c["unit"], c["phase"]]).mean() > 0.5


def reduce_findings(unit_steps: pd.DataFrame, spans: pd.DataFrame, floor_ns: float,
                    med: pd.DataFrame, scale: float = 1.0, comm_scale: float | None = None) -> list[dict]:
    """Exposed reduce-scatters (and HSDP all-reduces) of the backward pass (durations times ``scale``, the
    collectives' times ``comm_scale``; ``med`` as :func:`gather_findings` takes it)."""
    comm_scale = scale if comm_scale is None else comm_scale
    rows: list[dict] = []
    for col, kind, span_kind, what in (("rs", "exposed_reduce_scatter", vocabulary.REDUCE_SCATTER, "reduce-scatter"),
                                       ("ar", "exposed_all_reduce", vocabulary.ALL_REDUCE, "all-reduce")):
        if (med[f"{col}_exposed_ns"].to_numpy(float) < floor_ns).all():
            continue  # no finding of this kind: its causes (read off the spans) are not needed
        alone = _nothing_left(spans, span_kind)
        shared = _shared(spans, span_kind, comm_scale)
        for unit, phase, m in _unit_passes(med):
            exposed = m[f"{col}_exposed_ns"]
            if exposed < floor_ns:
                continue
            last = bool(alone.get((unit, phase), False))
            cause = ("no unit computes after it starts: nothing left to hide it behind" if last
                     else OUTLASTS_AFTER_WORDS)
            rows.append(_row(unit, phase, kind, exposed,
                             f"{what} of {unit} exposed {ms_text(exposed / NS_PER_MS)}/step in backward"
                             f"{_bucket_words(shared, unit, phase, what, m[f'{col}_ns'])}; {cause}",
                             f"{_share_text(shared, unit, phase, what, m[f'{col}_ns'])}, exposed {ms_text(exposed / NS_PER_MS)}; "
                             + _median_of(m["n"]), "",
                             cause=CAUSE_NOTHING_LEFT if last else CAUSE_OUTLASTS_AFTER))
    return rows


def straggler_findings(step_times: pd.DataFrame, floor_ns: float, scale: float = 1.0,
                       comm_scale: float | None = None) -> list[dict]:
    """The rank that starts its collectives latest, when the others demonstrably wait for it.

    Summed lateness over a step's collectives overstates the cost when a rank is late at every
    collective by the same amount (the others do not wait the full skew at each one when a gather
    was prefetched), so the time lost is what the waiting shows: how much more exposed
    communication the other ranks have than the straggler, capped by its summed lateness. Lateness
    times ``scale``, exposed communication times ``comm_scale`` (the module docstring).
    """
    if step_times.empty or step_times["rank"].nunique() < 2:
        return []
    step_times = step_times.assign(late_ns=step_times["late_ns"] * scale,
                                   exposed_comm_ns=step_times["exposed_comm_ns"] * (scale if comm_scale is None
                                                                                    else comm_scale))
    per_rank = step_times.groupby("rank")["late_ns"].median().sort_values(ascending=False, kind="stable")
    rank, late = int(per_rank.index[0]), float(per_rank.iloc[0])
    if late < floor_ns:
        return []
    exposed = step_times.pivot_table(index="step", columns="rank", values="exposed_comm_ns", aggfunc="sum")
    others = exposed.drop(columns=rank).mean(axis=1)
    waited = (others - exposed[rank]).clip(lower=0)
    summed = step_times[step_times["rank"] == rank].set_index("step")["late_ns"].reindex(waited.index)
    lost = float(np.minimum(waited, summed).median())
    if not lost >= floor_ns:
        return []
    nxt = per_rank.drop(index=rank)
    return [_row("", "", "straggler", lost,
                 f"rank {rank} starts collectives later than the other ranks (straggler); they wait for it "
                 f"{ms_text(lost / NS_PER_MS)}/step in exposed communication (per other rank on average, beyond rank "
                 f"{rank}'s own; the run's exposed communication is the median over ranks)",
                 f"sum over a step's collectives of (rank {rank}'s start - earliest start): median {ms_text(late / NS_PER_MS)}; "
                 f"next rank {int(nxt.index[0])}: {ms_text(float(nxt.iloc[0]) / NS_PER_MS)}; per step, the other ranks' "
                 f"exposed communication beyond rank {rank}'s, at most its summed lateness that step: median "
                 f"{ms_text(lost / NS_PER_MS)}/step, the time lost above",
                 "", rank=rank, cause=CAUSE_STRAGGLER)]


def profiler_findings(cost: ProfilerCost | None, idle_ns: float | None) -> list[dict]:
    """The profiler's share of the traced step, when it slowed the profiled steps by more than
    ``NOTABLE_SLOWDOWN``: the traced timeline then shows idle time (and longer waits) the run
    does not have. ``idle_ns``: the time the GPU waited per traced step (median over ranks: the bound's
    traced host wait, FSDP's hooks' share of it and other idle, the time carried in from before the
    steps included: the de-profiler takes the share out of that first), given where the share came out of
    it whole (a GPU rank whose device parts the de-profiler left as traced; None on a CPU rank, whose every
    part the profiler slows, where the share did not fit and the device's parts were shrunk too, or where
    part of it came out of a host backend's exposed communication): the finding then says so.
    Only when the unprofiled steps can be trusted (``cost.headline``): from one or two steps, the
    share would be a guess."""
    if cost is None or not cost.headline or cost.pace_note is not None or cost.slowdown < NOTABLE_SLOWDOWN:
        return []
    extra_ns = cost.extra_ms * 1e6
    share = f"{ms_text(extra_ns / NS_PER_MS)} of each traced step is the profiler's"
    if idle_ns is not None and idle_ns > 0:
        # the traced waits are said without a figure of their own (the bound's parts are the run's figures);
        # given only where the de-profiler took the whole share out of them, the device's parts unmoved
        share += (", all of it time the GPU waited as traced (for the host, FSDP's hooks included, and otherwise idle, "
                  "work queued before the analysed steps included)")
    steps = ", ".join(map(str, cost.unprofiled_steps))
    return [_row("", "", "profiler", extra_ns,
                 f"the profiler slowed the profiled steps {cost.slowdown:.2f}x ({cost.profiled_step_ms:.2f} ms "
                 f"against {cost.unprofiled_step_ms:.2f} ms unprofiled): {share}, not the run's; the step time "
                 "fsdpviz leads with is the unprofiled one" + (
                     f"; more than {HIGH_SLOWDOWN:g}x, {LARGELY_PROFILERS}: {cost.closer_base or NO_CLOSER_BASE}"
                     if cost.slowdown > HIGH_SLOWDOWN else ""),
                 f"profiled steps {', '.join(map(str, cost.profiled_steps))} {cost.profiled_step_ms:.2f} ms as traced "
                 f"(each rank's mean, median over ranks); unprofiled steps {steps} {cost.unprofiled_step_ms:.2f} ms "
                 "(timers, each rank's median of its clean steps, median over ranks)",
                 "", cause=CAUSE_PROFILER)]


def _kind_counts(kinds: str) -> list[tuple[str, int]]:
    """PURPOSE_TIMES' ``kinds`` ("all_reduce 3, barrier 3") as (name, count) pairs."""
    return [(name, int(n)) for name, n in (part.rsplit(" ", 1) for part in kinds.split(", ") if " " in part)]


def _per_step_kinds(kinds: str, steps: int) -> str:
    """PURPOSE_TIMES' ``kinds`` ("all_reduce 3, barrier 3", over ``steps`` steps) a step where they
    divide evenly ("1 all_reduce and 1 barrier a step"), else over the steps."""
    pairs = _kind_counts(kinds)
    if not pairs:
        return "no collective named"
    if all(n % steps == 0 for _, n in pairs):
        return " and ".join(f"{n // steps} {name}" for name, n in pairs) + " a step"
    return " and ".join(f"{n} {name}" for name, n in pairs) + f" over {steps} analysed steps"


def other_findings(purposes: pd.DataFrame, step_times: pd.DataFrame, framework: str, floor_ns: float,
                   comm_scale: float) -> list[dict]:
    """Communication no FSDP unit issued (PURPOSE_TIMES' ``other``: barriers, object collectives, a
    framework's or the script's own all-reduces) that no compute hid: its exposed time per step, the
    figure the summary's communication by purpose gives it (:func:`fsdpviz.structure.purposes.per_step_ns`,
    moved by ``comm_scale``), with which collectives they were and when they were issued. No knob of
    FSDP's moves it, and the finding says so."""
    if purposes.empty:
        return []
    counted = step_times.groupby("rank")["step"].nunique()  # none (no steps): each rank's whole trace, as 1
    n_steps = dict(zip(counted.index.astype(int), counted.to_numpy(dtype=np.int64).tolist()))
    exposed = per_step_ns(purposes, vocabulary.OTHER_PURPOSE, "exposed_ns", n_steps)
    if exposed is None or not comm_scale * exposed >= floor_ns:
        return []
    lost = comm_scale * exposed
    rows = purposes[(purposes["purpose"] == vocabulary.OTHER_PURPOSE).to_numpy()].sort_values("rank", kind="stable")
    said = rows[(rows["collectives"] > 0).to_numpy()]
    first = said.iloc[0] if len(said) else rows.iloc[0]
    rank, count, after, timed = (int(first[c]) for c in ("rank", "collectives", "after_backward", "timed"))
    steps = max(n_steps.get(rank, 1), 1)
    there = "after the backward pass (the optimizer step, or what the script runs before its next step)"
    if not timed:
        where = "when they were issued against the backward pass is not known: their steps have no backward label"
    elif after == count:
        where = f"all issued {there}"
    elif not after:
        where = "none issued after the backward pass" + ("" if timed == count else
                                                          f" of the {timed} in steps with a backward label")
    elif timed == count and after % steps == 0 and count % steps == 0:
        where = f"{after // steps} of them a step issued {there}"
    else:
        where = f"{after} of the {timed} in steps with a backward label issued {there}"
    names = {name for name, _ in _kind_counts(str(first["kinds"]))}
    who = None
    if after and framework == vocabulary.ZERO3:
        deepspeeds = [words for name, words in _ZERO3_AFTER_BACKWARD.items() if name in names]
        who = "; ".join(deepspeeds) or None
    elif after and framework in (vocabulary.FSDP2, vocabulary.FSDP1):
        who = _FSDP_AFTER_BACKWARD
    comm = per_step_ns(purposes, vocabulary.OTHER_PURPOSE, "comm_ns", n_steps)
    return [_row("", "", KIND_OTHER_COMM, lost,
                 f"communication no FSDP unit issued exposed {ms_text(lost / NS_PER_MS)}/step "
                 f"({_per_step_kinds(str(first['kinds']), steps)} on rank {rank}; {where}"
                 + (f": {who}" if who else "") + ")",
                 f"communication by purpose, other: {ms_text(comm_scale * (comm or 0.0) / NS_PER_MS)} a step, of which "
                 f"{ms_text(lost / NS_PER_MS)} exposed (each rank's over its analysed steps, median over ranks)",
                 "", cause=CAUSE_OUTSIDE_UNITS, why_not=OUTSIDE_UNITS_WHY_NOT)]


def build_findings(unit_steps: pd.DataFrame, spans: pd.DataFrame, step_times: pd.DataFrame, step_ns: float,
                   framework: str, *, profiler: ProfilerCost | None = None,
                   idle_ns: float | None = None, scale: float = 1.0,
                   comm_scale: float | None = None, purposes: pd.DataFrame | None = None) -> pd.DataFrame:
    """FINDINGS: where the run loses time, ranked by time lost per step; then the profiler's share
    of the trace (``profiler``, ``idle_ns``: see :func:`profiler_findings`), which the run itself does
    not lose, so it never pushes the run's own findings down. ``step_ns``: the run's step, on its
    clock; ``scale``: what moves the trace's durations there, ``comm_scale`` its collectives' (the module
    docstring); ``purposes`` (PURPOSE_TIMES, where the run's unit labels tell FSDP's collectives from the
    rest): the communication no unit issued (:func:`other_findings`)."""
    floor = max(NOISE_FRACTION * step_ns, NOISE_FLOOR_NS) if np.isfinite(step_ns) else NOISE_FLOOR_NS
    rows: list[dict] = []
    if len(unit_steps):
        med = _medians(unit_steps, scale, scale if comm_scale is None else comm_scale)
        rows += gather_findings(unit_steps, spans, framework, floor, med, scale, comm_scale)
        rows += reduce_findings(unit_steps, spans, floor, med, scale, comm_scale)
    rows += straggler_findings(step_times, floor, scale, comm_scale)
    if purposes is not None:
        rows += other_findings(purposes, step_times, framework, floor, scale if comm_scale is None else comm_scale)
    about_trace = profiler_findings(profiler, idle_ns)
    if not rows and not about_trace:
        return schema.make_empty(schema.FINDINGS)
    # every finding is kept: the actions group alike ones into a line each and fold the rest, so a run of
    # many units reads as a few lines whose totals hold every unit pass (a cut here left units' exposed
    # time out of the actions' totals, unsaid)
    ranked = sorted(rows, key=lambda r: -r["lost_ns"])
    return schema.conform(pd.DataFrame(ranked + about_trace), schema.FINDINGS, table="findings")
