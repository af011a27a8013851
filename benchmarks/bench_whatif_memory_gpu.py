"""Accuracy of ``fsdpviz whatif`` peak memory against the real allocator on an H100.

The recordings of ``../shared/traces/gpu-fsdp`` (an H100, torch 2.11, model A: d 2048, 8 blocks,
bf16 compute through a mixed-precision policy, fp32 shards, AdamW; torch's fake process group,
which shards for real and measures memory exactly at world size N) are predicted under the settings
whose true peak the folder's README gives (``torch.cuda.max_memory_allocated`` of uninstrumented
runs, exact to the byte). Prints one markdown table: predicted and true peak and change, and each
error; the targets are 5 % on the peak and 35 % on the change.

    python benchmarks/bench_whatif_memory_gpu.py [--traces ../shared/traces/gpu-fsdp]

Results are recorded in docs/whatif.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.whatif.predict import predict, read_model
from fsdpviz.whatif.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
S = Settings()
# recording -> [(setting, true peak from the README)]
TRUTH = {
    "h100-fsdp2-fake8-block": [
        (S.with_(reshard_after_forward=False), 6_131_871_232),
        (S.with_(world_size=2), 7_349_925_376),
        (S.with_(world_size=16), 5_230_137_856),
        (S.with_(world_size=1), 9_679_013_376),
    ],
    "h100-fsdp2-fake8-reshard-false": [(S.with_(reshard_after_forward=True), 5_527_571_968)],
    "h100-fsdp1-fake8-block": [
        (S.with_(world_size=16), 5_223_846_400),
        (S.with_(world_size=1), 9_779_729_920),
    ],
}
MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces" / "gpu-fsdp")
    args = parser.parse_args()
    print("| recording | setting | predicted peak (MiB) | true peak (MiB) | error | predicted change (MiB) "
          "| true change (MiB) | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, cases in TRUTH.items():
        model = read_model(analyse([args.traces / name]))
        for setting, true_peak in cases:
            p = predict(model, setting)
            base, peak = p.baseline.peak_allocated_bytes, p.predicted.peak_allocated_bytes
            assert base is not None and peak is not None
            change, true_change = peak - base, true_peak - base
            print(f"| {name} | {p.settings.describe()} | {peak / MIB:,.1f} | {true_peak / MIB:,.1f} "
                  f"| {100 * (peak - true_peak) / true_peak:+.2f} % | {change / MIB:+,.1f} | {true_change / MIB:+,.1f} "
                  f"| {100 * (change - true_change) / abs(true_change):+.1f} % |")


if __name__ == "__main__":
    main()
