"""The console script's quick exit (``fsdpviz.cli.run``): the whole answer, the exit code and the exit
handlers survive skipping the interpreter's teardown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[2] / "sample_traces" / "fsdp2-cpu-2rank"


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


def test_the_answer_and_the_exit_handlers_survive(tmp_path: Path) -> None:
    # GIVEN an exit handler registered before the command (as a library a user imports might)
    marker = tmp_path / "handler-ran"
    code = f"""
import atexit, sys
atexit.register(lambda: open({str(marker)!r}, "w").write("yes"))
sys.argv = ["fsdpviz", "summary", "--json", "--no-cache", {str(SAMPLE / "traces")!r}]
from fsdpviz.cli import run
run()
"""
    # WHEN the summary runs through the console script's entry point
    proc = _run(code, tmp_path)
    # THEN the JSON is complete (flushed), the exit code is 0 and the handler ran
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["framework"] == "fsdp2" and summary["world_size"] == 2
    assert marker.read_text() == "yes"


@pytest.mark.parametrize(("argv", "code", "stderr"), [
    (["summary", "/no/such/run"], 2, "error: /no/such/run"),
    (["--version"], 0, ""),
])
def test_exit_codes_are_kept(tmp_path: Path, argv: list[str], code: int, stderr: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "fsdpviz", *argv], check=False, capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == code
    assert stderr in proc.stderr and "Traceback" not in proc.stderr


def test_a_thread_still_running_is_waited_for(tmp_path: Path) -> None:
    # GIVEN a non-daemon thread that finishes after the command
    marker = tmp_path / "thread-done"
    code = f"""
import sys, threading, time
def late():
    time.sleep(0.5)
    open({str(marker)!r}, "w").write("done")
threading.Thread(target=late).start()
sys.argv = ["fsdpviz", "--version"]
from fsdpviz.cli import run
run()
"""
    proc = _run(code, tmp_path)
    # THEN the process exits as usual: after the thread
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "done"
