"""``fsdpviz record -- CMD > log 2>&1``: what the command writes to stdout and stderr reaches the one
file in the order written, as bare, in every step (the profiled ones included, where the ranks' stderr
passes through the profiler's log filter). The script writes ``out S I`` and ``err S I`` in turn, each
flushed (``record_scripts/interleave_train.py``): the order is known by construction."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.jobs import REPO, record_argv, record_env, torchrun
from recordrun import SCRIPTS

SCRIPT = SCRIPTS / "interleave_train.py"
STEPS, LINES = 8, 20


@pytest.mark.slow
@pytest.mark.lifecycle
def test_stdout_and_stderr_into_one_file_keep_their_order(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    with open(log, "wb") as out:  # `> train.log 2>&1`
        done = subprocess.run(record_argv(tmp_path / "run", torchrun(SCRIPT), "--summary"), env=record_env(),
                              cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=240, check=False)
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    written = [line for line in text.splitlines() if line.startswith(("out ", "err "))]
    assert written == [f"{stream} {step} {i}" for step in range(STEPS) for i in range(LINES) for stream in ("out", "err")]
    assert "step time" in text  # fsdpviz's summary, after the command's lines
