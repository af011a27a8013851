"""``fsdpviz report``: default output locations, the one stdout line, one-line errors with exit 2."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fsdpviz.cli import main

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_run_folder_report_goes_into_the_run_folder(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run, ignore=shutil.ignore_patterns(".fsdpviz-cache", "report.html"))
    code, out, err = _run(["report", str(run)], capsys)
    assert code == 0
    assert out.strip() == str(run / "report.html")
    html = (run / "report.html").read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "Timeline of one step" in html and "Per unit" in html
    assert "fsdpviz: loading" in err and "fsdpviz: wrote" in err  # progress on stderr


def test_loose_traces_report_goes_to_the_working_directory(tmp_path: Path, monkeypatch, capsys) -> None:
    traces = tmp_path / "traces"
    shutil.copytree(SAMPLE / "traces", traces, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = _run(["report", str(traces), "-q", "--no-cache"], capsys)
    assert code == 0 and err == ""
    assert Path(out.strip()) == work / "fsdpviz-report.html"
    assert (work / "fsdpviz-report.html").stat().st_size > 1_000_000  # bokeh's JS is inline


@pytest.mark.parametrize(("args", "message"), [
    (["--ranks", "7"], "error: --ranks: no trace for rank(s) 7 (ranks loaded: 0, 1)"),
    (["--ranks", "x"], "error: --ranks: cannot read 'x'"),
    (["--steps", "2-1"], "error: --steps: cannot read '2-1'"),
    (["-o", "/nonexistent-folder/r.html"], "error: /nonexistent-folder/r.html: cannot write the report"),
])
def test_bad_options_are_one_line_and_exit_2(args: list[str], message: str, capsys) -> None:
    code, out, err = _run(["report", str(SAMPLE), "-q", *args], capsys)
    assert code == 2 and out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_missing_input_is_one_line(tmp_path: Path, capsys) -> None:
    code, _, err = _run(["report", str(tmp_path / "nope")], capsys)
    assert code == 2 and err.strip().endswith("no such file or folder") and "Traceback" not in err
