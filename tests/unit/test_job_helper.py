"""The suite's job runner ends a hung job whole: also the processes that left its session or lost
their parent, as torchrun's workers do."""

from __future__ import annotations

import os
import sys
import time

from helpers.jobs import run_job

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
