"""A command that fails before it trains: ``fsdpviz record`` says the command's exit code and its
last lines (not what fsdpviz found missing), keeps them in the run folder, and a later ``summary``
of that folder points at run.json's status and that log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from badinputs import one_error_line
from helpers.jobs import REPO, record_argv, record_env
from recordrun import run_record
from test_bad_input_commands import run_cli


def test_a_mistyped_script_name_is_reported_with_its_exit_code_and_last_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    script = tmp_path / "tarin.py"  # the user meant train.py
    proc = run_record(run_dir, [sys.executable, str(script)], timeout=60)
    # python's own message and exit code: 2, "can't open file"
    assert proc.returncode == 2, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("fsdpviz: ")]
    assert ("fsdpviz: nothing recorded: the command exited with code 2 before any process ran the forward of an "
            "FSDP / ZeRO-3 model; its last lines:") in said
    quoted = [line.removeprefix("fsdpviz:   | ") for line in said if line.startswith("fsdpviz:   | ")]
    assert len(quoted) == 1 and "can't open file" in quoted[0] and str(script) in quoted[0]
    assert f"fsdpviz: its last stderr lines are kept in {run_dir / 'logs' / 'command.log'}" in said
    assert not any("no process ran the forward" in line for line in said)
    # the command's own output still reached the terminal, once, before fsdpviz's lines
    assert proc.stderr.count("can't open file") == 2 and proc.stderr.index("can't open file") < proc.stderr.index(
        "fsdpviz: run failed")

    run = json.loads((run_dir / "run.json").read_text())
    assert (run["status"], run["exit_code"], run["ranks"]) == ("failed", 2, [])
    assert run["command_log"] == "logs/command.log" and len(run["run_id"]) == 16
    assert (run_dir / "logs" / "command.log").read_text().splitlines() == quoted

    code, out, err = run_cli(["summary", str(run_dir)], capsys)
    assert code == 2 and out == ""
    one_error_line(err, rf"^error: {run_dir}: run folder has no traces \(traces/ is empty or missing\); the run failed "
                        r"\(command exited with code 2\) before any process ran the forward of an FSDP / ZeRO-3 "
                        rf"model; see {run_dir / 'run.json'} \(status, reason, ranks\) and "
                        rf"{run_dir / 'logs' / 'command.log'}$")


def test_a_command_that_succeeds_without_fsdp_keeps_no_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_record(run_dir, [sys.executable, "-c", "import sys; print('fine', file=sys.stderr)"], timeout=60)
    assert proc.returncode == 0 and "fine" in proc.stderr
    assert "nothing recorded: no process ran the forward of an FSDP / ZeRO-3 model" in proc.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert run["command_log"] is None and not (run_dir / "logs" / "command.log").exists()


def test_a_terminal_stays_a_terminal_for_the_command(tmp_path: Path) -> None:
    """The command's stderr passes through a pseudo-terminal when fsdpviz's is a terminal: the
    command sees one (colours, progress bars unchanged), and its last lines are still kept."""
    pty = pytest.importorskip("pty")
    run_dir = tmp_path / "run"
    child = "import sys; print('stderr is a tty:', sys.stderr.isatty(), file=sys.stderr); sys.exit(4)"
    leader, follower = pty.openpty()
    proc = subprocess.Popen(record_argv(run_dir, [sys.executable, "-c", child]), env=record_env(), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # every writer closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 4
    text = seen.decode().replace("\r\n", "\n")
    assert "stderr is a tty: True\n" in text and "fsdpviz:   | stderr is a tty: True" in text, text
    assert (run_dir / "logs" / "command.log").read_text() == "stderr is a tty: True\n"


def test_a_timers_only_recording_is_said_to_be_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--mode timers`` records no trace by design (the timers only, every step): a later ``summary``
    says the folder was recorded so, where its timers are, and how to record one it reads, not that
    something went missing."""
    from helpers.jobs import EXAMPLE

    run_dir = tmp_path / "run"
    proc = run_record(run_dir, [sys.executable, str(EXAMPLE), "--fake-world", "8", "--layers", "2", "--dim", "64",
                                "--steps", "6"], "--mode", "timers", timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run_dir / "run.json").read_text())["options"]["mode"] == "timers"
    assert sorted(p.name for p in (run_dir / "timers").glob("*.jsonl")) == ["rank0.jsonl"]
    code, out, err = run_cli(["summary", str(run_dir)], capsys)
    assert code == 2 and out == ""
    one_error_line(err, rf"^error: {re.escape(str(run_dir))}: run folder has no traces \(traces/ is empty or "
                        r"missing\); it was recorded with --mode timers \(no profiler\): its step and phase times "
                        rf"are in {re.escape(str(run_dir / 'timers'))}, and fsdpviz's analyses read a trace: record it "
                        r"again without --mode timers \(or with --mode both\)$")
    # the same folder as a failed run (its timers lost): the failure, not the mode, is what it says
    run = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**run, "status": "failed", "reason": "command exited with code 1"}))
    code, _, err = run_cli(["summary", str(run_dir)], capsys)
    assert code == 2 and "the run failed (command exited with code 1)" in err and "--mode timers" not in err
