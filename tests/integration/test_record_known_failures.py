"""``fsdpviz record`` names the fix of a failure it knows, from the command's own error: FSDP1 on CPU
without ``device_id=torch.device("cpu")`` (a real 2-rank job that fails as FSDP1 itself decides)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.jobs import record_env, torchrun
from recording import SCRIPTS, record


@pytest.mark.slow
@pytest.mark.lifecycle
def test_fsdp1_on_cpu_without_device_id_is_told_the_fix(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = record(run_dir, torchrun(SCRIPTS / "fsdp1_cpu_without_device_id.py"), env=record_env())
    # FSDP1's own words, and the exit code of the job
    assert proc.returncode != 0 and "FSDP needs a non-CPU accelerator device" in proc.stderr
    run = json.loads((run_dir / "run.json").read_text())
    assert run["ranks"] == [] and run["exit_code"] == proc.returncode
    [note] = [n for n in run["notes"] if "device_id" in n]
    assert 'device_id=torch.device("cpu")' in note and "FullyShardedDataParallel" in note
    assert f"fsdpviz: note: {note}" in proc.stderr


@pytest.mark.slow
@pytest.mark.lifecycle
def test_an_fsdp2_run_gets_no_such_note(tmp_path: Path) -> None:
    from helpers.jobs import EXAMPLE

    run_dir = tmp_path / "run"
    proc = record(run_dir, torchrun(EXAMPLE, "--layers", "1", "--dim", "16", "--steps", "3"), env=record_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not any("device_id" in n for n in json.loads((run_dir / "run.json").read_text())["notes"])
