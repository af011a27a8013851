"""Where ``report``, ``export`` and ``compare`` write: an output they cannot write is one
``error:`` line and exit code 2, and nothing already there is lost (a report or an export from
before stays whole, no temporary file is left).

Unwritable and full disks are made as in ``test_record_folders.py``: a path under a file (any
user), a read-only tmpfs and a tiny tmpfs (root / CAP_SYS_ADMIN, skipped otherwise).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from badinputs import good_trace, one_error_line
from test_bad_input_commands import run_cli

WRITERS = ("report", "export", "compare")
OLD_REPORT = b"<html>the report of yesterday's run</html>"


def _argv(command: str, out: Path, trace: Path, good: Path) -> list[str]:
    return {
        "report": ["report", "-q", "-o", str(out), str(trace)],
        "export": ["export", "-o", str(out), str(trace)],
        "compare": ["compare", "-q", "-o", str(out), str(good), str(trace)],
    }[command]


def _fill(path: Path) -> None:
    """Write ``path`` until its disk is full."""
    f = path.open("wb", buffering=0)
    try:
        while True:
            f.write(b"x" * 4096)
    except OSError:
        pass
    finally:
        f.close()


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith((".tmp", ".partial"))]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return good_trace().write(tmp_path / "rank0.trace.json")


@pytest.mark.parametrize("command", WRITERS)
def test_output_under_a_file(command: str, tmp_path: Path, trace: Path, good_run: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / "sub" / ("tables" if command == "export" else "page.html")
    code, stdout, stderr = run_cli(_argv(command, out, trace, good_run), capsys)
    assert code == 2 and stdout == ""
    one_error_line(stderr, str(out))
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize("command", (*WRITERS, "whatif"))
def test_a_folder_that_takes_no_file_is_said_before_anything_is_loaded(command: str, tmp_path: Path, good_run: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # /proc exists and is a folder, but no file can be made in it (for root too): compare used to print its
    # whole comparison first and fail at the end. The input is garbage, so an error about the output proves
    # that nothing was read first
    garbage = tmp_path / "rank0.trace.json"
    garbage.write_text("not a trace")
    out = Path("/proc") / ("fsdpviz-tables" if command == "export" else "fsdpviz-page.html")
    argv = (["whatif", "-q", "--wrap", "root", "-o", str(out), str(garbage)] if command == "whatif"
            else _argv(command, out, garbage, good_run))
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 2 and stdout == "", stdout
    one_error_line(stderr, f"{out}: cannot write")
    assert "folder /proc takes no new file" in stderr and not out.exists()


@pytest.mark.parametrize("command", ["report", "compare"])
def test_page_output_that_is_a_folder(command: str, tmp_path: Path, trace: Path, good_run: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pages"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, stderr = run_cli(_argv(command, out, trace, good_run), capsys)
    assert code == 2
    one_error_line(stderr, f"{out}: ")
    assert (out / "keep.txt").read_text() == "mine" and not _leftovers(tmp_path)


def test_export_output_that_is_a_file(tmp_path: Path, trace: Path, good_run: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tables.txt"
    out.write_text("mine")
    code, _, stderr = run_cli(_argv("export", out, trace, good_run), capsys)
    assert code == 2
    one_error_line(stderr, f"{out}: exists and is not a folder")
    assert out.read_text() == "mine"


@pytest.mark.parametrize("command", WRITERS)
def test_read_only_output(command: str, trace: Path, good_run: Path, tmpfs: Callable[..., Path],
                          capsys: pytest.CaptureFixture[str]) -> None:
    read_only = tmpfs("ro", 1024, read_only=True)
    out = read_only / ("tables" if command == "export" else "page.html")
    code, _, stderr = run_cli(_argv(command, out, trace, good_run), capsys)
    assert code == 2
    one_error_line(stderr, "Read-only file system")
    assert str(out) in stderr


@pytest.mark.parametrize("command", ["report", "compare"])
def test_full_disk_keeps_the_previous_page(command: str, trace: Path, good_run: Path, tmpfs: Callable[..., Path],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN yesterday's page on a disk too small for a new one (pages are MBs of inlined JS)
    disk = tmpfs("disk", 256)
    out = disk / "page.html"
    out.write_bytes(OLD_REPORT)
    # WHEN the page is written again
    code, _, stderr = run_cli(_argv(command, out, trace, good_run), capsys)
    # THEN one error line, and yesterday's page is whole
    assert code == 2
    one_error_line(stderr, f"{out}: cannot write")
    assert "No space left on device" in stderr
    assert out.read_bytes() == OLD_REPORT and not _leftovers(disk)


def test_full_disk_keeps_the_previous_export(trace: Path, good_run: Path, tmpfs: Callable[..., Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    disk = tmpfs("disk", 512)
    out = disk / "tables"
    code, _, stderr = run_cli(_argv("export", out, trace, good_run), capsys)
    assert code == 0, stderr  # a first export fits
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _fill(disk / "filler")  # then the disk fills up
    code, _, stderr = run_cli(_argv("export", out, trace, good_run), capsys)
    assert code == 2
    one_error_line(stderr, f"-o {out}: cannot write")
    assert "No space left on device" in stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and not _leftovers(disk)


def test_report_into_a_read_only_run_folder(tmp_path: Path, tmpfs: Callable[..., Path],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``fsdpviz report RUN`` writes RUN/report.html by default: a run folder on a read-only disk
    (a shared dataset) still loads (no cache there, silently), and the report says where it failed."""
    disk = tmpfs("dataset", 1024)
    run = disk / "run"
    (run / "traces").mkdir(parents=True)
    (run / "run.json").write_text('{"format": 1, "world_size": 1, "units": []}')
    good_trace(rank=0, world_size=1).write(run / "traces" / "rank0.trace.json.gz")
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    code, _, stderr = run_cli(["report", "-q", str(run)], capsys)
    assert code == 2
    one_error_line(stderr, f"{run / 'report.html'}: cannot write the report")
    assert "Read-only file system" in stderr
    code, out, stderr = run_cli(["summary", "--json", str(run)], capsys)
    assert code == 0 and stderr == "" and '"ranks": [\n    0\n  ]' in out
