"""``fsdpviz compare`` in the terminal shows the runs' saved predictions (``whatif --save``) as the page
does: each predicted figure against the run it was predicted from, read from the saved file; a row the
prediction does not hold is "-" (the page: a dash that says why)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fsdpviz.cli import main
from fsdpviz.formatting import format_ms

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
