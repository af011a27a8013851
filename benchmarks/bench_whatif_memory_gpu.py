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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.gpu_fsdp_truth import PEAK_TRUTH

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay.model import read_model
from fsdpviz.whatif.predict import predict

MIB = 1 << 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces" / "gpu-fsdp")
    args = parser.parse_args()
    print("| recording | setting | predicted peak (MiB) | true peak (MiB) | error | predicted change (MiB) "
          "| true change (MiB) | error |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, cases in PEAK_TRUTH.items():
        model = read_model(analyse([args.traces / name], cache=False))
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
