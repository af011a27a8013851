"""The floor under settings that can only add memory (whatif/bounds.py) is a guard, never the answer.

whatif raises a prediction that falls below the recorded peak up to that peak when every change of
the setting can only add memory (a deeper prefetch, coarser units, fewer ranks). Each time it fires,
the memory model missed something (a block it dropped or freed too early). Every setting whatif's
advisor tries (``--explore``'s grid), reshard after forward false and the smaller world sizes are
predicted here on each of the suite's recordings -- the committed ones (tests/recorded/), the bundled
samples and, where present, the H100 ones (../shared/traces/gpu-fsdp/) -- and the floor must not fire
on any step of any of them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.errors import FsdpvizError
from fsdpviz.replay.model import read_model
from fsdpviz.replay.settings import Settings
from fsdpviz.whatif import bounds
from fsdpviz.whatif.explore import grid
from fsdpviz.whatif.predict import predict

pytestmark = [pytest.mark.slow, pytest.mark.recorded]

REPO = Path(__file__).resolve().parents[2]
GPU = REPO.parent / "shared" / "traces" / "gpu-fsdp"
RECORDINGS = sorted([*(p for p in (REPO / "tests" / "recorded").glob("*/run") if p.is_dir()),
                     REPO / "tests" / "recorded" / "fsdp2-cpu-profile" / "traces",
                     *(p for p in (REPO / "sample_traces").iterdir() if p.is_dir()),
                     *(sorted(GPU.glob("h100-*")) if GPU.is_dir() else [])])


def _name(path: Path) -> str:
    return path.parent.name if path.name in ("run", "traces") else path.name


@pytest.mark.parametrize("source", RECORDINGS, ids=[_name(p) for p in RECORDINGS])
def test_the_floor_never_fires(source: Path, tmp_path: Path) -> None:
    folder = tmp_path / _name(source)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    try:
        model = read_model(analyse([folder], cache=False, progress=False))
    except FsdpvizError as exc:  # no units (DDP, a trace without FSDP labels): nothing whatif predicts
        pytest.skip(str(exc))
    rec = model.recording
    tries, _ = grid(model)
    smaller = [w for w in {1, rec.world_size // 2} if 0 < w < rec.world_size]
    armed = 0
    for settings in [*tries[1:], Settings().with_(reshard_after_forward=False),
                     *(Settings().with_(world_size=w) for w in smaller)]:
        try:
            prediction = predict(model, settings)
        except FsdpvizError:  # a setting this framework or mesh does not support
            continue
        if not any(s.memory is not None for s in rec.steps):
            continue
        armed += bool(bounds.only_adds(prediction.settings, rec))
        fired = [n for n in prediction.notes if n.startswith(bounds.FLOOR_NOTE)]
        assert not fired, (settings.describe(), fired)
    if any(s.memory is not None for s in rec.steps):
        assert armed > 0  # the guard was armed: some setting here can only add memory
