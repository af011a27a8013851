"""The suite's job runner ends a hung job whole: also the processes that left its session or lost
their parent, as torchrun's workers do; a job that fails only by PyTorch's abort at exit runs again."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.jobs import TEARDOWN_CRASH, TRIES, retried, run_job

# A launcher that starts a worker in a session of its own (as torchrun does) and exits at once; the
# worker keeps the job's stdout open and never ends.
LAUNCHER = """
import subprocess, sys
worker = subprocess.Popen([sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"],
                          start_new_session=True)
"""


def test_a_timed_out_job_leaves_no_process_behind() -> None:
    started = time.monotonic()
    done = run_job([sys.executable, "-c", LAUNCHER], timeout=3)
    assert time.monotonic() - started < 60
    assert "(killed after 3 s)" in done.stderr
    worker = int(done.stdout.split()[0])
    for _ in range(50):
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"worker {worker} still runs")


def test_a_job_whose_work_is_done_gets_only_its_grace(tmp_path) -> None:
    """Once ``finished`` says so (here: the job wrote its last line), a job that does not exit is
    killed after ``grace`` seconds, not at its full timeout."""
    flag = tmp_path / "done.txt"
    script = f"import time, pathlib; pathlib.Path({str(flag)!r}).write_text('x'); time.sleep(600)"
    started = time.monotonic()
    done = run_job([sys.executable, "-c", script], timeout=120, finished=flag.exists, grace=2)
    took = time.monotonic() - started
    assert done.returncode == -9 and "(killed after" in done.stderr
    assert took < 30, took


# Fails by the abort at exit as long as its counter file holds fewer than N lines, then exits 0.
ABORTING = """
import pathlib, sys
counter, fails = pathlib.Path(sys.argv[1]), int(sys.argv[2])
runs = len(counter.read_text().splitlines()) if counter.exists() else 0
counter.write_text("run\\n" * (runs + 1))
if runs < fails:
    sys.stderr.write("step 5 loss 0.1\\n" + sys.argv[3] + "\\n")
    sys.exit(134)
"""


def _aborting(tmp_path: Path, fails: int, message: str = TEARDOWN_CRASH
              ) -> tuple[list[int], list[str], subprocess.CompletedProcess]:
    counter, codes, tidied = tmp_path / "runs.txt", [], []

    def attempt() -> subprocess.CompletedProcess:
        done = run_job([sys.executable, "-c", ABORTING, str(counter), str(fails), message], timeout=60)
        codes.append(done.returncode)
        return done

    last = retried(attempt, tidy=lambda: tidied.append("tidy"))
    return codes, tidied, last


def test_a_job_aborted_at_exit_runs_again_into_a_tidied_folder(tmp_path: Path) -> None:
    codes, tidied, last = _aborting(tmp_path, fails=2)
    assert codes == [134, 134, 0] and tidied == ["tidy", "tidy"] and last.returncode == 0


def test_retries_are_bounded_and_keep_the_last_failure(tmp_path: Path) -> None:
    codes, tidied, last = _aborting(tmp_path, fails=TRIES + 2)
    assert codes == [134] * TRIES and len(tidied) == TRIES - 1
    assert last.returncode == 134 and TEARDOWN_CRASH in last.stderr


def test_any_other_failure_is_not_retried(tmp_path: Path) -> None:
    codes, tidied, last = _aborting(tmp_path, fails=5, message="RuntimeError: loss is nan")
    assert codes == [134] and tidied == [] and "loss is nan" in last.stderr
