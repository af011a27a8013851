"""The bound's compute and FSDP's copy kernels against each analysed step's own GPU work, read from the trace
files alone: the figures docs/concepts.md ("What bounds the step") quotes.

For every shared GPU recording without communication (../shared/traces/gpu-fsdp/h100-*, gpu-h200/B, Bl,
Broot), the summary's ``bound.compute_ms + bound.fsdp_kernels_ms`` beside the mean over the analysed steps of
the union of the GPU events launched inside each step's ProfilerStep span (tests/helpers/rawfiles.own_gpu_ms,
which reads the JSON with plain Python), the time carried in from before the steps as traced and as
``bound.carried_ms`` holds it on the run's clock; then ``h100-fsdp1-ws1-block`` with other
choices of steps (adjacent or not). About 20 s.

    python benchmarks/bench_bound_own_work.py [--shared DIR]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.rawfiles import own_gpu_ms

from fsdpviz.analysis.pipeline import analyse

STEP_CHOICES = ((2, 4), (3, 4), (2, 3))  # besides the default, 2-4


def row(name: str, folder: Path, steps: tuple[int, ...] | None = None) -> str | None:
    """One table row, or None for a recording with communication (its copies are the collectives')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = analyse([folder], steps=steps, cache=False, progress=False)
    summary, overlap = result.summary, result.overlap
    bound = summary.bound
    if bound is None or bound.fsdp_kernels_ms is None or bound.comm_ms:
        return None
    trace = min((folder / "traces").glob("rank0.trace.json*"))
    own = own_gpu_ms(trace, summary.steps)
    ours = bound.compute_ms + bound.fsdp_kernels_ms
    chosen = ",".join(map(str, summary.steps))
    # as traced: the median over ranks of each rank's carried time per analysed step
    traced = float((overlap["carried_ns"] / overlap["n_steps"].clip(lower=1)).median()) / 1e6
    return (f"| {name} | {chosen} | {own:.3f} | {ours:.3f} | {ours - own:+.3f} | {traced:.3f} | "
            f"{bound.carried_ms or 0.0:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    args = parser.parse_args()
    folders = [*sorted((args.shared / "gpu-fsdp").glob("h100-*")),
               *(args.shared / "gpu-h200" / n for n in ("B", "Bl", "Broot"))]
    print("| recording | steps | the steps' own GPU work (ms) | bound: compute + FSDP's copy kernels (ms) | "
          "difference (ms) | carried (ms, traced) | carried in other idle (ms, the run's clock) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for folder in folders:
        if folder.is_dir() and (line := row(folder.name, folder)) is not None:
            print(line, flush=True)
    ws1 = args.shared / "gpu-fsdp" / "h100-fsdp1-ws1-block"
    for steps in STEP_CHOICES:
        if ws1.is_dir() and (line := row(ws1.name, ws1, steps)) is not None:
            print(line, flush=True)


if __name__ == "__main__":
    main()
