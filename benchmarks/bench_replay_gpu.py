"""whatif's GPU replay on the shared H100 recordings (../shared/traces/gpu-fsdp/): how far the replay
without the profiler misses each recording's timers, and the step ratios it predicts against the
README's uninstrumented runs (model A interleaved, model B separate runs; the 1-rank model A recording
against model A's fake-group ratios, the nearest bare truth it has).

    python benchmarks/bench_replay_gpu.py

Prints one table of clocks and one of ratios (predicted step over the recording's own, against the bare
runs' same ratio), with the mean absolute ratio error. Results are recorded in docs/whatif.md ("One clock").
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.gpu_fsdp_truth import MODEL_B_STEP_TRUTH, STEP_TRUTH

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay.model import read_model
from fsdpviz.whatif.gains import completed_summary
from fsdpviz.whatif.predict import predict

RECORDINGS = ROOT.parent / "shared" / "traces" / "gpu-fsdp"


def main() -> None:
    if not RECORDINGS.is_dir():
        sys.exit(f"error: {RECORDINGS}: the shared H100 recordings are not beside this checkout")
    warnings.filterwarnings("ignore")
    started = time.perf_counter()
    # the 1-rank recording of model A has no bare run of its own settings: held, as
    # tests/unit/test_whatif_honesty.py holds it, to the same model's bare wrap ratios on the fake group of 8,
    # whose collectives take no time (the rows say "(fake-8 bare)")
    block, cases = STEP_TRUTH["h100-fsdp2-fake8-block"]
    one_rank = (block, [(s, ms) for s, ms in cases if s.wrap.kind != "recorded"])
    truth = {**STEP_TRUTH, **MODEL_B_STEP_TRUTH, "h100-fsdp2-ws1-block": one_rank}
    clocks, ratios, errors = [], [], []
    for folder in sorted(p for p in RECORDINGS.iterdir() if p.is_dir()):
        result = analyse([folder], progress=False, cache=False)
        model = read_model(result)
        clock = completed_summary(result).clock
        clocks.append(f"| {folder.name} | {clock.basis} | {clock.replay_error_pct} | {clock.clean_steps} |")
        bare, cases = truth.get(folder.name, (0.0, []))
        for settings, true_ms in cases:
            prediction = predict(model, settings)
            ratio = prediction.predicted.step_time_ms / prediction.baseline.step_time_ms
            errors.append(abs(ratio - true_ms / bare))
            proxy = " (fake-8 bare)" if folder.name == "h100-fsdp2-ws1-block" else ""
            ratios.append(f"| {folder.name} | {settings.describe()} | {ratio:.3f} | {true_ms / bare:.3f}{proxy} | "
                          f"{ratio - true_ms / bare:+.3f} |")
    print("| recording | clock | replay miss (%) | clean steps |\n|---|---|---:|---:|")
    print("\n".join(clocks))
    print("\n| recording | setting | predicted ratio | bare ratio | error |\n|---|---|---:|---:|---:|")
    print("\n".join(ratios))
    print(f"\nmean absolute ratio error {sum(errors) / len(errors):.3f} over {len(errors)} settings "
          f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
