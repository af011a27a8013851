"""How well ``fsdpviz whatif``'s model replays real CPU recordings of the tests' tiny model.

Records ``examples/train.py`` on 2 gloo ranks ``--repeat`` times per framework with the model the
integration tests record (3 blocks of dim 32, one unit per block, 7 steps, steps 2-5 profiled;
ZeRO-3 with a prefetch bucket of one block) and prints, per recording, the signed replay error:
the mean replayed step minus the mean recorded step, over the recorded one. The tests bound its
absolute value (tests/integration/test_whatif_cpu.py); this shows the spread behind those bounds.

    python benchmarks/bench_whatif_replay.py [--repeat 15] [--frameworks fsdp2 fsdp1 zero3] [--out DIR]

With ``--out`` the recordings are kept and reused by the next call, so that two versions of the
model can be compared on the same recordings (``PYTHONPATH=<other checkout> python ...``).
Results are recorded in docs/whatif.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_whatif_cpu import record, recordings_folder
from harness import describe_machine

MODEL = ["--layers", "3", "--dim", "32", "--seed", "0", "--steps", "7", "--wrap", "block"]
PROFILE = ("--steps", "4")  # fsdpviz record's: after its 2 warm-up steps, steps 2-5
FRAMEWORKS = {"fsdp2": ["--framework", "fsdp2"], "fsdp1": ["--framework", "fsdp1"],
              "zero3": ["--framework", "zero3", "--prefetch", "1"]}
ENV = {"zero3": {"DS_ACCELERATOR": "cpu"}}


def signed_replay_error(run: Path) -> float:
    """(mean replayed step - mean recorded step) / mean recorded step, in %."""
    from fsdpviz.analysis.pipeline import analyse
    try:
        from fsdpviz.replay.model import read_model
    except ImportError:  # a checkout from before the replay had a package of its own
        from fsdpviz.whatif.predict import read_model  # type: ignore[no-redef]

    model = read_model(analyse([run], cache=True, progress=False))
    recorded = statistics.fmean(s.step_ns for s in model.recording.steps)
    replayed = statistics.fmean(r.step_ns for r in model.replays)
    return 100.0 * (replayed - recorded) / recorded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--frameworks", nargs="+", choices=list(FRAMEWORKS), default=list(FRAMEWORKS))
    parser.add_argument("--out", type=Path, default=None, help="keep (and reuse) the recordings here")
    args = parser.parse_args()
    started = time.perf_counter()
    with recordings_folder(args.out) as base:
        print(describe_machine())
        print("\n| framework | recordings | signed replay error, each (%) | mean | range |")
        print("|---|---:|---|---:|---:|")
        for name in args.frameworks:
            errors = []
            for i in range(args.repeat):
                folder = base / f"{name}-{i}"
                if not (folder / "run.json").is_file():
                    record(folder, FRAMEWORKS[name], model=MODEL, env=ENV.get(name), options=PROFILE)
                    print(f"recorded {folder.name}", file=sys.stderr, flush=True)
                errors.append(signed_replay_error(folder))
            print(f"| {name} | {len(errors)} | {' '.join(f'{e:+.2f}' for e in errors)} "
                  f"| {statistics.fmean(errors):+.2f} % | {min(errors):+.2f} to {max(errors):+.2f} % |", flush=True)
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
