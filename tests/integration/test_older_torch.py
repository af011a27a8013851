"""``fsdpviz record`` on the older torch releases fsdpviz supports, besides the suite's own torch.

FSDP2 keeps its state differently across releases (one ``_fsdp_param_group`` before torch 2.13, a
list of ``_fsdp_param_groups`` from it; the package moved from ``torch.distributed._composable.fsdp``
in 2.6), so the recorder is run for real on each: the example trainer, FSDP2 and FSDP1, two CPU ranks
with gloo, recorded by the fsdpviz installed in a virtual environment of that torch. The unit table
is checked against the model's own parameter counts (built here, by the suite's torch) and the
trace's per-unit analysis against the frameworks' own labels.

The environments are made by ``make test-torch`` (``make setup-old-torch``, see the Makefile: the
registry's CUDA builds, which train on the CPU), which then runs this file with
``FSDPVIZ_OLD_TORCH_VENVS`` naming them and ``FSDPVIZ_REQUIRE_OLD_TORCH=1``, which turns a missing
environment into a failure. In ``make test`` they skip, saying so; CI (``.ci/run``) runs both.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers.jobs import EXAMPLE, NO_OUTPUT, REPO, record_env, retried, run_job

VENVS = [REPO / v for v in os.environ.get("FSDPVIZ_OLD_TORCH_VENVS", "").split()]
REQUIRED = os.environ.get("FSDPVIZ_REQUIRE_OLD_TORCH") == "1"
LAYERS = 2
TRAIN = ("--layers", str(LAYERS), "--dim", "32", "--seed", "0", "--steps", "10", "--wrap", "block")
BLOCKS = [f"blocks.{i}" for i in range(LAYERS)]


def _venvs() -> list[Any]:
    if not VENVS:
        reason = "the torch-version matrix runs in `make test-torch` (FSDPVIZ_OLD_TORCH_VENVS names no environment)"
        return [pytest.param(None, marks=pytest.mark.skipif(not REQUIRED, reason=reason))]
    return [pytest.param(v, id=v.name) for v in VENVS]


def _record(venv: Path, run_dir: Path, framework: str) -> subprocess.CompletedProcess:
    python = str(venv / "bin" / "python")
    argv = [python, "-m", "fsdpviz", "record", "--out", str(run_dir), *NO_OUTPUT, "--steps", "3", "--",
            python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(EXAMPLE),
            "--framework", framework, *TRAIN]
    return retried(lambda: run_job(argv, env=record_env()), tidy=lambda: shutil.rmtree(run_dir, ignore_errors=True))


def _torch_version(venv: Path) -> str:
    version = venv.name.removeprefix(".venv-torch")
    return version


@pytest.mark.slow
@pytest.mark.parametrize("venv", _venvs())
@pytest.mark.parametrize("framework", ["fsdp2", "fsdp1"])
def test_older_torch_records_units_and_their_timelines(venv: Path | None, framework: str, tmp_path: Path) -> None:
    assert venv is not None, "FSDPVIZ_REQUIRE_OLD_TORCH=1 but FSDPVIZ_OLD_TORCH_VENVS names no environment"
    assert (venv / "bin" / "python").exists(), f"{venv}: no such environment (make setup-old-torch)"
    run_dir = tmp_path / "run"
    proc = _record(venv, run_dir, framework)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "ok" and run["framework"] == framework
    assert run["versions"]["torch"].split("+")[0] == _torch_version(venv)

    # the unit table, against the model's own parameters
    example = runpy.run_path(str(EXAMPLE))
    model = example["build_model"](example["parse_args"](["--framework", framework, *TRAIN]))
    units = {u["unit"]: u for u in run["units"]}
    assert sorted(units, key=lambda u: units[u]["order"]) == ["(root)", *BLOCKS]
    for name in BLOCKS:
        numel = sum(p.numel() for p in model.get_submodule(name).parameters())
        assert units[name]["param_numel"] == numel and units[name]["param_bytes"] == 4 * numel
        assert units[name]["shard_size"] == 2 and units[name]["reshard_after_forward"] is True
    root = sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in model.blocks.parameters())
    assert units["(root)"]["param_numel"] == root

    # per-unit timers on every step, and every unit gathered and reduced in the trace's analysis
    timed = {(r["unit"], r["phase"], r["kind"])
             for line in (run_dir / "timers" / "rank0.jsonl").read_text().splitlines()
             for r in [json.loads(line)] if r["step"] == 5}
    assert {(u, p, "total") for u in BLOCKS for p in ("forward", "backward")} <= timed
    from fsdpviz.analysis.pipeline import analyse

    summary = analyse([run_dir], cache=False).summary.to_json()
    assert [u["name"] for u in summary["units"]] == ["(root)", *BLOCKS]
    for unit in summary["units"]:
        assert unit["param_numel"] == units[unit["name"]]["param_numel"]
        assert unit["all_gather_ms"] > 0 and unit["reduce_scatter_ms"] > 0, unit
    # the timers cover the profiled steps (2-4, the default schedule) and 6-9 after them (5 follows the
    # trace's export): the headline leads with those unprofiled steps unless the profiled ones came out
    # faster (noise; the note says so)
    cost = summary["profiler"]
    assert cost is not None and cost["profiled_steps"] == [2, 3, 4] and cost["unprofiled_steps"] == [6, 7, 8, 9]
    assert summary["step_time_source"] == ("timers" if cost["headline"] else "trace")
