"""Recordings committed with the tests (``tests/recorded/``), for the tests that only analyse a recording.

A real recording costs a job of three processes (``fsdpviz record``, the launcher, two ranks: about
12 CPU-seconds on the 2-core machine, 7 of them importing torch). Tests whose subject is what fsdpviz
makes *of* a recording, or what the recorder wrote into it -- the per-unit analysis of explicit
prefetch, gradient accumulation, the memory categories against what the script measured on its own
tensors, whatif against a recording of the setting, compare by parameters, the 2-D meshes -- read a
committed copy of that recording instead: the run folder ``fsdpviz record`` wrote and the truth the
training script wrote about itself in the same run (losses, tensor bytes, mesh sizes). The copy is used
only while everything it was recorded from is unchanged (below). The recorder's process checks
(``test_record.py``'s FSDP2 jobs and short scripts, the recorder's faults, the real clients, the torch
matrix) always record for real; its FSDP1 and ZeRO-3 run folders, held to the model and the frameworks'
labels, are read from committed copies like the rest (their losses are held to a bare run's only when
recorded now: a copy's are another machine's).

``FSDPVIZ_TEST_RECORDINGS`` says where such a test's recording comes from:

- ``committed`` (the default): the committed copy, copied into the session's folder before use (the
  analysis writes its cache beside the traces); a copy whose configuration, training script, recorder
  sources or torch / DeepSpeed version changed since it was recorded is stale: the test records for
  real instead, with a warning that says how to record the copies again (an error where
  ``FSDPVIZ_STALE_RECORDINGS=error``, as CI sets it), so a change to the recorder is checked by these
  tests in ``make test`` too;
- ``fresh``: recorded now, as every test did before (``make test-recordings``, which CI runs, so the
  committed copies never hide what the recorder makes today);
- ``update``: recorded now and written back into ``tests/recorded/`` (``make recordings``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from helpers.once import process_from_json, process_json, shared_processes

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "tests" / "recorded"
RECORDER = REPO / "fsdpviz" / "record"
# Beside fsdpviz/record: the modules its code imports that shape what a recording holds (the run
# folder's layout, the units' names, the timers' and the process groups' labels), and the helper that
# starts the jobs. tests/unit/test_committed_digest.py holds every other import of the recorder to a
# reason it cannot change a recording.
RECORDER_FILES = [REPO / "fsdpviz" / "commands" / "record.py", REPO / "fsdpviz" / "runfolder.py",
                  REPO / "fsdpviz" / "naming.py", REPO / "fsdpviz" / "vocabulary.py",
                  Path(__file__).with_name("jobs.py")]
SOURCE = "source.json"  # in a committed folder: what it was recorded from
RESULT = "result.json"  # in a committed folder: the processes that recorded it (helpers.once's format)
MODES = ("committed", "fresh", "update")
# Never committed: the analysis' parse cache and the session's own marks.
LEFT_OUT = shutil.ignore_patterns(".fsdpviz-cache", RESULT, SOURCE, ".*.lock")


class StaleRecording(UserWarning):
    """A committed recording no longer matches what it was recorded from."""


class StaleRecordingError(RuntimeError):
    """A committed recording no longer matches what it was recorded from, where that is an error."""


def mode() -> str:
    """Where recordings come from in this session (``FSDPVIZ_TEST_RECORDINGS``)."""
    value = os.environ.get("FSDPVIZ_TEST_RECORDINGS", "committed")
    if value not in MODES:
        raise ValueError(f"FSDPVIZ_TEST_RECORDINGS={value!r}: expected one of {', '.join(MODES)}")
    return value


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _recorder_digest() -> str:
    """One digest over what makes a recording besides the training script: the recorder's sources and
    the test helpers that start its jobs."""
    files = sorted({*RECORDER.rglob("*.py"), *RECORDER_FILES})
    return hashlib.sha256("".join(f"{f.relative_to(REPO)} {_digest(f)}\n" for f in files).encode()).hexdigest()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def source_of(identity: dict[str, Any], scripts: Sequence[Path]) -> dict[str, Any]:
    """What a recording is recorded from: the configuration (``identity``, JSON), each training
    script's content by its path in the repository, the recorder's sources and the versions of torch
    and DeepSpeed. A change to any of them makes a committed copy stale."""
    return {"identity": json.loads(json.dumps(identity)),
            "scripts": {str(s.resolve().relative_to(REPO)): _digest(s) for s in scripts},
            "recorder": _recorder_digest(),
            "versions": {package: _version(package) for package in ("torch", "deepspeed")}}


def recorded_once(folder: Path, name: str, identity: dict[str, Any], scripts: Sequence[Path],
                  make: Callable[[], dict[str, subprocess.CompletedProcess | None]],
                  ) -> dict[str, subprocess.CompletedProcess | None]:
    """:func:`helpers.once.shared_processes` for a recording that may come from ``tests/recorded/NAME``.

    ``make`` records into ``folder`` (the run folder and the script's own output); ``identity`` and
    ``scripts`` are what the recording depends on. In ``committed`` mode a matching committed copy is
    copied into ``folder`` and its recording processes are returned as they ran; otherwise ``make``
    records, and in ``update`` mode the result is committed under ``name``.
    """
    committed = COMMITTED / name
    source = source_of(identity, scripts)

    def from_copy() -> dict[str, subprocess.CompletedProcess | None]:
        shutil.copytree(committed, folder, ignore=LEFT_OUT, dirs_exist_ok=True)
        return {key: process_from_json(data) for key, data in json.loads((committed / RESULT).read_text()).items()}

    def recorded() -> dict[str, subprocess.CompletedProcess | None]:
        procs = make()
        if mode() == "update" and all(p is None or p.returncode == 0 for p in procs.values()):
            shutil.rmtree(committed, ignore_errors=True)
            shutil.copytree(folder, committed, ignore=LEFT_OUT)
            (committed / RESULT).write_text(json.dumps({k: process_json(p) for k, p in procs.items()}, indent=1) + "\n")
            (committed / SOURCE).write_text(json.dumps(source, indent=1, sort_keys=True) + "\n")
        return procs

    if mode() != "committed":
        return shared_processes(folder, recorded)
    if not (committed / SOURCE).is_file():
        _stale(f"no committed recording {committed.relative_to(REPO)}: recording it now (`make recordings` commits it)")
        return shared_processes(folder, recorded)
    if json.loads((committed / SOURCE).read_text()) != source:
        _stale(f"{committed.relative_to(REPO)} was recorded from another configuration, training script, recorder "
               "or torch: recording it now (`make recordings` records it again)")
        return shared_processes(folder, recorded)
    return shared_processes(folder, from_copy)


def copy_is_read(name: str, identity: dict[str, Any], scripts: Sequence[Path]) -> bool:
    """Whether a test asking for the recording ``name`` reads its committed copy (``committed`` mode and
    the copy current), not a recording made now (:func:`recorded_once`)."""
    source = COMMITTED / name / SOURCE
    return (mode() == "committed" and source.is_file()
            and json.loads(source.read_text()) == source_of(identity, scripts))


def _stale(message: str) -> None:
    """A warning, and the test goes on with a recording made now; an error where
    ``FSDPVIZ_STALE_RECORDINGS=error`` (CI: a change commits its recordings with it)."""
    if os.environ.get("FSDPVIZ_STALE_RECORDINGS") == "error":
        raise StaleRecordingError(message)
    warnings.warn(StaleRecording(message), stacklevel=3)
