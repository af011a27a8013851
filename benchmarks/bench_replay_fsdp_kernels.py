"""FSDP's own GPU kernels the replay's program holds against the trace's, read from the trace files alone:
the figures docs/whatif.md ("Why the bound is not the replay's own split") quotes.

For every shared FSDP2 recording without a host backend's collectives (../shared/traces/gpu-fsdp/h100-fsdp2-*
but gloo2, the HF Trainer's, gpu-h200/B and Bl), per step over the analysed steps of rank 0: the GPU time of
the events launched inside FSDP2's unit labels (tests/helpers/rawfiles.fsdp2_unit_kernels_ms, plain Python
over the JSON), the FSDP kernel time the program holds (the gathers' copy-in, copy-out and the kernels in their
labels, the reductions' prep, the passes' own), and of it the copy-outs, beside the copy-out spans' own length
(first kernel to last, the stream's waits between them included). About 15 s.

    python benchmarks/bench_replay_fsdp_kernels.py [--shared DIR]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.rawfiles import fsdp2_unit_kernels_ms

from fsdpviz import vocabulary
from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay.recording import read_recording

RECORDINGS = (("gpu-fsdp", "h100-fsdp2-fake8-block"), ("gpu-fsdp", "h100-fsdp2-fake8-block-modelB"),
              ("gpu-fsdp", "h100-fsdp2-fake8-reshard-false"), ("gpu-fsdp", "h100-fsdp2-ws1-block"),
              ("gpu-fsdp", "h100-hf-trainer-ws1"), ("gpu-h200", "B"), ("gpu-h200", "Bl"))


def row(folder: Path) -> str:
    """One table row: per step, ms."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = analyse([folder], cache=False, progress=False)
    steps = list(result.summary.steps)
    recording = read_recording(result, ranks=[0])
    n = len(recording.steps)
    held = copy_out = 0.0
    for s in recording.steps:
        held += sum(g.copy_in_ns + g.copy_out_ns + g.kernels_ns for g in s.gathers)
        held += sum(r.prep_ns for r in s.reduces)
        held += sum(p.fsdp_pre_ns + p.fsdp_pre_side_ns + p.fsdp_post_ns + p.fsdp_post_side_ns
                    for mb in s.micro for p in (*mb.forward, *mb.backward))
        copy_out += sum(g.copy_out_ns for g in s.gathers)
    spans = result.analysis.spans
    out_spans = spans[(spans["rank"] == 0).to_numpy() & (spans["kind"] == vocabulary.COPY_OUT).to_numpy()
                      & spans["step"].isin(steps).to_numpy()]
    span_ms = float((out_spans["end_ns"] - out_spans["start_ns"]).sum()) / 1e6 / len(steps)
    truth = fsdp2_unit_kernels_ms(min((folder / "traces").glob("rank0.trace.json*")), steps)
    held_ms = held / n / 1e6
    return (f"| {folder.name} | {truth:.3f} | {held_ms:.3f} | {100 * (held_ms - truth) / truth:+.1f} % | "
            f"{copy_out / n / 1e6:.3f} | {span_ms:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    args = parser.parse_args()
    print("| recording | the trace's FSDP2 unit kernels (ms) | the program holds (ms) | difference | "
          "of it, copy-out kernels (ms) | copy-out spans (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for where, name in RECORDINGS:
        folder = args.shared / where / name
        if folder.is_dir():
            print(row(folder), flush=True)


if __name__ == "__main__":
    main()
