"""Size of ``fsdpviz export --format perfetto`` for a big run: 64 ranks x 80 units (synthetic FSDP2 GPU).

Generates the run once (tests/synth, 3 steps, every rank on one shared timeline), analyses it, and
writes the export with and without the raw events, as .json and .json.gz. Prints one markdown table.

    python benchmarks/bench_perfetto.py [--ranks 64] [--units 80]

Results are recorded in docs/perfetto.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from synth import Scenario, generate_run, make_root, make_units

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.report.perfetto import export_perfetto


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--units", type=int, default=80)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sc = Scenario(units=make_units(args.units, numel=1_000_000), root=make_root(), world_size=args.ranks,
                      steps=(3, 4, 5), shared_timeline=True)
        run = analyse([generate_run(sc, Path(tmp) / "run", run_folder=True).folder], cache=False)
        run.analysis  # noqa: B018 - analysed before the exports are timed
        print(f"{args.ranks} ranks x {args.units} units, 3 steps\n")
        print("| export | file | size (MB) | events | seconds |")
        print("|---|---|---:|---:|---:|")
        for raw, name in ((False, "units.json"), (False, "units.json.gz"), (True, "all.json.gz")):
            started = time.perf_counter()
            res = export_perfetto(run, Path(tmp) / name, raw=raw)
            print(f"| {'with raw events' if raw else '--no-raw'} | {name} | {res.size_bytes / 1e6:.1f} | "
                  f"{res.events:,} | {time.perf_counter() - started:.1f} |")


if __name__ == "__main__":
    main()
