"""ZeRO-3's fp32 partitioned copy of the parameters against DeepSpeed's own tensors.

record_scripts/zero3_memory_train.py (DeepSpeed ZeRO-3, CPU/gloo, 2 ranks, AdamW) writes, after each
step, the bytes of DeepSpeed's ``fp32_partitioned_groups_flat`` (the master copy its optimizer steps
on), of the wrapped optimizer's ``state`` and of the parameters' ``ds_tensor`` partitions. The master
copy is optimizer state (ZeRO's K = 12 for Adam counts it): the category at the peak must be both,
and the ZeRO arithmetic's sharded state (s + s + K) Psi / N must hold it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.jobs import NO_OUTPUT
from recording import SCRIPTS, STEP_REPLAY_PCT, ZERO3_ENV, Config, Recordings, step_replay_misses

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.formatting import format_bytes
from fsdpviz.report.data import prepare_report
from fsdpviz.report.units.section import model_note
from fsdpviz.runfolder import RUN_JSON, decode_run_json

pytestmark = [pytest.mark.slow, pytest.mark.recorded]

ZERO3 = Config(("--steps", "7"), (*NO_OUTPUT, "--warmup", "2", "--steps", "3"), ZERO3_ENV,
               script=SCRIPTS / "zero3_memory_train.py", output_flag="--truth", committed="zero3-master-copy")
RANKS = (0, 1)


def test_master_copy_is_optimizer_state(recordings: Recordings) -> None:
    rec = recordings.get(ZERO3)
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    truth = {r: json.loads(Path(str(rec.losses).format(rank=r)).read_text()) for r in RANKS}
    info = decode_run_json((rec.run_dir / RUN_JSON).read_bytes())
    for rank in RANKS:  # the recorder measured DeepSpeed's own master copy, and its gradient partitions
        start = info.rank_info(rank).memory.trace_start
        assert start.master_param_bytes == truth[rank]["steps"][start.step]["master_bytes"] > 0
        assert start.gradient_bytes_kept == truth[rank]["steps"][start.step]["grad_partition_bytes"] > 0
    result = analyse([rec.run_dir], cache=False)
    memory = result.summary.to_json()["memory"]
    at = memory["categories_at"]
    step = truth[at["rank"]]["steps"][at["step"]]
    assert memory["categories"]["optimizer_state"] == step["master_bytes"] + step["state_bytes"]
    assert memory["categories"]["sharded_params"] == step["partition_bytes"]
    # the gradient partitions, made before the trace and kept all along: in the peak, not unknown
    assert memory["categories"]["gradients"] == step["grad_partition_bytes"]
    assert "gradients" not in at["unknown"]
    # (s + s + K) Psi / N with K counting the master copy: ZeRO-3 keeps fp32 partitions of the
    # parameters and of their gradients (one partition's bytes each) beside the optimizer's state
    model = memory["model"]
    sharded_truth = 2 * step["partition_bytes"] + step["master_bytes"] + step["state_bytes"]
    assert abs(model["sharded_state_bytes"] - sharded_truth) <= 8  # AdamW's step counter: one 4-byte scalar
    assert model["optimizer_bytes_per_param"] == 12 and model["master_bytes_per_param"] == 4
    assert model["param_count"] == truth[0]["param_numel"]
    # the page's sentence says the same arithmetic (its sharded state, written as bytes)
    note = model_note(prepare_report(result))
    assert note is not None
    assert f"arithmetic gives {format_bytes(float(model['sharded_state_bytes']))} for all three" in note
    assert "4 B of parameter + 4 B of gradient + 12 B of optimizer state (4 B of it DeepSpeed's fp32 master copy" in note
    # what the peak held of the sharded state: the three parts, and their sum only where all are known
    cats = memory["categories"]
    parts = {"parameters": cats["sharded_params"], "gradients": cats["gradients"], "optimizer": cats["optimizer_state"]}
    for name, value in parts.items():
        assert f"{name} {format_bytes(float(value)) if value is not None else 'unknown'}" in note, (name, note)
    known = [v for v in parts.values() if v is not None]
    held = "their sum unknown" if len(known) < 3 else f"held {format_bytes(float(sum(known)))} (parameters"
    assert held in note and "held unknown" not in note, note


def test_every_step_replays_as_traced(recordings: Recordings) -> None:
    """The recorded setting's replay against each step's own ProfilerStep span. This script's first block
    opens its backward window inside the root's and closes it after: the root's part after its other
    blocks holds that block's compute, which the block's own pass counts. Read as the root's host time
    too, every step replayed 0.9-1.6 % long."""
    rec = recordings.get(ZERO3)
    assert rec.proc.returncode == 0, rec.proc.stderr[-3000:]
    misses = step_replay_misses(analyse([rec.run_dir], cache=False, progress=False))
    assert len(misses) == 3 * len(RANKS) and max(misses) <= STEP_REPLAY_PCT, misses
