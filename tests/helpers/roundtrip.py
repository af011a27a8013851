"""What the what-if round trips read of a recording: whatif's JSON, the code it writes, the recorded
units and the training script's losses (tests/integration/test_whatif_*_roundtrip.py)."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path
from typing import Any

from helpers.jobs import NO_OUTPUT, fsdpviz, record_env, retried, torchrun


def record_script(script: Path, run_dir: Path, *args: str) -> Path:
    """``fsdpviz record`` of ``script ARGS`` on 2 gloo ranks into ``run_dir``, its losses logged beside it
    (``--log-losses RUN.loss``), retried as helpers.jobs.retried says (a teardown crash)."""
    proc = retried(lambda: fsdpviz("record", "--out", str(run_dir), *NO_OUTPUT, "--",
                                   *torchrun(script, *args, "--log-losses", str(run_dir.with_suffix(".loss"))),
                                   env=record_env(), timeout=600),
                   tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


def whatif_json(run_dir: Path, *options: str) -> dict[str, Any]:
    """``fsdpviz whatif RUN OPTIONS --json``."""
    proc = fsdpviz("whatif", str(run_dir), *options, "--json", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout))


def shard_code(run_dir: Path, out: Path, *options: str) -> Path:
    """``fsdpviz whatif RUN OPTIONS --code`` written to ``out``."""
    proc = fsdpviz("whatif", str(run_dir), *options, "--code", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out.write_text(proc.stdout)
    return out


def peak_bytes(run_dir: Path) -> int:
    """The recorded peak allocated bytes, as ``fsdpviz summary --json`` says it."""
    proc = fsdpviz("summary", str(run_dir), "--json", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return int(json.loads(proc.stdout)["memory"]["peak_allocated_bytes"])


def typical_peak(run_dir: Path) -> int:
    """The peak most of the recording's steps reach: the median, over ranks and analysed steps, of each
    step's peak allocated bytes. On CPU, gloo's worker thread lets go of a collective's tensors after
    the wait has returned, milliseconds late under load: one step's peak can then hold a buffer that
    every other step had freed (what the recording's own maximum, :func:`peak_bytes`, keeps)."""
    from fsdpviz.analysis.pipeline import analyse

    peaks = analyse([run_dir]).analysis.memory_peaks["peak_allocated_bytes"]
    return int(statistics.median_low(peaks.astype(int).tolist()))


def recorded_units(run_dir: Path) -> dict[str, dict[str, Any]]:
    """run.json's units by name."""
    return {u["unit"]: u for u in json.loads((run_dir / "run.json").read_text())["units"]}


def losses(run_dir: Path, ranks: int | None = None) -> list[str]:
    """The losses the script logged beside ``run_dir`` (``RUN.loss*``), every rank's; ``ranks``: how many
    ranks must have logged (else at least one)."""
    files = sorted(run_dir.parent.glob(f"{run_dir.name}.loss*"))
    assert len(files) == ranks if ranks is not None else files
    return [line for f in files for line in f.read_text().splitlines()]
