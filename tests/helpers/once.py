"""Work done once per test session, whichever pytest-xdist worker asks first.

The suite runs in several worker processes (``pytest -n``); each has its own session fixtures, so a
recording made in a session fixture would be made once per worker. :func:`shared_processes` makes a
folder's contents once per session across every worker: the first worker to ask makes it under an
exclusive file lock, and every later caller (that worker or another) waits for the lock and reads
the result. A ``make`` that raised leaves no result, so the next caller makes it again (and fails the
same way, in its own test).

:func:`session_root` is the folder every worker of one session shares: the controller's base
temporary folder (``pytest-N``; a worker's own is ``pytest-N/popen-gwK``).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

RESULT = "result.json"


def session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base folder every worker of this test session shares."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shared_processes(folder: Path, make: Callable[[], dict[str, subprocess.CompletedProcess | None]]
                     ) -> dict[str, subprocess.CompletedProcess | None]:
    """``make()`` once per session across workers, with ``folder`` (emptied first: a half-made one from a
    ``make`` that raised) for it to write into; the processes it ran, by name, for every caller.
    ``folder/result.json`` marks it done."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(folder.parent / f".{folder.name}.lock"):
        done = folder / RESULT
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            done.write_text(json.dumps({name: process_json(proc) for name, proc in make().items()}))
        return {name: process_from_json(data) for name, data in json.loads(done.read_text()).items()}


def process_json(proc: subprocess.CompletedProcess | None) -> dict[str, Any] | None:
    """A finished process as JSON (its arguments, exit code and output)."""
    if proc is None:
        return None
    return {"args": [str(a) for a in proc.args], "returncode": proc.returncode,
            "stdout": proc.stdout or "", "stderr": proc.stderr or ""}


def process_from_json(data: dict[str, Any] | None) -> subprocess.CompletedProcess | None:
    """The process :func:`process_json` wrote."""
    if data is None:
        return None
    return subprocess.CompletedProcess(data["args"], data["returncode"], data["stdout"], data["stderr"])
