"""``whatif --world-size`` on CPU, against a real run at the other world size.

record_scripts/memory_train.py (FSDP2, AdamW, CPU/gloo) is recorded with ``fsdpviz record`` at 2 and
at 4 ranks; each run writes what its own tensors hold (``DTensor.to_local()`` bytes of the parameters
and of every tensor in ``optimizer.state``). The prediction of one world size from the other must hold
the other run's sharded parameters and optimizer state at its peak.

The peak itself is not compared: on CPU the recorded level also holds gloo's buffers whose free the
profiler never saw, and how many pile up differs from run to run (docs/whatif.md).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers.committed import recorded_once
from helpers.jobs import record_env, torchrun
from helpers.once import session_root
from recording import SCRIPTS, record

from fsdpviz.analysis import memory_categories as mcat
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay.model import read_model
from fsdpviz.replay.settings import Settings
from fsdpviz.whatif.predict import predict

pytestmark = [pytest.mark.slow, pytest.mark.recorded]  # analysis only: committed copies in `make test`

WORLDS = (2, 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, list[dict[str, int]]]]:
    """Per world size: the run folder and rank 0's truth per step."""
    out = {}
    for world in WORLDS:
        base = session_root(tmp_path_factory) / f"whatif-world-{world}"
        truth = base / "truth-{rank}.json"
        options = ["--warmup", "2", "--steps", "3"]  # what make() records with

        def make(base: Path = base, truth: Path = truth, world: int = world
                 ) -> dict[str, subprocess.CompletedProcess | None]:
            command = torchrun(SCRIPTS / "memory_train.py", "--optimizer", "adamw", "--truth", str(truth), nproc=world)
            return {"proc": record(base / "run", command, "--warmup", "2", "--steps", "3", env=record_env())}

        proc = recorded_once(base, f"whatif-world-{world}", {"world": world, "optimizer": "adamw",
                                                               "record": options},
                             [SCRIPTS / "memory_train.py"], make)["proc"]
        assert proc is not None and proc.returncode == 0, proc.stderr[-3000:] if proc else ""
        out[world] = (base / "run", json.loads(Path(str(truth).format(rank=0)).read_text())["steps"])
    return out


@pytest.mark.parametrize(("recorded", "other"), [(2, 4), (4, 2)])
def test_the_other_world_size_holds_the_other_runs_shards(runs: dict[int, tuple[Path, list[dict[str, int]]]],
                                                           recorded: int, other: int) -> None:
    run, _ = runs[recorded]
    _, truth = runs[other]
    prediction = predict(read_model(analyse([run], cache=False, progress=False)), Settings().with_(world_size=other))
    categories = prediction.predicted.memory_categories
    assert categories is not None and prediction.predicted.peak_allocated_bytes is not None
    assert categories[mcat.SHARDED_PARAMS] == truth[-1]["sharded_param_bytes"]
    # AdamW's step counters are one 0-dim fp32 tensor per parameter, whatever the world size: the
    # model scales the whole state, so it misses by half or twice those few bytes
    state = categories[mcat.OPTIMIZER_STATE]
    assert state is not None and abs(state - truth[-1]["optimizer_state_bytes"]) <= 0.01 * truth[-1]["optimizer_state_bytes"]
    assert not prediction.assumed or all("optimizer state" not in a for a in prediction.assumed)  # measured, not assumed
