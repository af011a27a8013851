"""Memory by category against what the training script measures on its own tensors.

record_scripts/memory_train.py (FSDP2, CPU/gloo, 2 ranks) writes, per rank and step, the bytes of
every tensor in its optimizers' ``state`` and of its parameters' and gradients' local shards
(``DTensor.to_local()``). The variations are recorded once per session, two or three to a recording
(recording.MEMORY_RUNS): optimizers of one, three and a made-up number of states, two optimizers,
and the three ways of zeroing gradients. fsdpviz must report those bytes exactly: in run.json (the recorder's own
measurement), in ``summary --json`` at the peak, and in the categories at each optimizer step.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from recording import MEMORY_RUNS, Recording, Recordings

from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.runfolder import RUN_JSON, TRACES_DIR, decode_run_json

pytestmark = [pytest.mark.slow, pytest.mark.recorded]

RANKS = (0, 1)


def truth(rec: Recording, rank: int) -> list[dict[str, int]]:
    """What the script measured on rank ``rank``, per step (after its optimizer steps)."""
    steps: list[dict[str, int]] = json.loads(Path(str(rec.losses).format(rank=rank)).read_text())["steps"]
    return steps


def summary_json(result: RunResult) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(result.summary.to_json()))
    return out


@pytest.fixture(params=list(MEMORY_RUNS), ids=list(MEMORY_RUNS))
def run(request: pytest.FixtureRequest, recordings: Recordings) -> tuple[str, Recording, RunResult]:
    name = str(request.param)
    rec = recordings.get(MEMORY_RUNS[name])
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    return name, rec, analyse([rec.run_dir], cache=False)


def _levels_before_optimizer(result: RunResult, rank: int) -> dict[int, dict[str, int]]:
    """Per training iteration (the script's step index), the categories on ``rank`` just before its
    first optimizer step begins (every gradient reduced, nothing stepped yet). With two optimizers
    the recorder's step ends at the first one's step: an iteration's optimizer steps are those after
    its backward."""
    spans, windows = result.analysis.spans, result.analysis.windows
    starts = np.sort(spans.loc[((spans["rank"] == rank) & (spans["phase"] == "optimizer")).to_numpy(),
                               "start_ns"].to_numpy(np.int64))
    backward_ends = np.sort(windows.loc[((windows["rank"] == rank) & (windows["phase"] == "backward")).to_numpy(),
                                        "end_ns"].to_numpy(np.int64))
    firsts = [s for prev, s in zip([np.iinfo(np.int64).min, *starts[:-1]], starts, strict=True)
              if ((backward_ends > prev) & (backward_ends < s)).any()]
    levels = result.analysis.memory_categories
    mine = levels[(levels["rank"] == rank).to_numpy()]
    t = mine["t_ns"].to_numpy(np.int64)
    first_step = min(result.analysis.steps)  # iteration i's first optimizer step ends ProfilerStep i
    out = {}
    for k, start in enumerate(firsts):
        i = int(np.searchsorted(t, int(start), side="left")) - 1
        assert i >= 0
        out[first_step + k] = {c: int(mine[c].iat[i]) for c in mcat.CATEGORIES}
    assert len(out) >= 3
    return out


def test_recorder_measures_what_the_script_holds(run: tuple[str, Recording, RunResult]) -> None:
    """run.json: the shards, the optimizers' state (any class, any number of states, two
    optimizers) and the gradients kept from step to step, as the script measured them."""
    name, rec, _ = run
    info = decode_run_json((rec.run_dir / RUN_JSON).read_bytes())
    for rank in RANKS:
        memory = info.rank_info(rank).memory  # type: ignore[union-attr]
        assert memory is not None and memory.trace_start is not None
        start, steps = memory.trace_start, truth(rec, rank)
        first = int(start.step or 0)
        # the trace begins after step first-1's optimizer step (before any step: nothing made yet)
        before = steps[first - 1] if first > 0 else {"optimizer_state_bytes": 0, "grad_bytes": 0}
        assert start.device == "cpu"
        assert start.sharded_param_bytes == steps[0]["sharded_param_bytes"] > 0
        assert start.optimizer_state_bytes == before["optimizer_state_bytes"]
        assert start.gradient_bytes_kept == (steps[first]["grad_bytes"] if "keep-grads" in name else 0)
        assert sum(o.state_bytes for o in memory.optimizers) == steps[-1]["optimizer_state_bytes"] > 0
        classes = sorted(o.optimizer.rsplit(".", 1)[-1] for o in memory.optimizers)
        assert classes == {"sgd-momentum+keep-grads": ["SGD"], "adam-amsgrad+model-zero-grad+2-micro": ["Adam"],
                           "own+sgd": ["Keeper", "SGD"]}[name]


def test_peak_categories_are_the_scripts_bytes(run: tuple[str, Recording, RunResult]) -> None:
    """``summary --json``: at the peak the sharded parameters and the optimizer state are the
    script's own bytes of that rank, nothing is unknown, and the level says what it counts."""
    name, rec, result = run
    memory = summary_json(result)["memory"]
    at = memory["categories_at"]
    steps = truth(rec, at["rank"])
    cats = memory["categories"]
    assert None not in cats.values() and at["unknown"] == {}
    assert cats["sharded_params"] == steps[0]["sharded_param_bytes"]
    # every optimizer here makes its whole state at its first step
    assert len({s["optimizer_state_bytes"] for s in steps}) == 1
    made = at["step"] > 0 or at["phase"] == "optimizer" or name != "own+sgd"
    assert cats["optimizer_state"] == (steps[0]["optimizer_state_bytes"] if made else 0)
    assert memory["level"] == "since_trace_start_plus_measured"
    kept = steps[0]["grad_bytes"] if "keep-grads" in name else 0
    first = 0 if name == "own+sgd" else steps[0]["optimizer_state_bytes"]
    assert memory["baseline_bytes"] == steps[0]["sharded_param_bytes"] + first + kept


def test_memory_model_reads_the_optimizer_state_the_script_holds(run: tuple[str, Recording, RunResult]) -> None:
    """The memory model's optimizer bytes per sharded element (its K) are the script's own state over
    its shards' elements, measured, never the assumed Adam: also where the trace began before any
    optimizer step (own+sgd: the state is made inside the trace, and the recorder measures it after
    the optimizers' last step)."""
    _, rec, result = run
    model = summary_json(result)["memory"]["model"]
    steps = truth(rec, 0)
    elements = steps[0]["sharded_param_bytes"] / model["sharded_bytes_per_param"]
    assert model["optimizer_bytes_measured"] is True
    assert model["optimizer_bytes_per_param"] == round(steps[-1]["optimizer_state_bytes"] / elements)


def test_gradients_are_gradients_whatever_the_zero_grad(run: tuple[str, Recording, RunResult]) -> None:
    """Just before each optimizer step every sharded gradient the script holds is a gradient --
    made by the reductions (``optimizer.zero_grad()``, ``model.zero_grad()``) or kept from step to
    step (``set_to_none=False``); the optimizer state is the script's (of the step before)."""
    _, rec, result = run
    for rank in RANKS:
        steps = truth(rec, rank)
        for step, cats in _levels_before_optimizer(result, rank).items():
            assert cats["gradients"] == steps[step]["grad_bytes"], (rank, step)
            assert cats["sharded_params"] == steps[step]["sharded_param_bytes"]
            state = steps[step - 1]["optimizer_state_bytes"] if step > 0 else 0
            assert cats["optimizer_state"] == state, (rank, step)


def test_plain_traces_keep_what_the_optimizer_step_made(recordings: Recordings, tmp_path: Path) -> None:
    """The traces alone (no run.json, no measurement), profiled from the first step: the optimizer
    state is what the optimizer steps made and kept -- this script's own class and SGD's momentum
    alike -- and what the CPU profiler cannot see is unknown, not 0."""
    rec = recordings.get(MEMORY_RUNS["own+sgd"])
    shutil.copytree(rec.run_dir / TRACES_DIR, tmp_path / "traces")
    result = analyse([tmp_path / "traces"], cache=False)
    memory = summary_json(result)["memory"]
    assert memory["level"] == "since_trace_start"
    at = memory["categories_at"]
    assert memory["categories"]["sharded_params"] is None and "sharded_params" in at["unknown"]
    peaks = result.analysis.category_peaks
    after_first = peaks[((peaks["unit"] == "") & (peaks["step"] > 0)).to_numpy()]
    assert len(after_first)
    for row in after_first.to_dict(orient="records"):
        assert row["optimizer_state"] == truth(rec, int(row["rank"]))[int(row["step"])]["optimizer_state_bytes"]


def test_accumulated_gradients_per_micro_batch(recordings: Recordings) -> None:
    """Two micro-batches per optimizer step: after the first one's backward the sharded gradients
    are what its reductions made, and after the second they are the same tensors, added to (FSDP2
    adds each reduce-scatter's output to them and frees it): the script's bytes after each
    micro-batch, never twice them."""
    rec = recordings.get(MEMORY_RUNS["adam-amsgrad+model-zero-grad+2-micro"])
    result = analyse([rec.run_dir], cache=False)
    windows, levels = result.analysis.windows, result.analysis.memory_categories
    assert sorted(set(windows["micro"])) == [0, 1]
    for rank in RANKS:
        steps = truth(rec, rank)
        mine = levels[(levels["rank"] == rank).to_numpy()]
        t = mine["t_ns"].to_numpy(np.int64)
        seen = 0
        for step in result.analysis.steps:
            w = windows[((windows["rank"] == rank) & (windows["step"] == step)).to_numpy()]
            second = w[(w["micro"] == 1).to_numpy()]
            if not len(second) or not (w["micro"] == 0).any():
                continue
            # just before the second micro-batch's first window opens: the first one's backward is done
            i = int(np.searchsorted(t, int(second["start_ns"].min()), side="left")) - 1
            micro = steps[step]["micro_grad_bytes"]
            assert len(micro) == 2 and micro[0] == micro[1] == steps[step]["grad_bytes"] > 0
            assert int(mine["gradients"].iat[i]) == micro[0], (rank, step)
            seen += 1
        assert seen >= 2
        for step, cats in _levels_before_optimizer(result, rank).items():
            assert cats["gradients"] == steps[step]["micro_grad_bytes"][1], (rank, step)
