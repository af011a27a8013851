"""A prediction saved with ``fsdpviz whatif --save`` keeps whatif's own verdict on the report's page: a
column whatif called unreliable says so, and its cells say why, in whatif's words (the saved JSON's
``reliable`` and ``warnings``); one whose change whatif called within the recording's spread says that
(``predicted.measurable``, ``predicted.spread_ms``)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import json_here

from fsdpviz.report.predictions import predictions_table
from fsdpviz.whatif.saved import SavedPrediction

SAMPLES = Path(__file__).parents[2] / "sample_traces"


def test_an_unreliable_saved_prediction_is_marked(capsys: pytest.CaptureFixture[str]) -> None:
    data: dict[str, Any] = json_here(capsys, "whatif", str(SAMPLES / "fsdp2-cpu-2rank"), "--wrap", "merge:2",
                                     "--json", "-q", "--no-cache")
    # as whatif said it of the sample: reliable, and merge:2 moves the step by less than its 12 ms spread
    assert data["reliable"] is True and data["predicted"]["measurable"] is False
    spread = data["predicted"]["spread_ms"]
    assert abs(data["predicted"]["step_time_ms"] - data["baseline"]["step_time_ms"]) <= spread
    within = ("not measurable in this recording: the predicted step moves by less than the recording's own step-to-step "
              f"spread ({spread:,.2f} ms)")
    why = "unreliable: out of sample, the model's replay took the profiler's share out of the step's phases"
    weak = copy.deepcopy(data)
    weak["reliable"], weak["warnings"] = False, [why, "the profiler slowed the recorded steps 2.10x"]
    # a file saved before whatif said either
    old = {k: v for k, v in data.items() if k != "reliable"}
    old["predicted"] = {k: v for k, v in data["predicted"].items() if k != "measurable"}
    saved = [SavedPrediction("wrap merge:2", Path("a.json"), data), SavedPrediction("root", Path("b.json"), weak),
             SavedPrediction("pairs", Path("c.json"), old)]
    assert [s.reliable for s in saved] == [True, False, None]
    table = predictions_table(saved)
    assert table.columns == ["", "recorded", "wrap merge:2 (predicted, within the spread)",
                             "root (predicted, unreliable)", "pairs (predicted)"]
    for row in table.rows:
        measured, unreliable, unknown = row[2:]
        assert measured.hint == f"predicted by fsdpviz whatif; {within}"
        assert unknown.hint == "predicted by fsdpviz whatif"
        assert unreliable.hint == f"predicted by fsdpviz whatif; {why}; {within}"
