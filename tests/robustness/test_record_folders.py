"""``fsdpviz record``'s run folder: refused before the command starts when it cannot hold a
recording (not writable, disk full), never overwritten without ``--force``, replaced cleanly with it.

How the faults are made (we run as root, so permissions do not stop a write):
- unwritable: a path under ``/proc`` (no folder can be created there), and a read-only tmpfs;
- disk full: ``FSDPVIZ_MIN_FREE_MB`` set above the free space of the real disk (the check's own
  input), a 64 KiB tmpfs, and a tmpfs that the command itself fills up while it runs.
The tmpfs cases need the right to mount (root / CAP_SYS_ADMIN) and are skipped without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.jobs import EXAMPLE, record_env, retried, torchrun
from recordrun import TINY, check_complete, run_record

from fsdpviz.errors import RunFolderError, UsageError
from fsdpviz.record.launcher import ENV_MIN_FREE_MB, check_free_space


def _marker_command(marker: Path) -> list[str]:
    """A command that leaves a file behind when it runs."""
    return [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"]


def _one_error(done: subprocess.CompletedProcess, pattern: str) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in done.stderr, done.stderr
    assert pattern in lines[0], lines[0]


def test_unwritable_folder_is_refused_before_the_command_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    done = run_record(Path(f"/proc/fsdpviz-run-{os.getpid()}"), _marker_command(marker))
    _one_error(done, f"/proc/fsdpviz-run-{os.getpid()}: cannot write the run folder")
    assert not marker.exists()


def test_read_only_folder_is_refused_before_the_command_starts(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    read_only = tmpfs("ro", 1024, read_only=True)
    marker = tmp_path / "ran"
    done = run_record(read_only / "run", _marker_command(marker))
    _one_error(done, f"{read_only / 'run'}: cannot write the run folder (Read-only file system)")
    assert not marker.exists()


def test_full_disk_is_refused_before_the_command_starts(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    small = tmpfs("small", 64)
    marker = tmp_path / "ran"
    done = run_record(small / "run", _marker_command(marker))
    _one_error(done, f"{small / 'run'}: only 0.1 MB free on its disk, a recording needs at least 100 MB")
    assert not marker.exists() and not (small / "run").exists()  # nothing created either


def test_free_space_minimum_above_the_disk_is_refused(tmp_path: Path) -> None:
    """The same check on the real disk, by asking for more than it has (no privileges needed)."""
    free_mb = shutil.disk_usage(tmp_path).free / 2**20
    marker = tmp_path / "ran"
    done = run_record(tmp_path / "run", _marker_command(marker),
                      env=record_env(**{ENV_MIN_FREE_MB: str(int(free_mb * 4) + 1)}))
    _one_error(done, f"{tmp_path / 'run'}: only ")
    assert "MB free on its disk" in done.stderr and not marker.exists()


def test_free_space_check_reads_its_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=50 * 2**20))
    with pytest.raises(RunFolderError, match=r"only 50\.0 MB free on its disk, a recording needs at least 100 MB"):
        check_free_space(tmp_path / "run", env={})
    check_free_space(tmp_path / "run", env={ENV_MIN_FREE_MB: "40"})  # enough for a smaller minimum
    check_free_space(tmp_path / "run", env={ENV_MIN_FREE_MB: "0"})  # 0 turns the check off
    with pytest.raises(UsageError, match=ENV_MIN_FREE_MB):
        check_free_space(tmp_path / "run", env={ENV_MIN_FREE_MB: "lots"})


def test_disk_filling_up_during_the_run(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    """The check passed (turned off here), then the disk filled: run.json cannot be written. One
    error line says so, no half-written file is left, the exit code says the recording failed."""
    disk = tmpfs("disk", 512)
    run_dir = disk / "run"
    filler = ("import sys\nf = open(sys.argv[1], 'wb')\ntry:\n    while True:\n        f.write(b'x' * 4096)\n"
              "        f.flush()\nexcept OSError:\n    pass\n")
    done = run_record(run_dir, [sys.executable, "-c", filler, str(run_dir / "filler")],
                      env=record_env(**{ENV_MIN_FREE_MB: "0"}))
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [(f"error: {run_dir / 'run.json'}: cannot write run.json (No space left on device); "
                       "the traces and timers written so far are kept")]
    assert "Traceback" not in done.stderr
    assert not [p for p in run_dir.rglob("*") if p.name.endswith((".partial", ".tmp"))]


@pytest.mark.slow
@pytest.mark.lifecycle
def test_disk_filling_up_under_the_training(tmp_path: Path, tmpfs: Callable[..., Path]) -> None:
    """A real recording on a disk too small for its traces: the training runs to its end exactly as
    without fsdpviz (recording never stops it), each rank says what it could not write, nothing
    half-written is left, run.json is written once the launcher has tidied up."""
    disk = tmpfs("disk", 1536)  # room for timers and run.json, not for a trace (several MB of JSON)
    run_dir = disk / "run"
    done = retried(lambda: run_record(run_dir, torchrun(EXAMPLE, "--framework", "fsdp2", *TINY, "--steps", "6"),
                                      "--warmup", "2", env=record_env(**{ENV_MIN_FREE_MB: "0"})),
                   tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "could not write the trace" in done.stderr
    run = check_complete(run_dir)
    assert run["exit_code"] == 0 and not list((run_dir / "traces").iterdir())


def _previous_run(run_dir: Path) -> dict[str, bytes]:
    """A folder holding an earlier recording and a file of the user's; returns every file's bytes."""
    for sub in ("traces", "timers", "ranks", "traces/.fsdpviz-cache"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    files = {
        "run.json": json.dumps({"label": "earlier", "status": "ok"}).encode(),
        "traces/rank0.trace.json.gz": b"earlier trace",
        "traces/.fsdpviz-cache/rank0.trace.json.gz.x.events.parquet": b"cache",
        "timers/rank0.jsonl": b'{"rank": 0}\n',
        "ranks/rank0.json": b"{}",
        "report.html": b"<html>earlier</html>",
        "notes.txt": b"my notes about this experiment",
    }
    for name, data in files.items():
        (run_dir / name).write_bytes(data)
    return files


def test_existing_run_is_never_overwritten_without_force(tmp_path: Path) -> None:
    run_dir, marker = tmp_path / "run", tmp_path / "ran"
    before = _previous_run(run_dir)
    done = run_record(run_dir, _marker_command(marker))
    _one_error(done, f"{run_dir}: run folder exists and is not empty (use --force to replace it)")
    assert not marker.exists()
    assert {name: (run_dir / name).read_bytes() for name in before} == before


def test_force_replaces_the_recording_and_keeps_the_users_files(tmp_path: Path) -> None:
    run_dir, marker = tmp_path / "run", tmp_path / "ran"
    _previous_run(run_dir)
    done = run_record(run_dir, _marker_command(marker), "--force")
    assert done.returncode == 0 and marker.exists(), done.stderr
    assert (run_dir / "notes.txt").read_bytes() == b"my notes about this experiment"
    assert not (run_dir / "report.html").exists() and not (run_dir / "traces" / ".fsdpviz-cache").exists()
    assert list((run_dir / "traces").iterdir()) == [] and list((run_dir / "timers").iterdir()) == []
    run = json.loads((run_dir / "run.json").read_text())
    assert run["label"] == "run" and run["status"] == "ok" and run["command"][-1].startswith("open(")


def test_force_keeps_the_users_files_in_fsdpvizs_folders(tmp_path: Path) -> None:
    # GIVEN an earlier recording whose logs/ and predictions/ also hold files of the user's
    run_dir, marker = tmp_path / "run", tmp_path / "ran"
    _previous_run(run_dir)
    (run_dir / "logs").mkdir()
    (run_dir / "predictions").mkdir()
    mine = {"logs/train.log": b"my training log", "predictions/my-notes.json": b'{"mine": true}'}
    theirs = {"logs/rank0.log": b"USDT: profiler_start", "logs/command.log": b"last lines",
              "predictions/wrap-root.json": json.dumps({"name": "wrap root", "predicted": {"step_time_ms": 1.0}}).encode()}
    for name, data in {**mine, **theirs}.items():
        (run_dir / name).write_bytes(data)
    # WHEN it is recorded again with --force
    done = run_record(run_dir, _marker_command(marker), "--force")
    # THEN fsdpviz's files are gone and the user's are there, byte for byte
    assert done.returncode == 0 and marker.exists(), done.stderr
    assert {name: (run_dir / name).read_bytes() for name in mine} == mine
    assert not any((run_dir / name).exists() for name in theirs)


def test_force_keeps_a_file_the_recording_would_not_read_and_removes_its_own_leftovers(tmp_path: Path) -> None:
    # GIVEN an earlier recording with files the loader never reads in traces/ (a Finder .DS_Store, a macOS
    # resource fork named as a trace, a run.json) and a --shared launcher's temporary run id left in ranks/
    run_dir, marker = tmp_path / "run", tmp_path / "ran"
    _previous_run(run_dir)
    kept = {".DS_Store": b"finder", "._rank0.trace.json.gz": b"fork", "run.json": b"{}"}
    for name, data in kept.items():
        (run_dir / "traces" / name).write_bytes(data)
    (run_dir / "ranks" / ".run-id.node1.4242").write_text("abcdef")
    # WHEN it is recorded again with --force
    done = run_record(run_dir, _marker_command(marker), "--force")
    # THEN it ran; the file of the user's stays, fsdpviz's leftover is gone
    assert done.returncode == 0 and marker.exists(), done.stderr
    assert {name: (run_dir / "traces" / name).read_bytes() for name in kept} == kept
    assert not (run_dir / "ranks" / ".run-id.node1.4242").exists()


@pytest.mark.parametrize("name", ["my_own_profile.json", "MyTrace.JSON"])  # the loader reads either
def test_force_refuses_a_users_file_the_recording_would_read(tmp_path: Path, name: str) -> None:
    # GIVEN an earlier recording with the user's own trace put into its traces/ folder
    run_dir, marker = tmp_path / "run", tmp_path / "ran"
    before = _previous_run(run_dir)
    (run_dir / "traces" / name).write_bytes(b'{"traceEvents": []}')
    before[f"traces/{name}"] = b'{"traceEvents": []}'
    # WHEN it is recorded again with --force
    done = run_record(run_dir, _marker_command(marker), "--force")
    # THEN one line says why, nothing ran and nothing was removed
    _one_error(done, f"{run_dir}: --force removes only fsdpviz's files, and traces/{name} is not")
    assert not marker.exists()
    assert {name: (run_dir / name).read_bytes() for name in before} == before
