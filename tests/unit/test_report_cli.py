"""``fsdpviz report``: default output locations, the one stdout line, one-line errors with exit 2."""

from __future__ import annotations

import json
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


def test_the_last_step_is_analysed_where_asked_by_report_and_export(tmp_path: Path, capsys) -> None:
    """``--include-last-step`` as ``summary`` takes it: a trace's last step (which the trace cannot show
    complete) left out by default, kept on asking, in the report's page and export's tables. export takes
    ``-q`` as every analysis command does (its progress shows only on a terminal, so here stderr is empty
    either way)."""
    from helpers.kineto import TraceBuilder

    b = TraceBuilder(rank=0, world_size=1)
    b.step(1, 0, 1000).step(2, 1000, 1000).step(3, 2000, 1000)
    for start in (100, 1100, 2100):
        b.kernel("volta_sgemm_128x64_nn", start, 200, launch_us=start - 50)
    trace = b.write(tmp_path / "rank0.trace.json")
    left_out = "Step 3 (cut short) is not analysed"  # the summary's note, as the page says it
    for extra, kept in (([], False), (["--include-last-step"], True)):
        page = tmp_path / f"r{len(extra)}.html"
        code, _, err = _run(["report", str(trace), "-o", str(page), "-q", "--no-cache", *extra], capsys)
        assert code == 0 and err == "", err
        assert (left_out in page.read_text(encoding="utf-8")) is not kept
        out = tmp_path / f"tables{len(extra)}"
        code, _, err = _run(["export", str(trace), "-o", str(out), "--format", "csv", "-q", "--no-cache", *extra],
                            capsys)
        assert code == 0 and err == "", err
        assert json.loads((out / "export.json").read_text())["steps"] == ([1, 2, 3] if kept else [1, 2])
