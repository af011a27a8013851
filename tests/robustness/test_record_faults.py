"""``fsdpviz record`` when the training does not end well: a rank killed by SIGTERM or SIGKILL,
Ctrl-C in the terminal, an exception inside the profiled steps.

Each run is the example trainer on 2 CPU ranks. The signals arrive while every rank is paused after
step 2 of the profiled steps 1-4 (``record_scripts/pausing_train.py``); the exception is raised by
rank 0 after step 4 of the profiled steps 2-5 (``failing_train.py`` of the integration tests). So
the traces are still in the profiler's memory and must be written on the way out. After every
ending the launcher returns the command's exit code, run.json says what happened, every file left
is whole, and the folder loads.
(``tests/integration/test_record.py`` covers SIGTERM to the launcher after the profiled steps.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from helpers.jobs import record_env, torchrun
from recordrun import (
    INTEGRATION_SCRIPTS,
    SCRIPTS,
    TINY,
    check_complete,
    run_record,
    start_record,
    summarize_folder,
    timer_records,
    trace_steps,
    wait_for_pids,
)

PAUSE_AT = 2
PROFILE = ("--warmup", "1", "--steps", "4")  # profiles steps 1-4: the pause after step 2 is inside
FAIL_AT = 4


def _paused_run(tmp_path: Path, *, new_session: bool = False) -> tuple[Path, subprocess.Popen, dict[int, int]]:
    run_dir, markers = tmp_path / "run", tmp_path / "markers"
    markers.mkdir()
    command = torchrun(SCRIPTS / "pausing_train.py", str(PAUSE_AT), str(markers), "--framework", "fsdp2", *TINY,
                       "--steps", "50")
    proc = start_record(run_dir, command, *PROFILE, new_session=new_session)
    return run_dir, proc, wait_for_pids(markers, proc)


@pytest.mark.slow
@pytest.mark.lifecycle
def test_sigterm_on_one_rank(tmp_path: Path) -> None:
    # GIVEN a run paused inside its profiled steps
    run_dir, proc, pids = _paused_run(tmp_path)
    # WHEN rank 1 alone gets SIGTERM (a scheduler or an OOM killer picking one process)
    os.kill(pids[1], signal.SIGTERM)
    _, stderr = proc.communicate(timeout=180)
    # THEN torchrun stops rank 0 too; both flush what they profiled; the exit code is torchrun's
    run = check_complete(run_dir)
    assert proc.returncode == run["exit_code"] != 0, stderr[-3000:]
    assert run["status"] == "interrupted" and run["reason"], run["reason"]
    assert run["ranks"][1]["status"] == "interrupted" and run["ranks"][1]["reason"] == "received SIGTERM"
    assert run["ranks"][0]["status"] == "interrupted"
    for rank in (0, 1):  # the steps profiled before the signal; the one it cut is not a full step
        assert {1, 2} <= trace_steps(run_dir, rank) <= {1, 2, 3}
    summary, warnings = summarize_folder(run_dir)
    assert summary["ranks"] == [0, 1] and summary["steps"] and warnings == []


@pytest.mark.slow
@pytest.mark.lifecycle
def test_sigkill_on_one_rank(tmp_path: Path) -> None:
    # GIVEN a run paused inside its profiled steps
    run_dir, proc, pids = _paused_run(tmp_path)
    # WHEN rank 1 is killed outright: nothing of it runs any more, its profile is lost
    os.kill(pids[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=180)
    # THEN rank 0 still writes its trace; rank 1 is marked killed; its complete timer lines are kept
    run = check_complete(run_dir)
    assert proc.returncode == run["exit_code"] != 0, stderr[-3000:]
    assert run["status"] in ("failed", "interrupted") and run["reason"]
    killed = run["ranks"][1]
    assert killed["status"] == "killed" and "SIGKILL" in killed["reason"] and killed["trace"] is None
    assert sorted(p.name for p in (run_dir / "traces").iterdir()) == ["rank0.trace.json.gz"]
    assert (run_dir / "timers" / "rank1.jsonl").is_file()  # salvaged from the unfinished file
    assert any("kept the complete lines" in note for note in run["notes"])
    # AND the folder loads: the ranks present are analysed, the missing one is named
    summary, warnings = summarize_folder(run_dir)
    assert summary["ranks"] == [0] and summary["missing_ranks"] == [1]
    assert warnings == [(f"warning: {run_dir}: no trace for rank(s) 1 of world size 2; "
                         "the numbers cover rank(s) 0 only")]


@pytest.mark.slow
@pytest.mark.lifecycle
def test_ctrl_c_in_the_terminal(tmp_path: Path) -> None:
    # GIVEN fsdpviz record as the foreground job of a terminal (its own process group)
    run_dir, proc, _ = _paused_run(tmp_path, new_session=True)
    # WHEN Ctrl-C is pressed: the terminal sends SIGINT to that process group
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=180)
    # THEN the launcher passes it on, every rank writes what it has, the exit code is the command's
    run = check_complete(run_dir)
    assert run["status"] == "interrupted" and run["reason"] == "SIGINT sent to fsdpviz record"
    assert proc.returncode == run["exit_code"] != 0, stderr[-3000:]
    for rank in (0, 1):
        assert run["ranks"][rank]["status"] == "interrupted"
        assert {1, 2} <= trace_steps(run_dir, rank)
    summary, warnings = summarize_folder(run_dir)
    assert summary["ranks"] == [0, 1] and warnings == []


@pytest.mark.slow
@pytest.mark.lifecycle
def test_exception_inside_the_profiled_steps_keeps_the_data_and_the_exit_code(tmp_path: Path) -> None:
    # GIVEN a script whose rank 0 raises after optimizer step 4, inside the profiled steps 2-5
    run_dir = tmp_path / "run"
    command = torchrun(INTEGRATION_SCRIPTS / "failing_train.py", str(FAIL_AT), "--framework", "fsdp2", *TINY,
                       "--steps", "10")
    # WHEN it runs under fsdpviz record, and on its own
    done = run_record(run_dir, command, "--warmup", "2", "--steps", "4")
    plain = subprocess.run(command, check=False, env=record_env(), capture_output=True, text=True, timeout=240)
    # THEN the exit code is the command's own, run.json says why it failed, every file left is whole
    assert done.returncode == plain.returncode != 0
    run = check_complete(run_dir)
    assert run["status"] == "failed" and run["exit_code"] == done.returncode
    assert f"RuntimeError: injected failure at step {FAIL_AT}" in run["reason"]
    rank0, rank1 = run["ranks"]
    # it failed between steps, at the top of the next one, which the profiler had begun
    assert rank0["status"] == "failed" and rank0["partial_step"] == FAIL_AT + 1
    # Rank 1 was inside the next step when its peer vanished: gloo raised, or torchrun stopped it.
    assert rank1["status"] in ("failed", "interrupted") and rank1["partial_step"] == FAIL_AT + 1
    for rank in (0, 1):  # traces written at exit: the schedule (steps 2-5) never ended
        assert {2, 3, 4} <= trace_steps(run_dir, rank)
        steps = {r["step"] for r in timer_records(run_dir, rank) if r["phase"] == "step" and r["kind"] == "total"}
        assert steps == set(range(FAIL_AT + 1 + rank))
    partial = [r for r in timer_records(run_dir, 1) if r.get("partial")]
    assert partial and {r["step"] for r in partial} == {FAIL_AT + 1}
    # AND the folder loads as it is
    summary, warnings = summarize_folder(run_dir)
    assert summary["ranks"] == [0, 1] and summary["units"] and warnings == []
