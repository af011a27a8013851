"""The advisor: predict a small grid of settings and rank them by step time within a memory budget.

The grid holds what users change first: explicit prefetch of 1 or 2 units, no prefetch (to see what
the recorded overlap is worth), keeping the parameters of the last units unsharded after forward
(no backward all-gather for the units whose backward comes first), merging pairs of units, one unit
for the whole model, and the recorded setting. Settings the recording's framework does not let the
model change are left out and said so.

The budget defaults to the device's memory from the trace (``deviceProperties``); on CPU, where
the trace does not say, to the recorded peak: "faster without using more memory than today".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdpviz.errors import FsdpvizError
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.whatif.predict import BASIS_TRACED, SUPPORTED, Model, Outcome, Prediction, predict
from fsdpviz.whatif.settings import Settings, Wrap

BUDGET_DEVICE = "device memory from the trace"
BUDGET_RECORDED = "the recorded peak (the trace does not say the device's memory)"
BUDGET_GIVEN = "given"


@dataclass(slots=True)
class Candidate:
    """One setting of the grid and its prediction (or why it could not be predicted)."""

    settings: Settings
    prediction: Prediction | None
    skipped: str = ""  # why there is no prediction
    fits: bool = True  # predicted peak within the budget

    @property
    def name(self) -> str:
        return self.settings.describe()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"setting": self.name, "fits_budget": self.fits}
        if self.prediction is not None:
            p = self.prediction.predicted
            out.update(step_time_ms=p.step_time_ms, peak_allocated_bytes=p.peak_allocated_bytes,
                       exposed_comm_ms=p.exposed_comm_ms, settings=self.settings.to_json())
        else:
            out["skipped"] = self.skipped
        return out


@dataclass(slots=True)
class Exploration:
    """The ranked grid: settings within the budget by predicted step time, then those over it."""

    baseline: Outcome
    budget_bytes: int | None
    budget_source: str
    ranked: list[Candidate]
    skipped: list[Candidate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def best(self) -> Candidate | None:
        """The fastest setting within the budget, if any was predicted."""
        return next((c for c in self.ranked if c.fits), None)

    def to_json(self) -> dict[str, Any]:
        return {"basis": BASIS_TRACED, "baseline": self.baseline.to_json(), "memory_budget_bytes": self.budget_bytes,
                "memory_budget_source": self.budget_source,
                "ranked": [c.to_json() for c in self.ranked], "skipped": [c.to_json() for c in self.skipped],
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
        left_out.append(Candidate(settings=settings, prediction=None, skipped=why, fits=False))

    for depth in ("1", "2", "none"):
        setting = recorded.with_(prefetch=depth)
        if "prefetch" not in supported:
            left(setting, f"{rec.framework}: prefetch is not modelled")
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
    ranks = model.result.traces.ranks
    if "device_memory_bytes" not in ranks.columns:
        return None
    known = [int(v) for v in ranks["device_memory_bytes"] if int(v) > 0]
    return min(known) if known else None


def explore(model: Model, budget_bytes: int | None = None) -> Exploration:
    """Predict the grid and rank it (see the module docstring)."""
    tries, left_out = grid(model)
    source = BUDGET_GIVEN
    if budget_bytes is None:
        budget_bytes = device_budget(model)
        source = BUDGET_DEVICE
    candidates: list[Candidate] = []
    baseline: Outcome | None = None
    for settings in tries:
        try:
            prediction = predict(model, settings)
        except FsdpvizError as exc:  # a setting this recording cannot support: listed, not fatal
            left_out.append(Candidate(settings=settings, prediction=None, skipped=str(exc), fits=False))
            continue
        baseline = baseline or prediction.baseline
        candidates.append(Candidate(settings=settings, prediction=prediction))
    if baseline is None:
        raise FsdpvizError("no setting of the grid could be predicted for this recording")
    if budget_bytes is None:
        budget_bytes = baseline.peak_allocated_bytes
        source = BUDGET_RECORDED
    for c in candidates:
        peak = c.prediction.predicted.peak_allocated_bytes if c.prediction else None
        c.fits = budget_bytes is None or peak is None or peak <= budget_bytes
    ranked = sorted(candidates, key=lambda c: (not c.fits, c.prediction.predicted.step_time_ms
                                               if c.prediction else float("inf")))
    notes = []
    if budget_bytes is None:
        notes.append("no memory budget: the recording has no memory samples; settings ranked by step time only")
    return Exploration(baseline=baseline, budget_bytes=budget_bytes, budget_source=source, ranked=ranked,
                       skipped=left_out, notes=notes)
