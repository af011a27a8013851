"""Accuracy of ``fsdpviz whatif`` on GPU-shaped runs: one model generated under every setting.

The synthetic FSDP2 GPU generator (``tests/synth``) produces the same model (8 blocks of 20M
parameters + a 30M-parameter root, bf16, 8 ranks, ring collectives at 50 bytes/ns, NCCL-like
streams) under each setting: implicit / explicit N / no prefetch, merged wraps, one root unit, no
reshard after forward, other world sizes. Every setting is predicted from the implicit-prefetch,
per-block, resharding run and compared with what the generator produced: mean step time and the
highest allocated level. Prints one markdown table (the error of every setting), and how long
reading the recording into the model takes (``read_model`` of the analysed base run, best of 3).

    python benchmarks/bench_whatif_gpu.py [--blocks 8] [--world 8]

Results are recorded in docs/whatif.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from synth import Scenario, generate_run, make_root, make_units, merge_into_root, merge_units

from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.replay.model import Model, read_model
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.whatif.predict import predict


def _model(scenario: Scenario, folder: Path) -> Model:
    run = generate_run(scenario, folder, run_folder=True)
    return read_model(analyse([run.folder], cache=False))


def _read_seconds(result: RunResult, repeat: int = 3) -> float:
    """Best time of ``read_model`` on an analysed run (the analysis itself not counted)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        read_model(result)
        best = min(best, time.perf_counter() - started)
    return best


def _truth(model: Model) -> tuple[float, int]:
    steps = model.recording.steps
    return sum(s.step_ns for s in steps) / len(steps) / 1e6, max(s.peak_bytes for s in steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--world", type=int, default=8)
    args = parser.parse_args()
    units = make_units(args.blocks, numel=20_000_000, fwd_ns=900_000, bwd_ns=1_800_000)
    root = make_root(numel=30_000_000, fwd_ns=300_000, bwd_ns=600_000)
    base = Scenario(units=units, root=root, world_size=args.world, ring_comm=True, comm_bytes_per_ns=50.0,
                    steps=(3, 4), shared_timeline=True)
    s = Settings()
    cases = {
        "prefetch 1": (s.with_(prefetch="1"), dataclasses.replace(base, forward_prefetch=1, backward_prefetch=1)),
        "prefetch 2": (s.with_(prefetch="2"), dataclasses.replace(base, forward_prefetch=2, backward_prefetch=2)),
        "prefetch none": (s.with_(prefetch="none"),
                          dataclasses.replace(base, forward_prefetch=0, backward_prefetch=0, no_overlap=True)),
        "wrap merge:2": (s.with_(wrap=Wrap("merge", k=2)), dataclasses.replace(base, units=merge_units(units, 2))),
        "wrap merge:4": (s.with_(wrap=Wrap("merge", k=4)), dataclasses.replace(base, units=merge_units(units, 4))),
        "wrap root": (s.with_(wrap=Wrap("root")), dataclasses.replace(base, units=[],
                                                                      root=merge_into_root(root, units))),
        "reshard after forward false": (s.with_(reshard_after_forward=False), dataclasses.replace(
            base, units=[dataclasses.replace(u, reshard_after_forward=False) for u in units])),
        f"world size {args.world // 2}": (s.with_(world_size=args.world // 2),
                                          dataclasses.replace(base, world_size=args.world // 2)),
        f"world size {args.world * 2}": (s.with_(world_size=args.world * 2),
                                         dataclasses.replace(base, world_size=args.world * 2)),
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model = _model(base, Path(tmp) / "base")
        replay = predict(model, Settings())
        step, peak = _truth(model)
        print(f"model: {args.blocks} blocks x 20M + root 30M parameters, {args.world} ranks; recorded step "
              f"{step:.3f} ms, peak {peak / 2**20:.1f} MiB; replay error {replay.traced_replay_error_pct:.2f} %")
        print(f"reading the recording into the model (read_model, best of 3): "
              f"{1000 * _read_seconds(model.result):.0f} ms\n")
        print("| setting | predicted step (ms) | generated step (ms) | error | predicted peak (MiB) "
              "| generated peak (MiB) | error |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for i, (name, (settings, scenario)) in enumerate(cases.items()):
            p = predict(model, settings).predicted
            t_step, t_peak = _truth(_model(scenario, Path(tmp) / f"case{i}"))
            pk = p.peak_allocated_bytes or 0
            print(f"| {name} | {p.step_time_ms:.3f} | {t_step:.3f} | {100 * (p.step_time_ms - t_step) / t_step:+.2f} % "
                  f"| {pk / 2**20:.1f} | {t_peak / 2**20:.1f} | {100 * (pk - t_peak) / t_peak:+.2f} % |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
