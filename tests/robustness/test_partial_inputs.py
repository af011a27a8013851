"""Inputs that are incomplete or odd but usable: every command analyses what is there, says what
is missing or skipped, and exits 0.

- a run folder whose run.json names more ranks than it holds traces for;
- traces with events fsdpviz cannot use (negative / NaN / huge durations, unknown phases or
  categories, fields of the wrong type): skipped, counted, warned about, numbers unchanged;
- traces from a newer PyTorch with fields fsdpviz has never seen: same numbers, no warning.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from badinputs import SAMPLE_RUN, good_trace
from test_bad_input_commands import argv_for, run_cli

COMMANDS = ("summary", "summary --json", "report", "export", "compare")
NUMBERS = ("framework", "world_size", "ranks", "steps", "step_time_ms", "overlap", "memory", "units")


def _summary(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    code, out, err = run_cli(["summary", "--json", "--no-cache", str(path)], capsys)
    assert code == 0, err
    return json.loads(out), err


def _sample_missing_rank(folder: Path) -> Path:
    """The real FSDP2 sample recording without rank 1's trace."""
    run = folder / "run"
    shutil.copytree(SAMPLE_RUN, run, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    (run / "traces" / "rank1.trace.json.gz").unlink()
    return run


def _small_run_missing_rank(folder: Path) -> Path:
    """A run folder of world size 2 (run.json) holding rank 0's trace only: small, fast to report."""
    run = folder / "run"
    (run / "traces").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"format": 1, "label": "run", "world_size": 2, "status": "killed",
                                              "framework": "unknown", "units": []}))
    good_trace(rank=0).write(run / "traces" / "rank0.trace.json.gz")
    return run


@pytest.mark.parametrize("command", COMMANDS)
def test_run_folder_with_a_missing_rank_is_analysed_with_a_warning(
        command: str, tmp_path: Path, good_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a run folder of world size 2 (run.json) whose rank 1 left no trace
    run = _small_run_missing_rank(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    # WHEN any command reads it
    code, stdout, stderr = run_cli(argv_for(command, run, out, good_run), capsys)
    # THEN it succeeds and one warning names the folder and the missing rank
    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [f"warning: {run}: no trace for rank(s) 1 of world size 2; the numbers cover rank(s) 0 only"]
    assert "error" not in stderr and "Traceback" not in stderr
    if command == "summary --json":
        result = json.loads(stdout)
        assert result["ranks"] == [0] and result["world_size"] == 2 and result["missing_ranks"] == [1]
        assert any("no trace for rank(s) 1 of world size 2" in note for note in result["notes"])


def test_missing_ranks_keep_the_numbers_of_the_ranks_present(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    full, _ = _summary(SAMPLE_RUN, capsys)
    partial, _ = _summary(_sample_missing_rank(tmp_path), capsys)
    assert partial["overlap"]["per_rank"] == {"0": full["overlap"]["per_rank"]["0"]}
    assert partial["memory"]["per_rank"] == {"0": full["memory"]["per_rank"]["0"]}


def test_one_trace_file_of_a_larger_job_is_a_note_not_a_warning(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Profiling rank 0 only is common practice: no warning, but the summary says it."""
    path = good_trace(rank=0, world_size=8).write(tmp_path / "rank0.json")
    result, err = _summary(path, capsys)
    assert err == "" and result["missing_ranks"] == list(range(1, 8))
    assert any("no trace for rank(s) 1-7 of world size 8" in note for note in result["notes"])


def _with_bad_events(doc: dict[str, Any]) -> tuple[str, int]:
    """The trace as JSON text with events fsdpviz must skip, and how many there are."""
    bad = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::neg", "pid": 1000, "tid": 1000, "ts": 50, "dur": -5},
        {"ph": "X", "cat": "kernel", "name": "k_neg", "pid": 0, "tid": 7, "ts": 300, "dur": -1,
         "args": {"device": 0, "stream": 7}},
        {"ph": "Q", "cat": "cpu_op", "name": "aten::phase", "pid": 1000, "tid": 1000, "ts": 50, "dur": 5},
        {"ph": "B", "cat": "cpu_op", "name": "aten::begin", "pid": 1000, "tid": 1000, "ts": 50},
        {"ph": "X", "cat": "brand_new_category", "name": "x", "pid": 1000, "tid": 1000, "ts": 50, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::str", "pid": 1000, "tid": 1000, "ts": 50, "dur": "5"},
        {"ph": "X", "cat": "cpu_op", "name": "aten::null", "pid": 1000, "tid": 1000, "ts": None, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::nots", "pid": 1000, "tid": 1000, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::huge", "pid": 1000, "tid": 1000, "ts": 50, "dur": 1e300},
        {"ph": "X", "cat": "cpu_op", "name": "aten::nan", "pid": 1000, "tid": 1000, "ts": 50, "dur": float("nan")},
        "not an event",
    ]
    doc = {**doc, "traceEvents": doc["traceEvents"][:2] + bad + doc["traceEvents"][2:]}
    return json.dumps(doc), len(bad)  # NaN is written as the literal NaN, as some writers do


@pytest.mark.parametrize("command", COMMANDS)
def test_unusable_events_are_skipped_counted_and_warned(command: str, tmp_path: Path, good_run: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a trace with events fsdpviz cannot use among good ones
    text, n_bad = _with_bad_events(good_trace().document())
    path = tmp_path / "rank0.trace.json"
    path.write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    # WHEN a command reads it
    code, _, stderr = run_cli(argv_for(command, path, out, good_run), capsys)
    # THEN it works, and one warning counts the skipped events and names the file
    assert code == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and f"skipped {n_bad} event(s)" in warnings[0] and str(path) in warnings[0]
    assert "Traceback" not in stderr


def test_skipped_events_leave_the_numbers_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    clean, err = _summary(good_trace().write(tmp_path / "clean.json"), capsys)
    assert err == "" and clean["skipped_events"] == 0
    text, n_bad = _with_bad_events(good_trace().document())
    (tmp_path / "dirty.json").write_text(text)
    dirty, _ = _summary(tmp_path / "dirty.json", capsys)
    assert dirty["skipped_events"] == n_bad
    assert any(f"skipped {n_bad} event(s)" in note for note in dirty["notes"])
    assert {k: dirty[k] for k in NUMBERS} == {k: clean[k] for k in NUMBERS}
    assert clean["overlap"]["overlap_pct"] == 50.0  # GEMM 100-200 µs, all-gather 150-250 µs


def _future(value: Any, depth: int = 0) -> Any:
    """``value`` with fields a newer PyTorch might add, at every level of the document."""
    if isinstance(value, dict):
        out = {k: _future(v, depth + 1) for k, v in value.items()}
        out["futureField"] = {"nested": [1, 2.5, None, "x"], "flag": True}
        out["future_number"] = 12345678901234567890
        return out
    if isinstance(value, list):
        return [_future(v, depth + 1) for v in value]
    return value


def test_a_trace_from_a_newer_pytorch_gives_the_same_numbers(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a real FSDP2 recording, and the same with unknown fields in the header, in every
    # event, in every args object, plus metadata events of kinds fsdpviz does not know
    source = SAMPLE_RUN.parent / "fsdp2-cpu-2rank-plain"
    plain, newer = tmp_path / "plain", tmp_path / "newer"
    plain.mkdir()
    newer.mkdir()
    for rank in (0,):
        name = f"rank{rank}.trace.json.gz"
        shutil.copy(source / name, plain / name)
        doc = json.loads(gzip.decompress((source / name).read_bytes()))
        doc = _future(doc)
        doc["traceEvents"].append({"ph": "M", "name": "future_metadata", "pid": 1, "tid": 1, "ts": 0,
                                   "args": {"whatever": 1}})
        (newer / name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    # WHEN both are summarised
    expected, _ = _summary(plain, capsys)
    got, err = _summary(newer, capsys)
    # THEN the numbers are the same and nothing was skipped or warned about
    assert err == "" and got["skipped_events"] == 0
    assert {k: got[k] for k in NUMBERS} == {k: expected[k] for k in NUMBERS}
    assert got["units"] and got["overlap"]["comm_ms"] > 0
