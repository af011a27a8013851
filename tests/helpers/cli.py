"""``fsdpviz ARGV`` in the test's own process, for tests whose subject is a command's answer rather
than its process: the same entry point as the console script (:func:`fsdpviz.cli.main`), without the
seconds a new interpreter spends importing pandas and the analysis (``helpers.jobs.fsdpviz`` runs a
real process where the process is what a test checks: exit handling, signals, the recorder)."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from fsdpviz.cli import main


def run_here(capsys: pytest.CaptureFixture[str], *argv: str) -> subprocess.CompletedProcess:
    """``fsdpviz ARGV`` through :func:`fsdpviz.cli.main`: its exit code and what it printed."""
    capsys.readouterr()
    try:
        main(list(argv))
        code: Any = 0
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["fsdpviz", *argv], 0 if code is None else code, out, err)


def stdout_here(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """What ``fsdpviz ARGV`` run here printed on stdout; it must exit with 0."""
    done = run_here(capsys, *argv)
    assert done.returncode == 0, done.stderr[-2000:]
    return str(done.stdout)


def json_here(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """The ``--json`` answer of ``fsdpviz ARGV`` run here, which must exit with 0."""
    return dict(json.loads(stdout_here(capsys, *argv)))
