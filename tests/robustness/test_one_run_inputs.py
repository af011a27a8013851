"""Inputs that look like one run's traces and are not: fsdpviz's own export beside them, traces of
two recordings, a run folder whose traces come from another recording. Each gets a note or one
``error:`` line, never a summary of something else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from badinputs import good_trace, one_error_line
from helpers.kineto import write_trace
from test_bad_input_commands import run_cli


def _write_with_id(path: Path, rank: int, run_id: str | None) -> Path:
    """``good_trace(rank)`` with ``fsdpvizRunId`` in its top level, as ``fsdpviz record`` writes it."""
    b = good_trace(rank=rank)
    trailer = b.trailer() | ({"fsdpvizRunId": run_id} if run_id is not None else {})
    return write_trace(path, {"schemaVersion": 1}, b.events, trailer=trailer)


def _summary_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    code, out, err = run_cli(["summary", "--json", "--no-cache", *argv], capsys)
    assert code == 0, err
    return json.loads(out), err


def test_a_folders_perfetto_export_is_skipped_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in (0, 1):
        good_trace(rank=rank).write(folder / f"rank{rank}.trace.json")
    alone, _ = _summary_json([str(folder)], capsys)
    export = folder / "exported.json.gz"
    code, _, err = run_cli(["export", "--no-cache", str(folder), "--format", "perfetto", "-o", str(export)], capsys)
    assert code == 0 and export.is_file(), err

    # the export holds ranks 0 and 1 again: read as traces, the folder had two files per rank
    with_export, err = _summary_json([str(folder)], capsys)
    assert with_export["ranks"] == [0, 1] and with_export["overlap"] == alone["overlap"]
    assert with_export["step_time_ms"] == alone["step_time_ms"]
    notes = [n for n in with_export["notes"] if "export" in n]
    assert notes == [(f"skipped {export}: fsdpviz's own export of a run (fsdpviz export --format perfetto), not a "
                     "trace of its own; name the file alone to read it back")]
    assert f"warning: {notes[0]}" in err.splitlines()

    # named as a file, the export is read as the run it holds
    back, _ = _summary_json([str(export)], capsys)
    assert back["ranks"] == [0, 1] and back["overlap"]["comm_ms"] == pytest.approx(alone["overlap"]["comm_ms"])

    # a folder holding only the export: one line that says how to read it
    only = tmp_path / "only"
    only.mkdir()
    export.rename(only / export.name)
    code, out, err = run_cli(["summary", str(only)], capsys)
    assert code == 2 and out == ""
    one_error_line(err, rf"{only}: folder holds no traces, only fsdpviz's own export\(s\) \({only / export.name}\); "
                        rf"to read an export back, name the file: fsdpviz summary {only / export.name}$")


def test_traces_of_two_recordings_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "mixed"
    folder.mkdir()
    _write_with_id(folder / "rank0.trace.json", 0, "aaaa1111")
    _write_with_id(folder / "rank1.trace.json", 1, "bbbb2222")
    for argv in ([str(folder)], [str(folder / "rank0.trace.json"), str(folder / "rank1.trace.json")]):
        code, out, err = run_cli(["summary", "--no-cache", *argv], capsys)
        assert code == 2 and out == ""
        one_error_line(err, r"traces of 2 different recordings in one input \(run aaaa1111: \S*rank0\.trace\.json; "
                            r"run bbbb2222: \S*rank1\.trace\.json\); load one run's traces at a time$")

    # one recording's traces load; so do traces without an id (recorded without fsdpviz) beside them
    same = tmp_path / "same"
    same.mkdir()
    _write_with_id(same / "rank0.trace.json", 0, "aaaa1111")
    _write_with_id(same / "rank1.trace.json", 1, None)
    summary, _ = _summary_json([str(same)], capsys)
    assert summary["ranks"] == [0, 1]


def test_a_run_folders_traces_of_another_recording_are_refused(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"format": 1, "status": "ok", "exit_code": 0, "run_id": "cccc3333"}))
    _write_with_id(run / "traces" / "rank0.trace.json", 0, "cccc3333")
    _write_with_id(run / "traces" / "rank1.trace.json", 1, "cccc3333")
    summary, _ = _summary_json([str(run)], capsys)
    assert summary["ranks"] == [0, 1]

    _write_with_id(run / "traces" / "rank1.trace.json", 1, "dddd4444")  # a rank left from another recording
    code, _, err = run_cli(["summary", "--no-cache", str(run)], capsys)
    assert code == 2
    one_error_line(err, rf"{run}: traces of 2 different recordings in one input \(run cccc3333 \(run\.json's\): "
                        r"rank0\.trace\.json; run dddd4444: rank1\.trace\.json\)")

    _write_with_id(run / "traces" / "rank0.trace.json", 0, "dddd4444")  # every trace from the other one
    code, _, err = run_cli(["summary", "--no-cache", str(run)], capsys)
    assert code == 2
    one_error_line(err, rf"{run}: traces of another recording than run\.json's \(run cccc3333\): run dddd4444: "
                        r"rank0\.trace\.json, rank1\.trace\.json; record again into an empty folder")
