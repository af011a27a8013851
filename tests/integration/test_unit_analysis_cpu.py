"""Per-unit analysis of real 2-rank CPU/gloo recordings that use explicit prefetch.

``fsdpviz record`` runs the example trainer with FSDP2 ``--prefetch 1``
(``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch`` one unit ahead), FSDP1
``--prefetch 1`` (``forward_prefetch=True``) and DeepSpeed ZeRO-3 ``--prefetch 1`` (a prefetch bucket
of one block; blocks as ZeRO-3 leaf modules). Independent facts: the prefetch setting the trainer was
given (and run.json reports), FSDP2's own ``FSDP::forward_prefetch for X`` labels, the ProfilerStep
ranges (step time), and ``fsdpviz export`` reproducing the same numbers from the run folder.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fsdpviz.analysis.run import RunAnalysis, analyze_run
from fsdpviz.trace import load_traces

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train.py"
MODEL = ["--layers", "3", "--dim", "32", "--steps", "7", "--seed", "0", "--prefetch", "1"]
PROFILED_STEPS = "4"  # steps 2-5 profiled, 2-4 analysed (the last is cut short)
FRAMEWORKS = ["fsdp2", "fsdp1"] + (["zero3"] if importlib.util.find_spec("deepspeed") is not None else [])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _record(out: Path, framework: str) -> Path:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.pop("FSDPVIZ_RUN_DIR", None)
    command = [sys.executable, "-m", "fsdpviz", "record", "--out", str(out), "--no-report", "--no-summary",
               "--steps", PROFILED_STEPS, "--",
               sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
               "127.0.0.1", "--master_port", str(_free_port()), str(EXAMPLE), "--framework", framework,
               "--wrap", "block", *MODEL]
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, RunAnalysis]]:
    base = tmp_path_factory.mktemp("prefetch")
    out = {}
    for framework in FRAMEWORKS:
        folder = _record(base / framework, framework)
        out[framework] = (folder, analyze_run(load_traces([folder], cache=False)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["fsdp2", "fsdp1"])
def test_explicit_prefetch_gathers_one_unit_ahead(runs, framework: str) -> None:
    _, analysis = runs[framework]
    us = analysis.unit_steps
    blocks = us[(us["phase"] == "forward") & us["unit"].str.startswith("blocks.")]
    later = blocks[blocks["unit"] != "blocks.0"]
    assert len(later) == 2 * len(analysis.steps) * 2  # blocks.1-2, two ranks, every step
    assert (later["issue_depth"] == 1).all()
    # issued before the previous block started computing, by the previous block
    for (_, _), rows in blocks.groupby(["rank", "step"]):
        rows = rows.sort_values("compute_start_ns")
        assert (rows["ag_issue_ns"].to_numpy()[1:] < rows["compute_start_ns"].to_numpy()[:-1]).all()
        assert (rows["ag_issue_ns"].to_numpy()[1:] > rows["window_start_ns"].to_numpy()[:-1]).all()
    stats = analysis.unit_stats.set_index("unit")
    assert (stats.loc[["blocks.1", "blocks.2"], "forward_issue_depth"] == 1).all()


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_block_unit_gathers_computes_and_reduces(runs, framework: str) -> None:
    stats = runs[framework][1].unit_stats.set_index("unit")
    blocks = ["blocks.0", "blocks.1", "blocks.2"]
    for col in ("all_gather_ns", "forward_ns", "backward_ns", "reduce_scatter_ns"):
        assert (stats.loc[blocks, col] > 0).all(), col


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_unit_compute_framework_and_optimizer_reconcile_with_step_time(runs, framework: str) -> None:
    """The step's categories never overlap, and the units' compute, the framework's work and the
    optimizer step cover all but 5 % of it: the rest is the script's own code (the loss, data)."""
    _, analysis = runs[framework]
    times = analysis.step_times
    assert len(times) == 2 * 3  # two ranks, steps 2-4
    attributed = (times["unit_compute_ns"] + times["framework_ns"] + times["optimizer_ns"]) / times["step_ns"]
    assert (attributed <= 1.0).all()
    assert attributed.median() >= 0.95, times.to_string()
    if framework == "zero3":  # the root's own code (embeddings, head) is a unit's compute, not "other"
        stats = analysis.unit_stats.set_index("unit")
        assert stats.loc["(root)", "param_numel"] == 0 and stats.loc["(root)", "forward_ns"] > 0


@pytest.mark.slow
def test_fsdp2_prefetch_labels_name_the_unit_gathered_next(runs) -> None:
    folder, analysis = runs["fsdp2"]
    traces = load_traces([folder], cache=False)
    names = set(traces.events["name"].astype(str))
    assert {"FSDP::forward_prefetch for blocks.1", "FSDP::forward_prefetch for blocks.2"} <= names
    spans = analysis.spans
    gathers = spans[(spans["kind"] == "all_gather") & (spans["phase"] == "forward")]
    assert set(gathers["unit"]) == {"(root)", "blocks.0", "blocks.1", "blocks.2"}


@pytest.mark.slow
def test_export_of_a_recorded_run_matches_the_analysis(runs, tmp_path: Path) -> None:
    folder, analysis = runs["fsdp1"]
    out = tmp_path / "tables"
    done = subprocess.run([sys.executable, "-m", "fsdpviz", "export", str(folder), "-o", str(out), "--no-cache"],
                          check=False, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    units = pd.read_parquet(out / "units.parquet").set_index("unit")
    want = analysis.unit_stats.set_index("unit")
    assert list(units.index) == list(want.index)
    assert (units["forward_ns"] == want["forward_ns"]).all()
    assert (units["framework"] == "fsdp1").all()
    spans = pd.read_parquet(out / "spans.parquet")
    assert len(spans) == len(analysis.spans)
