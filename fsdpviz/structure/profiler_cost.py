"""What the profiler cost a recorded run: its profiled steps against the same run's other steps.

torch.profiler slows the steps it records: every CPU op it traces costs time on the training
thread, and on a launch-bound GPU step the kernels then wait for their launches (docs/performance.md,
"The profiler's cost on a GPU", from benchmarks/bench_headline_truth.py). The trace therefore shows
a slower run than the real one, and the difference appears as idle time.

The recorder's timers (``timers/rank{R}.jsonl``) time every step, profiled or not; in the clean steps
they only mark the ends of the step and, on a CPU, of its phases (the agent measures its own cost there, run.json
``ranks[].observer``):
they are the clock, the trace is the map. This module compares, per rank, the median of the profiled
steps with the median of the rank's *clean* unprofiled steps, then takes the median over ranks. A
clean step is none of (:func:`fsdpviz.runfolder.clean_steps`): the first :data:`SETTLING_STEPS` steps of
the run (allocation, caches, lazy initialisation), the profiler's own warm-up step (the step before the
first profiled one: Kineto already collects), the step after the last profiled one (the step right
after the trace export, which pays for the profiler's teardown and the written file), a unit-timed
step (its units were timed), a step a rank ended inside, a step a profiler of the script's was on in
(run.json ``ranks[].script_profiled_steps``). A run without timers that cover both kinds of
step (a trace recorded without fsdpviz, ``--mode profile``, a run that stopped inside its profiled
window) has no such numbers.

The run's headline step time is the unprofiled one when it can be trusted
(:attr:`ProfilerCost.headline`): every rank timed at least :data:`MIN_UNPROFILED_STEPS` clean
unprofiled steps. Otherwise the headline is the traced step and :attr:`ProfilerCost.note` says why.
Profiled steps faster than the clean ones beyond noise (:data:`NOISE_SLOWDOWN`) say that the machine's
pace changed between the two windows (a profiler cannot make a step faster): other work on the
machine, a step that waited. The clean steps still lead -- they are most of the run, and the pace the
script's own timer sees -- but the profiler's share is not known, and :attr:`ProfilerCost.pace_note`
says that every figure is the profiled window's, carried to the clean steps' pace.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterator
from typing import Final

import msgspec
import numpy as np
import pandas as pd

from fsdpviz.runfolder import SCHEDULE_OPTIMIZER_STEPS, SETTLING_STEPS, RankInfo, RunInfo, clean_steps

# The timer record of a whole step (docs/recording.md, "Timers").
STEP_TIMER_PHASE: Final = "step"
STEP_TIMER_KIND: Final = "total"
UNIT_PASSES: Final = ("forward", "backward")
UNIT_TIMER_KIND: Final = "compute"  # a unit's own work in a pass (docs/recording.md, "Timers")
# Above this slowdown, a finding says how much of the trace's idle time is the profiler's.
NOTABLE_SLOWDOWN: Final = 1.10
# Above this one, the traced timeline every figure and prediction is read from is largely the profiler's
# own cost: the profiler's finding and every prediction say so, with how to record a closer base.
HIGH_SLOWDOWN: Final = 1.5
# What is said where the recording's own options leave nothing to lower (:func:`closer_base`): with every
# host's cores known, and with some unknown.
NO_CLOSER_BASE: Final = ("no recording option would lower it (the memory profiler and Python stacks were off, and no "
                         "host ran as many ranks as it has cores); what remains is torch.profiler's cost per traced op")
NO_CLOSER_BASE_CORES_UNKNOWN: Final = ("no recording option would lower it that run.json shows (the memory profiler "
                                       "and Python stacks were off; how many cores its ranks shared it does not say)")
# Fewer clean unprofiled steps on a rank than this, and one noisy step would set the headline. Two are
# what a short recording has (the shared H100 recordings: 2 per rank); the clock says how many
# (``summary --json`` ``clock.clean_steps``).
MIN_UNPROFILED_STEPS: Final = 2
# Below this slowdown the profiled steps ran faster than the unprofiled ones: the two windows ran at
# different paces (a shared machine, a step that waited), and the profiler's share is not known.
NOISE_SLOWDOWN: Final = 0.95
# With the recorder's default schedule (profile steps 2-4; step 5 follows the export), the fewest
# training steps that time MIN_UNPROFILED_STEPS clean steps (6-7).
FULL_HEADLINE_STEPS: Final = 8


class ProfilerCost(msgspec.Struct, kw_only=True):
    """The profiled steps against the unprofiled ones (``summary --json`` ``profiler``)."""

    profiled_step_ms: float
    """The profiled steps: as traced (the run's ``traced_step_time_ms``, :func:`on_traced_step`) once the
    traces are read; the timers' (median over ranks of each rank's median profiled step) before."""
    unprofiled_step_ms: float
    """Median over ranks of each rank's median clean unprofiled step (timers; see the module docstring)."""
    slowdown: float
    """``profiled_step_ms / unprofiled_step_ms``."""
    profiled_steps: list[int]
    unprofiled_steps: list[int]
    """The steps each side covers (union over ranks)."""
    left_out_steps: list[int] = msgspec.field(default_factory=list)
    """Unprofiled steps not counted: the first steps, the profiler's warm-up step, the step after the
    trace export, a step cut short (union over ranks)."""
    fewest_unprofiled_steps: int = 0
    """The fewest clean unprofiled steps a rank timed."""
    headline: bool = False
    """Whether the run's step time (``summary --json`` ``step_time_ms``) is ``unprofiled_step_ms``."""
    note: str | None = None
    """Why the step time is the traced one instead (None when ``headline``)."""
    pace_note: str | None = None
    """Where the timers timed the profiled steps faster than the clean ones beyond noise
    (:data:`NOISE_SLOWDOWN`): the two windows ran at different paces, the profiler's share is not known,
    and every figure is the profiled window's carried to the clean steps (:func:`pace_note`)."""
    recorder_ms: float | None = None
    """The recorder's own work in a clean step, as its agent measured it on itself (run.json
    ``ranks[].observer.agent_ms_median``, median over ranks); None in folders that do not hold it."""
    recorder_share: float | None = None
    """That work as a share of the clean step (``agent_share_median``, median over ranks)."""
    closer_base: str = ""
    """How to record a base closer to the run, from what this recording did, or why no recording option
    would (:func:`closer_base`)."""

    @property
    def extra_ms(self) -> float:
        """How much longer a profiled step ran than an unprofiled one (never negative)."""
        return max(0.0, self.profiled_step_ms - self.unprofiled_step_ms)

    @property
    def replay_adds_time(self) -> bool:
        """Whether the profiled steps ran faster than the clean ones, by any margin: a replay without the
        profiler then puts time into the traced steps rather than taking a profiler's share out of them
        (beyond noise, :attr:`pace_note` says why; within it, the share is about nothing), and the words
        that describe the replay say which."""
        return self.profiled_step_ms < self.unprofiled_step_ms

    @property
    def share_ms(self) -> float | None:
        """The profiler's share as every view shows it (``profiler_share_ms``): what the de-profiler took
        out where the timers lead; else the measured excess. None where the profiled steps ran faster
        than the unprofiled ones beyond noise (:attr:`pace_note`), or, where the timers do not lead, at
        all: the two windows ran at different paces, so the share is not known."""
        if self.pace_note is not None:
            return None
        if self.headline:
            return self.extra_ms
        return None if self.profiled_step_ms < self.unprofiled_step_ms else self.extra_ms


def whole_step_times(timers: pd.DataFrame) -> pd.DataFrame:
    """The timers' whole-step records (rank, step, ms), one row per (rank, step)."""
    rows = timers[(timers["unit"] == "") & (timers["phase"] == STEP_TIMER_PHASE)
                  & (timers["kind"] == STEP_TIMER_KIND) & timers["ms"].notna()]
    return rows.groupby(["rank", "step"], as_index=False)["ms"].sum()


def _profiled_of(run: RunInfo, rank: int) -> tuple[list[int], int | None]:
    """(steps the rank's profiler recorded, the rank's partial step)."""
    info = run.rank_info(rank)
    steps = info.profiled_steps if info is not None and info.profiled_steps is not None else run.profile.steps
    return list(steps or []), info.partial_step if info is not None else None


def unit_timed_of(run: RunInfo, rank: int) -> list[int] | None:
    """The steps whose units the rank's timers clocked; None for a recording older than unit-timed
    steps, whose timers clocked the units of every step."""
    info = run.rank_info(rank)
    if info is not None and info.unit_timed_steps is not None:
        return list(info.unit_timed_steps)
    return list(run.profile.unit_timed_steps) if run.profile.unit_timed_steps is not None else None


def script_profiled_of(run: RunInfo, rank: int) -> list[int]:
    """The steps the script's own torch.profiler was on in on ``rank`` (never clean steps)."""
    info = run.rank_info(rank)
    return list(info.script_profiled_steps or []) if info is not None else []


def _split(run: RunInfo, rank: int, step: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Masks over ``step``: the rank's profiled steps, and its clean unprofiled steps (the module
    docstring; a step the rank ended inside counts as neither); None when its profiler recorded no step."""
    profiled, partial = _profiled_of(run, rank)
    if not profiled:
        return None
    usable = step != (partial if partial is not None else -1)
    clean = clean_steps(step.tolist(), profiled=profiled, unit_timed=unit_timed_of(run, rank), partial=partial,
                        script_profiled=script_profiled_of(run, rank))
    return np.isin(step, profiled) & usable, np.isin(step, list(clean))


def _rank_steps(timers: pd.DataFrame, run: RunInfo
                ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per rank whose profiler recorded a step the timers timed: (rank, its timed steps, their ms,
    the profiled mask, the clean unprofiled mask)."""
    for _, rows in whole_step_times(timers).groupby("rank", sort=True):
        rank = int(rows["rank"].iloc[0])
        step = rows["step"].to_numpy()
        masks = _split(run, rank, step)
        if masks is None or not masks[0].any():
            continue
        yield rank, step, rows["ms"].to_numpy(dtype=np.float64), masks[0], masks[1]


def clean_step_rows(timers: pd.DataFrame, run: RunInfo | None) -> pd.DataFrame:
    """The timers' whole-step records (rank, step, ms) of each rank's own clean unprofiled steps (a step
    clean on one rank may not be on another: a script that profiles itself on one rank only)."""
    parts = []
    if run is not None and _timed_run(timers, run):
        parts = [pd.DataFrame({"rank": rank, "step": step[clean], "ms": ms[clean]})
                 for rank, step, ms, _profiled, clean in _rank_steps(timers, run) if clean.any()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({"rank": [], "step": [], "ms": []})


def clean_step_ms(timers: pd.DataFrame, run: RunInfo | None) -> dict[int, tuple[float, int]]:
    """Per rank: (the median of its clean unprofiled steps in ms, how many there are), for the ranks
    that timed at least one (the basis :mod:`fsdpviz.replay.calibration` replays the recording on)."""
    if run is None or not _timed_run(timers, run):
        return {}
    return {rank: (float(np.median(ms[clean])), int(clean.sum()))
            for rank, _step, ms, _profiled, clean in _rank_steps(timers, run) if clean.any()}


STEP_PHASES: Final = ("forward", "backward", "optimizer")  # the whole-step phases the timers time
# a recorder older than the backward's timer timed these two: its ranks are checked on them alone
REQUIRED_PHASES: Final = ("forward", "optimizer")


class PhaseTimes(msgspec.Struct, kw_only=True):
    """A rank's whole-step phases as its timers timed them (ms, medians over steps), profiled and not."""

    profiled: dict[str, float]
    """Each of :data:`STEP_PHASES` the rank timed (every one but the backward in a recording older than
    its timer) and ``step`` over the rank's profiled steps."""
    unprofiled: dict[str, float]
    """The same over its unprofiled steps that timed every phase (below)."""
    steps: int
    """How many such unprofiled steps."""
    profiled_steps: tuple[int, ...] = ()
    """The profiled steps ``profiled`` is read from: those that timed every phase (a rank's first step may
    time only its ends, its phase hooks not yet in place)."""


def phase_times(timers: pd.DataFrame, run: RunInfo | None) -> dict[int, PhaseTimes]:
    """Per rank that timed its phases in profiled steps and in unprofiled ones: both (medians). The
    unprofiled ones are the rank's clean steps, the steps the replay without the profiler is put on,
    where they timed their phases: a CPU rank's in a recording made now, and every unprofiled step of
    a recording older than the unit-timed steps (whose timers timed units and phases in every step, its
    clean ones too). A GPU's clean steps, and those of a CPU folder recorded before they timed their
    phases, time only their ends: no rank then. Unit-timed steps are never read: they carry the unit
    timers' cost, which the clean steps do not. A rank needs the forward and the optimizer; a recorder
    older than the backward's timer timed those two alone, and its ranks are read without one."""
    if run is None or not _timed_run(timers, run):
        return {}
    rows = timers[(timers["unit"] == "") & (timers["kind"] == STEP_TIMER_KIND) & timers["ms"].notna()
                  & timers["phase"].isin([*STEP_PHASES, STEP_TIMER_PHASE])]
    out: dict[int, PhaseTimes] = {}
    for rank, of_rank in rows.groupby("rank", sort=True):
        profiled, partial = _profiled_of(run, int(rank))
        if not profiled:
            continue
        wide = of_rank.pivot_table(index="step", columns="phase", values="ms", aggfunc="sum")
        if any(p not in wide.columns for p in (*REQUIRED_PHASES, STEP_TIMER_PHASE)):
            continue
        wide = wide.dropna()
        steps = wide.index.to_numpy()
        clean = clean_steps(steps.tolist(), profiled=profiled, unit_timed=unit_timed_of(run, int(rank)),
                            partial=partial, script_profiled=script_profiled_of(run, int(rank)))
        unprofiled = wide[np.isin(steps, sorted(clean))]
        traced = wide[np.isin(steps, profiled) & (steps != (partial if partial is not None else -1))]
        if unprofiled.empty or traced.empty:
            continue
        out[int(rank)] = PhaseTimes(profiled={k: float(traced[k].median()) for k in wide.columns},
                                    unprofiled={k: float(unprofiled[k].median()) for k in wide.columns},
                                    steps=len(unprofiled), profiled_steps=tuple(int(s) for s in traced.index))
    return out


def _timed_run(timers: pd.DataFrame, run: RunInfo | None) -> bool:
    return run is not None and not timers.empty and run.profile.schedule == SCHEDULE_OPTIMIZER_STEPS


def closer_base(run: RunInfo) -> str:
    """How to record a base closer to the run, from run.json: ``--no-stack`` where each op's Python stack
    was recorded (the costliest option, docs/recording.md), ``--no-memory`` where the memory profiler was
    on (every allocation an event; a run.json that does not say counts as on, the recorder's default),
    fewer ranks per core where a host ran at least as many ranks as it has cores (each rank's profiler then
    competes for the cores); else why no option would lower the profiler's cost."""
    ways = []
    if run.options.get("stack") is True:
        ways.append("with --no-stack")
    if run.options.get("memory", True) is not False:
        ways.append("with --no-memory")
    crowded, known = crowded_host_names(run)
    if crowded:
        ways.append("with fewer ranks per core")
    if ways:
        return f"record {' or '.join(ways)}, for a base closer to the run"
    return NO_CLOSER_BASE if known else NO_CLOSER_BASE_CORES_UNKNOWN


def crowded_host_names(run: RunInfo) -> tuple[set[str], bool]:
    """(the hosts that ran at least as many ranks as they have cores, whether every host's ranks and
    cores are known). A host's ranks: those run.json lists on it, or, where the ranks are real processes
    (not a fake group's one process) and run.json lists only some, the world size spread over its hosts."""
    per_host: dict[str, list[RankInfo]] = {}
    known = bool(run.ranks)
    for rank in run.ranks:
        if rank.host is None:
            known = False
            continue
        per_host.setdefault(rank.host, []).append(rank)
    spread = -(-run.world_size // len(run.hosts)) if run.world_size and run.hosts else 0
    crowded: set[str] = set()
    for host, ranks in per_host.items():
        cores = max((r.cpu_count for r in ranks if r.cpu_count), default=0)
        if not cores:
            known = False
            continue
        real = all(r.backend != "fake" for r in ranks)
        processes = max(len(ranks), spread) if real else len(ranks)
        if processes >= cores:
            crowded.add(host)
    return crowded, known


def _untimed_words(info: RankInfo) -> str:
    """Why a rank the profiler traced has no timed step of its own to lead with."""
    why = (f"it stopped inside step {info.partial_step}, before its timers wrote the steps it was traced in"
           if info.partial_step is not None else "its timer file cut short or lost")
    return (f"its timers hold none of the steps the profiler traced on it ({why}), so the other ranks' clean steps "
            "cannot stand for it")


def profiler_cost(timers: pd.DataFrame, run: RunInfo | None, ranks: Collection[int] | None = None
                  ) -> ProfilerCost | None:
    """The profiler's cost from a run folder's timers and run.json; None where they do not tell.
    ``ranks``: the ranks whose traces were read (None: run.json's); a rank among them the profiler traced
    whose timers hold none of its steps timed no clean step.

    Whether the run's step time may be the unprofiled one is decided here (``headline``, ``note``)."""
    if run is None or not _timed_run(timers, run):
        return None
    profiled_ms: list[float] = []
    unprofiled_ms: list[float] = []
    profiled_all: set[int] = set()
    unprofiled_all: set[int] = set()
    left_out: set[int] = set()
    clean_counts: dict[int, int] = {}
    for rank, step, ms, is_profiled, is_other in _rank_steps(timers, run):
        clean_counts[rank] = int(is_other.sum())
        left_out.update(int(s) for s in step[~is_profiled & ~is_other])
        if not is_other.any():
            continue
        profiled_ms.append(float(np.median(ms[is_profiled])))
        unprofiled_ms.append(float(np.median(ms[is_other])))
        profiled_all.update(int(s) for s in step[is_profiled])
        unprofiled_all.update(int(s) for s in step[is_other])
    if not profiled_ms:
        return None
    # a rank the profiler traced whose timers hold none of its steps (its file cut short, or lost) timed
    # no clean step either: it counts as such, not as a rank that is not there
    read = None if ranks is None else set(ranks)
    untimed = {info.rank: info for info in run.ranks if info.profiled_steps and info.rank not in clean_counts
               and (read is None or info.rank in read)}
    clean_counts.update(dict.fromkeys(untimed, 0))
    profiled_step = statistics.median(profiled_ms)
    unprofiled_step = statistics.median(unprofiled_ms)
    if unprofiled_step <= 0:
        return None
    slowdown = round(profiled_step / unprofiled_step, 3)
    fewest_rank = min(clean_counts, key=lambda r: (clean_counts[r], r))
    fewest = clean_counts[fewest_rank]
    note = pace = None
    if fewest < MIN_UNPROFILED_STEPS:
        note = (f"the step time is the traced one: rank {fewest_rank} timed {fewest} clean unprofiled step(s) and "
                f"the step time needs {MIN_UNPROFILED_STEPS} on every rank (the first {SETTLING_STEPS} steps, the "
                "profiler's warm-up step, the step after the trace export and the unit-timed steps do not count"
                f"{_script_words(run)}); " + (
                    _untimed_words(untimed[fewest_rank]) if fewest_rank in untimed else _more_steps(run)))
    elif slowdown < NOISE_SLOWDOWN:
        pace = pace_note(fewest)
    observed = [r.observer for r in run.ranks if r.observer is not None and r.observer.agent_ms_median is not None]
    shares = [o.agent_share_median for o in observed if o.agent_share_median is not None]
    return ProfilerCost(profiled_step_ms=round(profiled_step, 3), unprofiled_step_ms=round(unprofiled_step, 3),
                        slowdown=slowdown, profiled_steps=sorted(profiled_all), unprofiled_steps=sorted(unprofiled_all),
                        left_out_steps=sorted(left_out - profiled_all), fewest_unprofiled_steps=fewest,
                        headline=note is None, note=note, pace_note=pace, closer_base=closer_base(run),
                        recorder_ms=round(statistics.median(o.agent_ms_median or 0.0 for o in observed), 4)
                        if observed else None,
                        recorder_share=round(statistics.median(shares), 6) if shares else None)


def pace_note(fewest: int) -> str:
    """What a slowdown below :data:`NOISE_SLOWDOWN` means for the run's figures."""
    return ("the timers timed the profiled steps shorter than the clean unprofiled ones: a profiler "
            "cannot make a step faster, so the machine's pace changed between the two windows (other work on the "
            f"machine, a step that waited). The step time is the clean steps' ({fewest} or more on each rank, the pace "
            "the script's own timer saw); every other figure is the profiled window's carried to it, and the profiler's "
            "share is not known. Record again on a quiet machine for figures measured at the run's own pace")


def on_traced_step(cost: ProfilerCost | None, traced_ms: float | None) -> ProfilerCost | None:
    """``cost`` with the profiled step as traced (``traced_ms``), so that the traced step, the
    slowdown and the profiler's share (:attr:`ProfilerCost.extra_ms`) are one figure each in every view.
    Whether the timers lead (``headline``) stays the timers' own decision, profiled against unprofiled
    steps on one clock. ``cost`` as it is without a traced step."""
    if cost is None or traced_ms is None or traced_ms <= 0:
        return cost
    return msgspec.structs.replace(cost, profiled_step_ms=round(traced_ms, 3),
                                   slowdown=round(traced_ms / cost.unprofiled_step_ms, 3))


def no_cost_note(timers: pd.DataFrame, run: RunInfo | None) -> str | None:
    """Why a run whose timers cover its profiled steps has no :class:`ProfilerCost`: no rank timed a
    clean unprofiled step. None where the run is not timed or not profiled (nothing to explain)."""
    if run is None or not _timed_run(timers, run):
        return None
    profiled = False
    for *_, clean in _rank_steps(timers, run):
        if clean.any():
            return None
        profiled = True
    if not profiled:
        return None
    return (f"the step time is the traced one: the timers hold no clean unprofiled step (the first {SETTLING_STEPS} "
            "steps, the profiler's warm-up step, the step after the trace export and the unit-timed steps do not count"
            f"{_script_words(run)}); "
            + _more_steps(run))


def _script_profiled_any(run: RunInfo) -> bool:
    return any(r.script_profiled_steps for r in run.ranks)


def _script_words(run: RunInfo) -> str:
    """The steps a script's own profiler took from the clean ones, as a clause ("" where none)."""
    return ", nor the steps a profiler of the script's was on in, run.json's notes" if _script_profiled_any(run) else ""


def _more_steps(run: RunInfo) -> str:
    """How to record clean steps: more steps, and where the script profiles itself, fewer steps of its own;
    where the run did not end well (run.json's status), that first: it may have stopped before its clean
    steps (run.json cannot tell a stop in the loop from one after it: a failed rank's last step is its
    ``partial_step`` either way)."""
    stopped = ""
    if run.status in ("failed", "interrupted"):
        seen = [r.steps_seen for r in run.ranks if r.steps_seen]
        at = f" after {max(seen)} step(s)" if seen else ""
        stopped = (f"the run {run.status}{at} (run.json: {run.reason or run.status}), and the steps the timers time "
                   "clean come after the profiled ones; otherwise, ")
    return stopped + _record_more(run)


def _record_more(run: RunInfo) -> str:
    """How to record clean steps (:func:`_more_steps` without the run's status)."""
    if _script_profiled_any(run):
        return ("record more steps than the script's own profiler covers (2 clean ones on every rank, after the first "
                f"{SETTLING_STEPS} and outside fsdpviz's profiled and unit-timed steps), or run the script's profiler "
                "on fewer steps")
    return (f"record at least {FULL_HEADLINE_STEPS} steps with the default schedule, which times the steps after the "
            "profiled ones")


def units_timed_in_clean_steps(timers: pd.DataFrame, run: RunInfo | None) -> bool:
    """Whether the clean steps of this recording also timed its units: a folder recorded before
    unit-timed steps (run.json without ``profile.unit_timed_steps``), whose timers clocked every unit
    in every step. On a launch-bound GPU step that made its clean steps 25-50 % slower than bare."""
    if run is None or not _timed_run(timers, run) or run.profile.unit_timed_steps is not None:
        return False
    return any(unit_timed_of(run, r.rank) is None for r in run.ranks) and bool((timers["unit"] != "").any())


UNIT_PASS_COLUMNS: Final = ["rank", "unit", "phase", "step", "ms"]


def unit_pass_steps(timers: pd.DataFrame, run: RunInfo | None) -> pd.DataFrame:
    """Per rank, unit, pass (``forward`` / ``backward``) and unit-timed step: the unit's own work as the
    timers clock it (kind ``compute``: the pass less its nested units, gathers and reductions; summed over
    a step's micro-batches), in ms. The unit-timed steps are unprofiled steps kept out of the clean ones
    (run.json ``profile.unit_timed_steps``); a recording older than them timed units in every step, and
    its clean unprofiled steps are read. Only units timed in every such step of a rank count.
    :func:`unit_pass_ms` is its median; the report draws its spread."""
    empty = pd.DataFrame({"rank": pd.Series(dtype="int64"), "unit": pd.Series(dtype=str),
                          "phase": pd.Series(dtype=str), "step": pd.Series(dtype="int64"),
                          "ms": pd.Series(dtype="float64")})
    if run is None or not _timed_run(timers, run):
        return empty
    rows = timers[(timers["unit"] != "") & timers["phase"].isin(UNIT_PASSES)
                  & (timers["kind"] == UNIT_TIMER_KIND) & timers["ms"].notna()]
    if rows.empty:
        return empty
    per_step = rows.groupby(["rank", "unit", "phase", "step"], as_index=False)["ms"].sum()
    all_steps = whole_step_times(timers)
    step_ranks, steps_of = all_steps["rank"].to_numpy(), all_steps["step"].to_numpy()
    rank_of, step_of = per_step["rank"].to_numpy(), per_step["step"].to_numpy()
    timed = np.zeros(len(per_step), dtype=bool)
    need = np.zeros(len(per_step), dtype=np.int64)
    for rank in np.unique(rank_of):  # the steps wanted depend on the rank alone
        wanted = _unit_timed_wanted(run, int(rank), steps_of[step_ranks == rank])
        if wanted is None or not len(wanted):
            continue
        mine = rank_of == rank
        timed[mine] = np.isin(step_of[mine], wanted)
        need[mine] = len(wanted)
    # a unit's pass counts where it was timed in every wanted step of its rank
    count = pd.Series(timed).groupby([per_step[c].to_numpy() for c in ("rank", "unit", "phase")]).transform("sum").to_numpy()
    out = per_step[timed & (count >= need) & (need > 0)].reset_index(drop=True)
    if out.empty:
        return empty
    return out.assign(unit=out["unit"].astype(str), phase=out["phase"].astype(str))[UNIT_PASS_COLUMNS]


def _unit_timed_wanted(run: RunInfo, rank: int, rank_steps: np.ndarray) -> np.ndarray | None:
    """The steps of ``rank_steps`` whose units were timed without the profiler: the unit-timed steps
    that completed, less those a profiler of the script's was on in, or, in a recording older than them,
    the clean unprofiled steps."""
    unit_timed = unit_timed_of(run, rank)
    if unit_timed is None:
        masks = _split(run, rank, rank_steps)
        return rank_steps[masks[1]] if masks is not None else None
    _profiled, partial = _profiled_of(run, rank)
    return rank_steps[np.isin(rank_steps, unit_timed) & (rank_steps != (partial if partial is not None else -1))
                      & ~np.isin(rank_steps, script_profiled_of(run, rank))]  # the script's profiler slowed those


def unit_pass_ms(timers: pd.DataFrame, run: RunInfo | None) -> dict[tuple[str, str], float]:
    """Per (unit, ``forward`` / ``backward``): the median over ranks of each rank's median of
    :func:`unit_pass_steps` (the unit's own work in the unprofiled steps)."""
    steps = unit_pass_steps(timers, run)
    medians: dict[tuple[str, str], list[float]] = {}
    for (_rank, unit, phase), group in steps.groupby(["rank", "unit", "phase"], sort=True):
        medians.setdefault((str(unit), str(phase)), []).append(float(group["ms"].median()))
    return {key: round(statistics.median(values), 3) for key, values in medians.items()}
