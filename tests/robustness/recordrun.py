"""Running ``fsdpviz record`` in tests, and checking that what a run left behind is whole.

``check_complete`` is the promise of the recorder after any ending -- success, a crash, a signal:
no ``.partial`` / ``.tmp`` file is left, every trace is a complete gzip of a complete JSON trace,
every timer line parses, run.json parses. ``summarize_folder`` then runs ``fsdpviz summary
--json`` on the folder as a user would.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers.jobs import REPO, record_argv, record_env

SCRIPTS = Path(__file__).resolve().parent / "record_scripts"
INTEGRATION_SCRIPTS = REPO / "tests" / "integration" / "record_scripts"
TINY = ["--layers", "2", "--dim", "32"]


def start_record(run_dir: Path, command: list[str], *options: str, new_session: bool = False,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """``fsdpviz record`` in the background; ``new_session``: its own process group, as a shell job."""
    return subprocess.Popen(record_argv(run_dir, command, *options), env=env or record_env(), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def run_record(run_dir: Path, command: list[str], *options: str, env: dict[str, str] | None = None,
               timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(record_argv(run_dir, command, *options), env=env or record_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)


def wait_for_pids(marker_dir: Path, proc: subprocess.Popen, ranks: tuple[int, ...] = (0, 1),
                  timeout_s: float = 180) -> dict[int, int]:
    """The pids the paused ranks wrote (see record_scripts/pausing_train.py)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        markers = {r: marker_dir / f"rank{r}.pid" for r in ranks}
        if all(m.exists() for m in markers.values()):
            return {r: int(m.read_text()) for r, m in markers.items()}
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the run ended before pausing (exit {proc.returncode}): {err[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the ranks did not pause in time")


def check_complete(run_dir: Path) -> dict[str, Any]:
    """Assert that every file the run left is whole (see the module docstring); return run.json."""
    leftovers = [p for p in run_dir.rglob("*") if p.name.endswith((".partial", ".tmp"))]
    assert not leftovers, leftovers
    for trace in (run_dir / "traces").glob("*"):
        assert trace.name.endswith(".trace.json.gz"), trace
        doc = json.loads(gzip.decompress(trace.read_bytes()))  # a torn gzip or JSON raises here
        assert isinstance(doc["traceEvents"], list) and doc["traceEvents"], trace
    for timers in (run_dir / "timers").glob("*"):
        assert timers.name.endswith(".jsonl"), timers
        records = [json.loads(line) for line in timers.read_text().splitlines()]
        assert records and all(r["rank"] == int(timers.name[4:-6]) for r in records), timers
    run = json.loads((run_dir / "run.json").read_text())
    for info in run["ranks"]:
        if info["trace"]:
            assert (run_dir / info["trace"]).is_file(), info
    return run


def summarize_folder(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """``fsdpviz summary --json RUN`` (must succeed): the summary and its ``warning:`` lines."""
    done = subprocess.run([sys.executable, "-m", "fsdpviz", "summary", "--json", str(run_dir)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(done.stdout), [line for line in done.stderr.splitlines() if line.startswith("warning: ")]


def timer_records(run_dir: Path, rank: int) -> list[dict[str, Any]]:
    """A rank's timer lines (``timers/rank{R}.jsonl``)."""
    return [json.loads(line) for line in (run_dir / "timers" / f"rank{rank}.jsonl").read_text().splitlines()]


def trace_steps(run_dir: Path, rank: int) -> set[int]:
    """The ProfilerStep numbers in a rank's trace."""
    doc = json.loads(gzip.decompress((run_dir / "traces" / f"rank{rank}.trace.json.gz").read_bytes()))
    return {int(e["name"].split("#")[1]) for e in doc["traceEvents"]
            if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")}
