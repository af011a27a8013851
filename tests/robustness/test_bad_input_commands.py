"""Every command that reads traces, on every kind of bad input: exit code 2, one ``error:`` line
naming the file and the problem, no traceback, nothing written.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from badinputs import CASES, REPO, good_trace, one_error_line

from fsdpviz.cli import main

COMMANDS = ("summary", "summary --json", "report", "export", "compare", "compare --json")


def argv_for(command: str, path: Path, out: Path, good: Path) -> list[str]:
    """The command line of ``command`` on ``path``, writing (if at all) into ``out``."""
    return {
        "summary": ["summary", str(path)],
        "summary --json": ["summary", "--json", str(path)],
        "report": ["report", "-q", "-o", str(out / "report.html"), str(path)],
        "export": ["export", "-o", str(out / "tables"), str(path)],
        # the bad run first and second: an error for either, whatever was loaded before it
        "compare": ["compare", "-q", "-o", str(out / "compare.html"), str(path), str(good)],
        "compare --json": ["compare", "--json", "-q", str(good), str(path)],
    }[command]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``fsdpviz ARGV`` in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", COMMANDS)
def test_bad_input_is_one_line_and_exit_2(command: str, case: str, tmp_path: Path, good_run: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a bad input and an empty output folder
    path = CASES[case].make(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    # WHEN the command reads it
    code, stdout, stderr = run_cli(argv_for(command, path, out, good_run), capsys)
    # THEN one line names the file and the problem, and nothing was written
    assert code == 2, (stdout, stderr)
    one_error_line(stderr, CASES[case].expected)
    assert stdout == ""  # in particular no half-written JSON
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("argv", [["whatif", "--json"], ["whatif", "--prefetch", "1"], ["report", "-o", "page.html"]],
                         ids=["whatif --json", "whatif", "report"])
def test_a_missing_input_is_one_line_before_any_progress(argv: list[str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # without -q these commands say what they load; a path that is not there is said before that
    missing = CASES["missing path"]
    code, stdout, stderr = run_cli([*argv[:1], str(missing.make(tmp_path)), *argv[1:]], capsys)
    assert code == 2 and stdout == ""
    one_error_line(stderr, missing.expected)


@pytest.mark.parametrize("command", ["summary", "report", "export"])
def test_steps_not_in_the_trace(command: str, tmp_path: Path, good_run: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    path = good_trace().write(tmp_path / "rank0.trace.json")
    out = tmp_path / "out"
    out.mkdir()
    argv = argv_for(command, path, out, good_run)
    code, _, stderr = run_cli([*argv[:-1], "--steps", "7", argv[-1]], capsys)
    assert code == 2
    # the line names the steps there are (the trace holds ProfilerStep#1 and #2)
    one_error_line(stderr, r"rank0\.trace\.json: --steps: step 7 not in this trace, which holds steps 1-2")


@pytest.mark.parametrize("command", ["summary", "report", "export", "compare"])
def test_the_installed_command_prints_the_same_line(command: str, tmp_path: Path, good_run: Path) -> None:
    """The console entry point in a fresh process (no terminal: no progress bar, no warnings)."""
    case = CASES["truncated gzip"]
    path = case.make(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "fsdpviz", *argv_for(command, path, out, good_run)],
                          capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert done.returncode == 2
    one_error_line(done.stderr, case.expected)
    assert done.stdout == "" and list(out.iterdir()) == []


def test_ctrl_c_exits_130_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import fsdpviz.trace.loader

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fsdpviz.trace.loader, "load_run", interrupted)
    code, out, err = run_cli(["summary", str(good_trace().write(tmp_path / "rank0.json"))], capsys)
    assert code == 130 and out == "" and "Traceback" not in err
