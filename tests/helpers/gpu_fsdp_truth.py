"""The true peaks of ``../shared/traces/gpu-fsdp/README.md``: per recording, the settings its
uninstrumented runs measured (``torch.cuda.max_memory_allocated``, exact to the byte) and their peak.
Read by tests/unit/test_whatif_memory_gpu.py, tests/unit/test_memory_categories.py and
benchmarks/bench_whatif_memory_gpu.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Final

import numpy as np

from fsdpviz.replay.settings import Settings, Wrap

_S = Settings()
ROOT_PEAK: Final = 6_679_714_304  # one unit for the whole model
PAIR_PEAK: Final = 5_729_005_056  # two blocks per unit
PEAK_TRUTH: Final[dict[str, list[tuple[Settings, int]]]] = {
    "h100-fsdp2-fake8-block": [
        (_S.with_(reshard_after_forward=False), 6_131_871_232),
        (_S.with_(world_size=2), 7_349_925_376),
        (_S.with_(world_size=16), 5_230_137_856),
        (_S.with_(world_size=1), 9_679_013_376),
        (_S.with_(wrap=Wrap("root")), ROOT_PEAK),
        (_S.with_(wrap=Wrap("merge", k=2)), PAIR_PEAK),
    ],
    "h100-fsdp2-fake8-reshard-false": [
        (_S.with_(reshard_after_forward=True), 5_527_571_968),
        (_S.with_(wrap=Wrap("root")), ROOT_PEAK),  # the root never reshards: the same run
        (_S.with_(wrap=Wrap("merge", k=2), reshard_after_forward=True), PAIR_PEAK),
    ],
    "h100-fsdp1-fake8-block": [
        (_S.with_(world_size=16), 5_223_846_400),
        (_S.with_(world_size=1), 9_779_729_920),
    ],
}


# Step times (ms) of the same uninstrumented runs (median of steps 3-9; ±10 % from run to run): per
# recording, its own setting's and, per setting, the step it gave. whatif's targets are on the ratio
# to the recording's own setting (within 0.10).
STEP_TRUTH: Final[dict[str, tuple[float, list[tuple[Settings, float]]]]] = {
    "h100-fsdp2-fake8-block": (53.2, [
        (_S.with_(wrap=Wrap("root")), 43.1),
        (_S.with_(wrap=Wrap("merge", k=2)), 49.2),
        (_S.with_(reshard_after_forward=False), 50.9),
    ]),
    "h100-fsdp2-fake8-reshard-false": (50.9, [
        (_S.with_(wrap=Wrap("root")), 43.1),
        (_S.with_(wrap=Wrap("merge", k=2), reshard_after_forward=True), 49.2),
        (_S.with_(reshard_after_forward=True), 53.2),
    ]),
}

# Model B's (separate runs, not interleaved: the README reads its time ratios for the large effects
# only). whatif misses its root and reshard-false ratios by more than 0.10 (docs/whatif.md, "One
# clock"), so no test holds them; benchmarks/bench_replay_gpu.py prints them.
MODEL_B_STEP_TRUTH: Final[dict[str, tuple[float, list[tuple[Settings, float]]]]] = {
    "h100-fsdp2-fake8-block-modelB": (83.4, [
        (_S.with_(wrap=Wrap("root")), 45.1),
        (_S.with_(wrap=Wrap("merge", k=2)), 64.4),
        (_S.with_(reshard_after_forward=False), 56.0),
    ]),
}


# The same runs' peaks at the fake world sizes the README measured, the recording's own (8) among them:
# per recording, world size -> peak allocated bytes of the uninstrumented run with that world.
WORLD_SIZE_PEAKS: Final[dict[str, dict[int, int]]] = {
    "h100-fsdp2-fake8-block": {2: 7_349_925_376, 8: 5_527_571_968, 16: 5_230_137_856},
    "h100-fsdp2-fake8-block-modelB": {4: 7_370_085_888, 8: 7_142_826_496, 16: 7_015_107_072, 32: 6_958_053_888},
}


def allocator_split(peaks: dict[int, int]) -> tuple[float, float]:
    """``(a, b)`` of the least-squares fit ``peak(N) = a + b / N`` to the allocator's peaks at world
    sizes N: ``b / N`` is what each rank holds in proportion to 1/N (FSDP's shards and what the
    optimizer keeps of them), ``a`` what no world size changes. Fitted on the allocator alone, never
    on fsdpviz: the README's peaks lie within 7 MiB of the curve."""
    n = np.array(list(peaks), dtype=float)
    design = np.column_stack([np.ones_like(n), 1.0 / n])
    (a, b), *_ = np.linalg.lstsq(design, np.array(list(peaks.values()), dtype=float), rcond=None)
    return float(a), float(b)


def with_impossible_timers(run: Path, out: Path, factor: float = 0.6, after_trace: int = 5) -> Path:
    """A copy of recording ``run`` whose timers say every unprofiled step (from ``after_trace`` on: the
    shared recordings trace steps 2-4) took ``factor`` of what they measured: a step shorter than the kernels its own trace shows the GPU running (model A's 39 ms
    of them against 51.3 x 0.6 = 30.8 ms), which no replay of that trace can reproduce -- a miss known
    by construction."""
    shutil.copytree(run, out, ignore=shutil.ignore_patterns(".fsdpviz-cache"))
    out.chmod(0o755)
    for path in (out / "timers").iterdir():
        path.chmod(0o644)
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for row in rows:
            if row.get("kind") == "total" and row.get("ms") is not None and row["step"] >= after_trace:
                row["ms"] *= factor
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for sub in out.rglob("*"):
        sub.chmod(0o755 if sub.is_dir() else 0o644)
    return out
