"""Every bad input to ``fsdpviz summary``: exit code 2, one ``error: <file>: <problem>`` line, no traceback."""

from __future__ import annotations

import gzip
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.kineto import TraceBuilder

from fsdpviz.cli import main

GEMM = "volta_sgemm_128x64_nn"


def _good_trace(rank: int = 0) -> TraceBuilder:
    b = TraceBuilder(rank=rank)
    b.step(1, 0, 1000).step(2, 1000, 1000)
    b.kernel(GEMM, 100, 100, launch_us=10)
    return b


def _gzip_bytes() -> bytes:
    return gzip.compress(json.dumps(_good_trace().document()).encode())


def _write(name: str, data: bytes | str) -> Callable[[Path], list[Path]]:
    def make(tmp: Path) -> list[Path]:
        path = tmp / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        return [path]

    return make


def _truncated_gzip(tmp: Path) -> list[Path]:
    path = tmp / "cut.json.gz"
    data = gzip.compress(random.Random(1).randbytes(20000) + json.dumps(_good_trace().document()).encode())
    path.write_bytes(data[: len(data) // 2])
    return [path]


def _corrupt_gzip(tmp: Path) -> list[Path]:
    data = bytearray(_gzip_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = b"\xff" * 16
    path = tmp / "corrupt.json.gz"
    path.write_bytes(bytes(data))
    return [path]


def _truncated_json(tmp: Path) -> list[Path]:
    text = json.dumps(_good_trace().document())
    path = tmp / "cut.json"
    path.write_text(text[: len(text) // 2])
    return [path]


def _duplicate_ranks(tmp: Path) -> list[Path]:
    a = _good_trace(rank=1).write(tmp / "a.json")
    b = _good_trace(rank=1).write(tmp / "b.json.gz")
    return [a, b]


def _missing(tmp: Path) -> list[Path]:
    return [tmp / "does-not-exist.json.gz"]


def _above_run(tmp: Path) -> list[Path]:
    above = tmp / "above"
    (above / "run" / "traces").mkdir(parents=True)
    (above / "run" / "run.json").write_text("{}")
    (above / "result.json").write_text('{"returncode": 0}')
    return [above]


def _above_runs(tmp: Path) -> list[Path]:
    above = tmp / "above"
    for name in ("a", "b"):
        (above / name).mkdir(parents=True)
        (above / name / "run.json").write_text("{}")
    (above / "notes.txt").write_text("two settings")
    return [above]


def _empty_folder(tmp: Path) -> list[Path]:
    (tmp / "empty").mkdir()
    return [tmp / "empty"]


CASES: dict[str, tuple[Callable[[Path], list[Path]], str]] = {
    "missing path": (_missing, r"does-not-exist\.json\.gz: no such file"),
    "empty file": (_write("empty.json", b""), r"empty\.json: empty file"),
    "truncated gzip": (_truncated_gzip, r"cut\.json\.gz: truncated gzip"),
    "corrupt gzip": (_corrupt_gzip, r"corrupt\.json\.gz: corrupt gzip"),
    "truncated json": (_truncated_json, r"cut\.json: truncated JSON"),
    "random bytes": (_write("noise.json", b"\x00" + random.Random(0).randbytes(4096)), r"noise\.json: not a JSON trace"),
    "json list": (_write("list.json", "[1, 2, 3]"), r"list\.json: not a Kineto trace \(a JSON list"),
    "object without traceEvents": (_write("other.json", '{"version": 1, "data": []}'), r"other\.json: not a Kineto trace \(no traceEvents\)"),
    "traceEvents not a list": (_write("odd.json", '{"traceEvents": {"a": 1}}'), r"odd\.json: not a Kineto trace"),
    "no events at all": (_write("none.json", '{"traceEvents": []}'), r"none\.json: the trace holds no events"),
    "duplicate ranks": (_duplicate_ranks, r"rank 1 appears in two files: .*a\.json and .*b\.json\.gz"),
    "folder without traces": (_empty_folder, r"empty: folder holds no trace files"),
    # a recording's own folder (the script's JSON beside the run folder): the line points at the run folder
    "the folder above a run folder": (_above_run, (r"above: folder holds no Kineto traces \(1 JSON file\(s\) of "
                                                   r"another kind\); its subfolder run is a run folder: give that one$")),
    "a folder above two run folders": (_above_runs, (r"above: folder holds no trace files \(\*\.json, \*\.json\.gz\); "
                                                     r"its subfolders a, b are run folders: give one of them$")),
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make, expected = CASES[case]
    paths = make(tmp_path)
    code, out, err = _run(["summary", *map(str, paths)], capsys)
    assert code == 2
    assert "Traceback" not in err and out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert re.search(expected, lines[0]), lines[0]


def test_steps_not_in_the_trace_name_the_steps_there_are(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _good_trace().write(tmp_path / "rank0.trace.json")  # ProfilerStep#1 and #2
    code, _, err = _run(["summary", "--steps", "7", str(path)], capsys)
    assert code == 2
    assert err.splitlines() == [f"error: {path}: --steps: step 7 not in this trace, which holds steps 1-2"]
    code, _, err = _run(["summary", "--steps", "2-4", str(path)], capsys)  # one there, two not
    assert code == 2
    assert err.splitlines() == [f"error: {path}: --steps: steps 3-4 not in this trace, which holds steps 1-2"]
    code, out, _ = _run(["summary", "--steps", "1", "--json", str(path)], capsys)  # the GEMM's step
    assert code == 0 and json.loads(out)["steps"] == [1]


def test_bad_steps_option_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _good_trace().write(tmp_path / "rank0.trace.json")
    code, _, err = _run(["summary", "--steps", "x", str(path)], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and "--steps" in err


def test_unreadable_cache_folder_is_not_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _good_trace().write(tmp_path / "rank0.trace.json")
    (tmp_path / ".fsdpviz-cache").write_text("a file where the cache folder would go")
    code, out, err = _run(["summary", "--json", str(path)], capsys)
    assert code == 0 and err == ""
    assert json.loads(out)["ranks"] == [0]


def test_commands_are_registered_once_however_often_main_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """Every in-process run (tests, embedding) parses the command table: it must not grow per call."""
    from fsdpviz.cli import app

    for _ in range(3):
        code, out, _ = _run(["--version"], capsys)
        assert code == 0 and out.startswith("fsdpviz ")
    names = [command.name for command in app.registered_commands]
    assert sorted(names) == ["compare", "export", "record", "report", "summary", "whatif"]
