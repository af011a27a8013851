"""Predictions kept in a run folder (``predictions/*.json``) for the report and ``fsdpviz compare``.

A saved prediction is exactly what ``fsdpviz whatif --json`` prints, plus the setting's one-line
name; the report and the compare page show it beside the recording, marked as predicted. A new
recording into the same folder removes them (they described the old one).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.errors import RunFolderError
from fsdpviz.runfolder import PARTIAL_SUFFIX, PREDICTIONS_DIR
from fsdpviz.whatif.predict import Prediction, within_spread_words


@dataclass(frozen=True, slots=True)
class SavedPrediction:
    """One saved prediction: its setting's name and the ``whatif --json`` document."""

    name: str
    path: Path
    data: dict[str, Any]

    @property
    def predicted(self) -> dict[str, Any]:
        return dict(self.data.get("predicted") or {})

    @property
    def baseline(self) -> dict[str, Any]:
        return dict(self.data.get("baseline") or {})

    @property
    def reliable(self) -> bool | None:
        """Whether whatif called the prediction reliable when it was saved (None: a file that does not say)."""
        value = self.data.get("reliable")
        return value if isinstance(value, bool) else None

    @property
    def measurable(self) -> bool | None:
        """Whether whatif called the change measurable (beyond the recording's step-to-step spread) when it
        was saved; None where the spread was unknown, or the file does not say."""
        value = self.predicted.get("measurable")
        return value if isinstance(value, bool) else None

    @property
    def mark(self) -> str:
        """How a page names the prediction: predicted, and unreliable or within the spread where whatif said
        so (unreliable first: it weakens every figure)."""
        if self.reliable is False:
            return "predicted, unreliable"
        return "predicted, within the spread" if self.measurable is False else "predicted"

    @property
    def unreliable_why(self) -> str:
        """whatif's own words for why the prediction is unreliable ("" where it is not, or does not say)."""
        said = [str(w) for w in self.data.get("warnings") or [] if str(w).startswith("unreliable")]
        return said[0] if said and self.reliable is False else ""

    @property
    def caveats(self) -> str:
        """What whatif said weakens the prediction, for a page's hints: why it is unreliable, and that its
        change is within the recording's step-to-step spread ("" where neither)."""
        said = [self.unreliable_why] if self.unreliable_why else []
        spread = self.predicted.get("spread_ms")
        if self.measurable is False and isinstance(spread, (int, float)):
            said.append(within_spread_words(float(spread)))
        return "; ".join(said)


# compare's headline rows a saved prediction holds: the row's key -> the prediction's key
PREDICTED_KEYS: Final = {"step_time_ms": "step_time_ms", "overlap.exposed_comm_ms": "exposed_comm_ms",
                         "overlap.comm_ms": "comm_ms", "overlap.compute_ms": "compute_ms",
                         "memory.peak_allocated_bytes": "peak_allocated_bytes"}
NOT_PREDICTED: Final = ("not predicted: fsdpviz whatif predicts the step, the communication and its exposed part, "
                        "the model's compute, the units, the world size and the peak allocated memory")


def headline_value(saved: SavedPrediction, key: str) -> tuple[Any, Any]:
    """The prediction's value of compare's headline row ``key`` and the recorded one it was predicted from
    (each None where the prediction does not hold the row: :data:`NOT_PREDICTED`)."""
    if key in PREDICTED_KEYS:
        return saved.predicted.get(PREDICTED_KEYS[key]), saved.baseline.get(PREDICTED_KEYS[key])
    if key == "n_units":
        return len(saved.predicted.get("units") or []) or None, len(saved.baseline.get("units") or []) or None
    if key == "world_size":
        setting = (saved.predicted.get("settings") or {}).get("world_size") or {}
        value = setting.get("value") if isinstance(setting, dict) else None
        return (value if isinstance(value, int) else None), None
    return None, None


def not_predicted_why(saved: SavedPrediction, key: str) -> str:
    """Why ``saved`` holds no value of compare's headline row ``key``: for the peak, the prediction's own
    reason (``peak_unknown``: ``--no-memory``, no samples, a world-size change); else :data:`NOT_PREDICTED`."""
    if key == "memory.peak_allocated_bytes":
        why = saved.predicted.get("peak_unknown")  # the note, which names the peak itself
        return why if isinstance(why, str) and why else (
            "the peak is null: the saved prediction's notes say why")  # saved before peak_unknown
    return NOT_PREDICTED


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:80] or "prediction"


def save_prediction(result: RunResult, prediction: Prediction) -> Path:
    """Write ``prediction`` into the run folder of ``result``; an error when there is none."""
    run_dir = result.traces.run_dir
    if not run_dir:
        raise RunFolderError("--save keeps predictions in a run folder (from `fsdpviz record`); "
                             "this run is trace files only: use --json > FILE instead")
    name = prediction.settings.describe()
    folder = Path(run_dir) / PREDICTIONS_DIR
    path = folder / f"{_slug(name)}.json"
    data = {"name": name, **prediction.to_json()}
    tmp = path.with_name(path.name + PARTIAL_SUFFIX)
    try:
        folder.mkdir(exist_ok=True)
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RunFolderError(f"{folder}: cannot save the prediction: {exc.strerror or exc}") from exc
    return path


def load_predictions(run_dir: str | Path | None) -> list[SavedPrediction]:
    """The predictions saved in ``run_dir``, by name; unreadable files are skipped."""
    if not run_dir:
        return []
    folder = Path(run_dir) / PREDICTIONS_DIR
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("predicted"), dict):
            out.append(SavedPrediction(name=str(data.get("name") or path.stem), path=path, data=data))
    return out
