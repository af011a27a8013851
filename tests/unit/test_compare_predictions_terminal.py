"""``fsdpviz compare`` in the terminal shows the runs' saved predictions (``whatif --save``) as the page
does: each predicted figure against the run it was predicted from, read from the saved file; a row the
prediction does not hold is "-" (the page: a dash that says why); a prediction whose peak is null gives
whatif's own reason for it, in a line under the table and in the page's hint, not "not predicted"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.cli import main
from fsdpviz.commands.compare_table import prediction_gaps, prediction_rows
from fsdpviz.formatting import format_ms
from fsdpviz.replay.model import read_model
from fsdpviz.replay.settings import Settings
from fsdpviz.report.predictions import predictions_table
from fsdpviz.whatif.predict import predict
from fsdpviz.whatif.saved import NOT_PREDICTED, SavedPrediction, load_predictions, not_predicted_why

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code in (0, None)
    return capsys.readouterr().out


def test_the_terminal_shows_the_saved_predictions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "fsdp2"
    shutil.copytree(SAMPLES / "fsdp2-cpu-2rank", run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    _run(["whatif", str(run), "--wrap", "root", "--save", "--no-cache", "-q"], capsys)
    (saved,) = (run / "predictions").glob("*.json")
    predicted = json.loads(saved.read_text())["predicted"]
    out = _run(["compare", str(run), str(SAMPLES / "fsdp1-cpu-2rank"), "--no-cache", "-q", "-o",
                str(tmp_path / "compare.html")], capsys)
    assert "saved predictions (fsdpviz whatif --save)" in " ".join(out.split())
    table = out[out.index("saved predictions"):out.index("per-unit comparison")]
    assert "wrap root (predicted" in table
    cells = {c[0]: c[1] for line in table.splitlines()
             if len(c := [x.strip() for x in line.strip("│ ").split("│")]) == 2}
    assert cells["step time"].split(" (")[0] == format_ms(predicted["step_time_ms"])
    assert cells["world size"] == str(predicted["settings"]["world_size"]["value"])
    assert cells["FSDP units"].split(" (")[0] == str(len(predicted["units"]))


def test_a_null_predicted_peak_gives_whatifs_reason_not_not_predicted(tmp_path: Path) -> None:
    # GIVEN a prediction, as --save writes it, of a world-size change on plain CPU traces: the level never
    # counted the shards made before the trace, so whatif predicts no peak and a note says why
    shutil.copytree(SAMPLES / "fsdp2-cpu-2rank-plain", tmp_path / "plain")
    prediction = predict(read_model(analyse([tmp_path / "plain"], cache=False)), Settings().with_(world_size=4))
    (why,) = [n for n in prediction.notes if "world size 2 -> 4: not predicted" in n]
    saved = SavedPrediction(name="world size 4", path=tmp_path / "world-size-4.json",
                            data={"name": "world size 4", **prediction.to_json()})
    assert saved.predicted["peak_allocated_bytes"] is None and saved.predicted["peak_unknown"] == why
    # THEN compare's peak row says whatif's reason; the rows whatif does not predict keep the general words
    assert not_predicted_why(saved, "memory.peak_allocated_bytes") == why
    assert not_predicted_why(saved, "memory.peak_reserved_bytes") == NOT_PREDICTED
    assert prediction_gaps([("plain", saved)], "memory.peak_allocated_bytes") == [
        f"plain's world size 4: {why}"]
    assert ["peak allocated", "-"] in prediction_rows([("plain", saved)])
    # AND a file saved before the reason was kept says where to read it
    del saved.data["predicted"]["peak_unknown"]
    assert not_predicted_why(saved, "memory.peak_allocated_bytes") == (
        "the peak is null: the saved prediction's notes say why")


def test_a_run_recorded_without_memory_compares_its_prediction_with_the_reason(
        gpu_h200_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN H200 model B recorded with --no-memory (Bl) and a saved prediction of it
    run = tmp_path / "Bl"
    shutil.copytree(gpu_h200_dir / "Bl", run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    _run(["whatif", str(run), "--prefetch", "1", "--save", "--no-cache", "-q"], capsys)
    # WHEN compared with B, in the terminal and on the page
    page = tmp_path / "compare.html"
    out = _run(["compare", str(gpu_h200_dir / "B"), str(run), "--no-cache", "-q", "-o", str(page)], capsys)
    # THEN the peak's dash says why: the recording's --no-memory, in whatif's words
    flat = " ".join(out.split())
    assert ("- peak allocated, Bl's prefetch 1: no memory in the analysed steps: it was recorded with --no-memory "
            "(run.json)") in flat
    html = page.read_text()
    assert ("no memory in the analysed steps: it was recorded with --no-memory (run.json), so the peak memory is null, "
            "and whatif predicts no peak (--explore ranks by step time alone) (predicted from Bl)") in html
    # AND the run's own report: its Predicted settings table's peak cells, recorded and predicted, say it too
    peak = next(row for row in predictions_table(load_predictions(run)).rows if row[0].text == "peak allocated")
    assert [c.text for c in peak[1:]] == ["n/a", "n/a"]
    assert peak[2].hint.startswith(peak[1].hint) and peak[1].hint.startswith(
        "no memory in the analysed steps: it was recorded with --no-memory (run.json)")
