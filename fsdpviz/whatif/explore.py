"""The advisor: predict a small grid of settings and rank them by step time within a memory budget.

The grid holds what users change first: explicit prefetch of 1 or 2 units, no prefetch (to see what
the recorded overlap is worth), keeping the parameters of the last units unsharded after forward
(no backward all-gather for the units whose backward comes first), merging pairs of units, one unit
for the whole model, and the recorded setting. Settings the recording's framework does not let the
model change are left out and said so.

The budget defaults to the device's memory from the trace (``deviceProperties``). Where the trace
does not say (CPU, where the ranks share the host's memory with everything else on it), there is no
budget unless one is given: every setting is ranked by predicted step time with its predicted peak
beside it, and none is called memory-bound, since no limit is known to be near. (The recorded peak
as a budget made every setting within 10 % of it "memory"-bound, the recording included.)
Settings whose predicted peak fits are ranked by predicted step time; the others are listed apart,
with how much they exceed the budget. A setting whose predicted step moves by no more than the
recording's own step-to-step spread is listed as not measurable in this recording, not ranked. A recording whose
replay misses it by more than ``RELIABLE_REPLAY_PCT`` (or whose out-of-sample phase check misses by more
than ``PHASE_LIMIT_PCT``) says so before the grid (``warnings``) and ranks nothing: its settings are
listed apart (``unranked``), for reading; so does a recording whose spread is unknown (fewer than two
steps of its step time: no change can be called measurable). A single setting whose predicted parts add
up past its predicted step (``Prediction.parts_over_pct``) is listed there too, the rest ranked as usual.

Each setting says which bound it leaves (:class:`StepBound`): the recording's step split
(analysis/bound.py: compute, FSDP's per-unit work, exposed communication, host wait, other idle, on
the run's clock, as whatif's baseline is) moved by what the setting changes in the simulation, and
classified as analysis/bound.py classifies a recorded step (``step_kind``); ``memory`` when its
predicted peak is within ``MEMORY_MARGIN`` of the budget (``is_memory_bound``), as a recorded run is
memory-bound near the device's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.analysis.bound import (
    KIND_MEMORY,
    BoundSummary,
    StepSplit,
    device_memory_bytes,
    is_memory_bound,
    step_kind,
)
from fsdpviz.errors import FsdpvizError
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.replay import prefetch_args
from fsdpviz.replay.clock import PHASE_LIMIT_PCT
from fsdpviz.replay.model import SUPPORTED, Model
from fsdpviz.replay.settings import GIVEN, Settings, Wrap
from fsdpviz.whatif import known
from fsdpviz.whatif.predict import (
    PARTS_OVER_PCT,
    PREFETCH_ALIKE,
    RELIABLE_REPLAY_PCT,
    SPREAD_UNKNOWN_WHY,
    Outcome,
    Prediction,
    predict,
)

BUDGET_DEVICE = "device memory from the trace"
BUDGET_NONE = ("none: the trace does not state the device's memory; every setting ranked by step time, "
               "--memory-budget SIZE ranks within one")
BUDGET_GIVEN = "given"
# How far a recorded split's parts, each rounded to the µs as the summary gives them, can add up from its
# step, itself rounded: five parts and the step, half a µs each. Beyond it the difference is the parts' own
# (medians over ranks), which a predicted split keeps and says.
PARTS_ROUNDING_MS = 0.003


class StepBound(StepSplit, kw_only=True):
    """What bounds a setting's predicted step: the recorded split moved by the simulated change
    (:func:`predicted_bound`), ``kind`` against the memory budget."""

    fsdp_kernels_ms: float | None = None
    """Of ``fsdp_overhead_ms``, FSDP's copy kernels (None on a CPU), as the recorded bound's."""
    note: str | None = None
    """Why the parts add up to more than ``step_ms`` (the prediction's step), where they do, and the recorded
    split's own difference from its step that they keep, where it is more than rounding."""

    def to_json(self) -> dict[str, Any]:
        """whatif ``--json``'s ``bound`` of a setting, in ms to the µs."""
        return {"kind": self.kind, "time_kind": self.time_kind, "step_ms": round(self.step_ms, 3),
                "compute_ms": round(self.compute_ms, 3), "exposed_comm_ms": round(self.exposed_comm_ms, 3),
                "host_wait_ms": None if self.host_wait_ms is None else round(self.host_wait_ms, 3),
                "other_idle_ms": round(self.other_idle_ms, 3), "fsdp_overhead_ms": round(self.fsdp_overhead_ms, 3),
                "fsdp_kernels_ms": None if self.fsdp_kernels_ms is None else round(self.fsdp_kernels_ms, 3),
                "basis": self.basis, "note": self.note}


def predicted_bound(bound: BoundSummary | None, prediction: Prediction, budget_bytes: int | None) -> StepBound | None:
    """The split of ``prediction``'s step and its bound (module docstring); None without a recorded split."""
    if bound is None:
        return None
    base, new = prediction.baseline, prediction.predicted
    # the bound's parts (the run's clock, whatif's baseline) moved by the predicted change. On a GPU, what
    # the step moves beyond compute and communication is the host side's first (the simulated step is the
    # host's: per-unit work fewer units save, launches they no longer wait for), host wait and FSDP's
    # per-unit host work together in proportion, then other idle. On a CPU, FSDP's per-unit work moves as
    # the simulated thread's own does (_cpu_fsdp_work), other idle takes the rest. FSDP's copy
    # kernels move as the prediction's do (a gather a setting drops takes its copies with it), not in
    # compute, which is the model's.
    kernels = bound.fsdp_kernels_ms or 0.0
    fsdp_host = bound.fsdp_overhead_ms - kernels
    if bound.fsdp_kernels_ms is not None and base.fsdp_kernels_ms is not None and new.fsdp_kernels_ms is not None:
        kernels += new.fsdp_kernels_ms - base.fsdp_kernels_ms  # a share of the recorded: never below 0
    host, idle = bound.host_wait_ms, bound.other_idle_ms
    compute = max(bound.compute_ms + new.compute_ms - base.compute_ms, 0.0)
    comm = max(bound.exposed_comm_ms + new.exposed_comm_ms - base.exposed_comm_ms, 0.0)
    step = new.step_time_ms
    rest = step - compute - comm - kernels  # host side and other idle, predicted
    side = (host or 0.0) + fsdp_host
    # what the recorded parts add up to beyond the recorded step stays theirs, not moved into the host side,
    # so that the recorded setting's row is the bound itself, part for part: each part's rounding to the µs,
    # and on a traced split of three ranks or more, medians over ranks that need not add up (the bound's note)
    gap = bound.parts_ms - bound.step_ms
    change = rest - side - idle + gap
    held: list[str] = []  # parts the change would take below 0, held there (said in the note)
    simulated = _cpu_fsdp_work(prediction) if host is None else None
    first = "moves the host side first, then other idle"
    kept = ""  # why FSDP's work is kept as recorded on a CPU, where it is
    if simulated is not None:
        # a CPU thread's FSDP work is simulated op by op (its hooks, each gather's issue, each copy-out, a
        # reduction's host work): it moves as the simulation moves it, and other idle takes the rest
        replayed_ns, simulated_ns = simulated
        moved_side = side * simulated_ns / replayed_ns if replayed_ns > 0 else side
        first = "moves FSDP's per-unit work as the simulated thread's own work moves, then other idle"
        if side > 0 and replayed_ns <= 0:
            kept = (f"FSDP's per-unit work is kept as recorded ({side:.3f} ms): the replay holds none of it, so "
                    "the simulation cannot move it")
    elif host is None and side <= 0:  # no host side to move: the change is other idle
        moved_side = side
    else:
        moved_side = max(side + change, 0.0)
        if side + change < 0:
            held.append(f"the host side (host wait and FSDP's per-unit host work) would come out at "
                        f"{side + change:.3f} ms and is held to 0, other idle taking the rest")
    left_idle = idle + change - (moved_side - side)
    if left_idle < 0:
        held.append(f"other idle would come out at {left_idle:.3f} ms and is held to 0")
    idle = max(left_idle, 0.0)
    if side > 0:
        scale = moved_side / side
        host, fsdp_host = (None if host is None else host * scale), fsdp_host * scale
    elif host is not None:
        host = moved_side
    fsdp = kernels + fsdp_host
    time_kind = step_kind(compute, comm, host, idle, fsdp)
    memory = is_memory_bound(new.peak_allocated_bytes, budget_bytes)
    out = StepBound(kind=KIND_MEMORY if memory else time_kind, time_kind=time_kind,
                    step_ms=step, compute_ms=compute, exposed_comm_ms=comm,
                    host_wait_ms=host, other_idle_ms=idle, basis=bound.basis, fsdp_overhead_ms=fsdp,
                    fsdp_kernels_ms=None if bound.fsdp_kernels_ms is None else kernels)
    parts = out.parts_ms
    notes = [kept] if kept else []
    if held:
        # the predicted step is the simulation's, its split here a rule of thumb: a part it empties is said
        notes.append(f"the split of the predicted step {first}: " + "; ".join(held))
    excess = parts - step - gap  # beyond the recorded parts' own difference from their step
    if excess >= 0.0005:
        # the step is the prediction's (one figure); the parts are not shrunk to meet it
        notes.append(f"the parts add up to {excess:.3f} ms more than the predicted step"
                     + (f" and the recorded parts' own {gap:+.3f} ms" if abs(gap) > PARTS_ROUNDING_MS else "")
                     + (": the model's compute, the exposed communication as moved and FSDP's per-unit work as "
                        "simulated leave no other idle to take the rest" if simulated is not None else
                        ": the simulation takes out more than the recorded host wait, FSDP's host work and other "
                        "idle hold, and the model's compute, FSDP's copy kernels and the exposed communication are "
                        "kept as moved"))
    if abs(gap) > PARTS_ROUNDING_MS:
        notes.append(f"the parts keep the recorded split's own difference from its step ({gap:+.3f} ms: each of its "
                     "parts is the median over ranks of that rank's part, and they need not add up)")
    out.note = "; ".join(notes) or None
    return out


@dataclass(slots=True)
class Candidate:
    """One setting of the grid and its prediction (or why it could not be predicted)."""

    settings: Settings
    prediction: Prediction | None
    skipped: str = ""  # why there is no prediction
    fits: bool | None = True
    """Predicted peak within the budget (True without a budget where the peak is known); None where the
    peak is unknown, with a budget or without (a recording without memory: kept among the settings the
    grid ranks by time, never called within), and for a setting not tried (no prediction)."""
    over_bytes: int | None = None  # how much the predicted peak exceeds the budget (not fitting)
    bound: StepBound | None = None  # what bounds the predicted step

    @property
    def name(self) -> str:
        return self.settings.describe()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"setting": self.name, "fits_budget": self.fits}
        if self.prediction is not None:
            p = self.prediction.predicted
            out.update(step_time_ms=p.step_time_ms, peak_allocated_bytes=p.peak_allocated_bytes,
                       peak_unknown=p.peak_unknown, exposed_comm_ms=p.exposed_comm_ms, over_budget_bytes=self.over_bytes,
                       bound=self.bound.to_json() if self.bound is not None else None,
                       settings=self.prediction.settings_json(), reliable=self.prediction.reliable,
                       parts_over_pct=self.prediction.parts_over_pct, clamps=self.prediction.clamps,
                       apply=self.prediction.apply.to_json() if self.prediction.apply is not None else None)
        else:
            out["skipped"] = self.skipped
        return out


@dataclass(slots=True)
class Exploration:
    """The ranked grid: settings within the budget by predicted step time; those over it apart, by
    how much they exceed it."""

    baseline: Outcome
    budget_bytes: int | None
    budget_source: str
    ranked: list[Candidate]
    over_budget: list[Candidate] = field(default_factory=list)
    skipped: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    within_spread: list[Candidate] = field(default_factory=list)
    """Settings within the budget whose predicted step moves by no more than the recording's own
    step-to-step spread: not measurable in this recording, so not ranked (by predicted step time, for reading)."""
    spread_ms: float | None = None
    warnings: list[str] = field(default_factory=list)
    """What makes every prediction of the grid weak (one model serves them all): said before the ranking."""
    basis: str = "traced"
    """The predictions' clock (``clock.basis``)."""
    clock: dict[str, Any] | None = None
    """``summary --json``'s ``clock`` of the recording."""
    unranked: list[Candidate] = field(default_factory=list)
    """Settings within the budget listed for reading, never ranked: every one where the replay does not
    explain the recording (``ranked`` is then empty), else those whose own prediction's parts add up
    past its step (``parts_over_pct``)."""

    def best(self) -> Candidate | None:
        """The fastest setting ranked (within the budget, or of unknown peak: ``fits`` None), where it is
        measurably faster than the recording."""
        first = next(iter(self.ranked), None)
        if first is None or first.prediction is None:
            return None
        return first if first.prediction.predicted.step_time_ms < self.baseline.step_time_ms else None

    def to_json(self) -> dict[str, Any]:
        return {"basis": self.basis, "clock": self.clock, "baseline": self.baseline.to_json(), "memory_budget_bytes": self.budget_bytes,
                "memory_budget_source": self.budget_source, "spread_ms": self.spread_ms, "warnings": self.warnings,
                "ranked": [c.to_json() for c in self.ranked],
                "within_spread": [c.to_json() for c in self.within_spread],
                "unranked": [c.to_json() for c in self.unranked],
                "over_budget": [c.to_json() for c in self.over_budget],
                "skipped": [c.to_json() for c in self.skipped],
                "notes": self.notes}


def grid(model: Model) -> tuple[list[Settings], list[Candidate]]:
    """The settings to try for this recording, and those left out (with why)."""
    rec = model.recording
    supported = SUPPORTED[rec.framework]
    blocks = [u for u in rec.units if u != ROOT_UNIT]
    recorded = Settings()
    tries: list[Settings] = [recorded]
    left_out: list[Candidate] = []

    def left(settings: Settings, why: str) -> None:
        left_out.append(Candidate(settings=settings, prediction=None, skipped=why, fits=None))

    for depth in ("1", "2", "none"):
        setting = recorded.with_(prefetch=depth)
        if "prefetch" not in supported:
            left(setting, f"{rec.framework}: prefetch is not modelled")
        elif prefetch_args.arguments(rec.framework, depth, []) is None:
            left(setting, f"{rec.framework} prefetches at most {prefetch_args.FSDP1_MAX_DEPTH} unit ahead")
        elif depth != rec.prefetch:
            tries.append(setting)
    keep = sorted({k for k in (1, 2, len(blocks)) if 0 < k <= len(blocks)})
    for k in keep:
        setting = recorded.with_(keep_last_units=k)
        if "keep_last_units" not in supported:
            left(setting, f"{rec.framework}: reshard after forward is not modelled")
        elif not all(not rec.reshard_after_forward.get(u, True) for u in blocks[len(blocks) - k:]):
            tries.append(setting)
    for wrap in ((Wrap("merge", k=2),) if len(blocks) >= 2 else ()) + ((Wrap("root"),) if blocks else ()):
        setting = recorded.with_(wrap=wrap)
        if "wrap" not in supported:
            left(setting, f"{rec.framework}: other wrap policies are not modelled")
        else:
            tries.append(setting)
    return tries, left_out


def device_budget(model: Model) -> int | None:
    """The smallest device memory any rank's trace states, or None (CPU, or not recorded)."""
    return device_memory_bytes(model.result.traces.ranks)


def _cpu_fsdp_work(prediction: Prediction) -> tuple[float, float] | None:
    """A CPU prediction's FSDP per-unit work, (the replay of the recorded setting's, the simulated setting's):
    sums over the steps of ``SimResult.fsdp_host_ns``; None on a GPU, or without replayed steps."""
    if not prediction.replay or not prediction.simulated:
        return None
    if any(r.host_wait_ns is not None for r in prediction.replay):  # a GPU step: split by its idle gaps
        return None
    return sum(r.fsdp_host_ns for r in prediction.replay), sum(r.fsdp_host_ns for r in prediction.simulated)


def split_of(model: Model, prediction: Prediction) -> dict[str, Any] | None:
    """One setting's predicted split and bound (``Prediction.bound``, whatif ``--json``'s ``bound``), as
    :func:`explore` gives that setting's without ``--memory-budget``: the recording's split moved by the
    prediction, held against the device's memory where the trace states it."""
    split = predicted_bound(model.result.summary.bound, prediction, device_budget(model))
    return None if split is None else split.to_json()


def explore(model: Model, budget_bytes: int | None = None) -> Exploration:
    """Predict the grid and rank it (see the module docstring)."""
    tries, left_out = grid(model)
    source = BUDGET_GIVEN
    if budget_bytes is None:
        budget_bytes = device_budget(model)
        source = BUDGET_DEVICE if budget_bytes is not None else BUDGET_NONE
    candidates: list[Candidate] = []
    baseline: Outcome | None = None
    for settings in tries:
        try:
            prediction = predict(model, settings)
        except FsdpvizError as exc:  # a setting this recording cannot support: listed, not fatal
            left_out.append(Candidate(settings=settings, prediction=None, skipped=str(exc), fits=None))
            continue
        baseline = baseline or prediction.baseline
        candidates.append(Candidate(settings=settings, prediction=prediction))
    if baseline is None:
        raise FsdpvizError("no setting of the grid could be predicted for this recording")
    bound = model.result.summary.bound
    for c in candidates:
        assert c.prediction is not None
        peak = c.prediction.predicted.peak_allocated_bytes
        c.fits = None if peak is None else True if budget_bytes is None else peak <= budget_bytes
        c.over_bytes = None if c.fits is not False or peak is None or budget_bytes is None else peak - budget_bytes
        c.bound = predicted_bound(bound, c.prediction, budget_bytes)
    fitting = sorted((c for c in candidates if c.fits is not False),
                     key=lambda c: c.prediction.predicted.step_time_ms if c.prediction else float("inf"))
    over = sorted((c for c in candidates if c.fits is False), key=lambda c: c.over_bytes or 0)
    notes = []
    if bound is None:
        notes.append("no bound per setting: the recording has no step span to split")
    first = candidates[0].prediction
    assert first is not None
    if first.baseline.peak_allocated_bytes is None:  # why no setting is held to a budget
        notes.append(known.model_peak_note(model))
    ranked = [c for c in fitting if c.prediction is not None and c.prediction.measurable is not False]
    within = [c for c in fitting if c not in ranked]
    unranked: list[Candidate] = []
    if not first.reliable:
        # a model that does not explain the recording ranks nothing: its order would be noise
        unranked, ranked, within = ranked + within, [], []
        notes.append(f"not ranked: the replay does not reproduce the run within {RELIABLE_REPLAY_PCT:g} %, or its "
                     f"per-phase check within {PHASE_LIMIT_PCT:g} % (the warning above); the settings are listed for "
                     "reading only")
    elif first.spread_ms is None:
        # no spread to hold a change to: none can be called measurable, so none is ranked (nor advised)
        unranked, ranked, within = ranked + within, [], []
        notes.append(f"not ranked: {SPREAD_UNKNOWN_WHY}, so no change can be called measurable; the settings are "
                     "listed for reading only")
    else:
        # a setting whose own prediction does not hold together (its parts past its step) is read, not ranked
        torn = [c for c in ranked + within if c.prediction is not None and c.prediction.parts_over_pct is not None]
        if torn:
            unranked = torn
            ranked = [c for c in ranked if c not in torn]
            within = [c for c in within if c not in torn]
            notes.append("not ranked: " + ", ".join(c.settings.describe() for c in torn) + ": the predicted parts of "
                         f"the step add up to more than {PARTS_OVER_PCT:g} % past the predicted step (each "
                         "prediction's warning says by how much); listed for reading only")
    prefetches = [(c.settings, c.prediction.notes) for c in candidates
                  if c.prediction is not None and c.settings.sources.get("prefetch") == GIVEN]
    for why in PREFETCH_ALIKE:
        # why the prefetch rows read alike: every depth, or the rows it holds for, named
        alike = [settings for settings, said in prefetches if why.note in said]
        if alike and len(alike) < len(prefetches):
            notes.append(", ".join(s.describe() for s in alike) + f" {why.rows}: {why.reason}")
        elif alike:
            notes.append(f"{why.reason}: {why.depths}")
    return Exploration(baseline=baseline, budget_bytes=budget_bytes, budget_source=source, ranked=ranked,
                       within_spread=within, over_budget=over, skipped=left_out, notes=notes, spread_ms=first.spread_ms,
                       warnings=first.warnings, unranked=unranked, basis=first.basis, clock=first.clock)
