"""The true peaks of ``../shared/traces/gpu-fsdp/README.md``: per recording, the settings its
uninstrumented runs measured (``torch.cuda.max_memory_allocated``, exact to the byte) and their peak.
Read by tests/unit/test_whatif_memory_gpu.py and benchmarks/bench_whatif_memory_gpu.py."""

from __future__ import annotations

from typing import Final

from fsdpviz.whatif.settings import Settings

_S = Settings()
PEAK_TRUTH: Final[dict[str, list[tuple[Settings, int]]]] = {
    "h100-fsdp2-fake8-block": [
        (_S.with_(reshard_after_forward=False), 6_131_871_232),
        (_S.with_(world_size=2), 7_349_925_376),
        (_S.with_(world_size=16), 5_230_137_856),
        (_S.with_(world_size=1), 9_679_013_376),
    ],
    "h100-fsdp2-fake8-reshard-false": [(_S.with_(reshard_after_forward=True), 5_527_571_968)],
    "h100-fsdp1-fake8-block": [
        (_S.with_(world_size=16), 5_223_846_400),
        (_S.with_(world_size=1), 9_779_729_920),
    ],
}
