"""Does whatif's advice depend on how much the profiler slowed the recording? Bare truth on 2 CPU ranks.

Records ``examples/train.py`` (FSDP2, 4 blocks of dim 256, 12 steps) per block under two profiler
loads -- ``light`` (``--no-memory``) and ``heavy`` (allocator events recorded, and a process spinning
on one of the two cores while it records) -- and runs every setting bare (``fsdpviz record --mode
timers``: no profiler, the timers only), round by round so that the machine's drift falls on all
alike. From each per-block recording ``whatif`` predicts one root unit, pairs (``merge:2``) and no
resharding after forward as a share of the recorded step; the truth is the bare runs' step of that
setting over the bare per-block step (each bare run: the median over ranks of its clean steps'
median, steps 2 on).

    python benchmarks/bench_replay_clock.py [--rounds 2] [--out DIR]

Prints per recording its slowdown and clock, then per setting the predicted ratios from each load
beside the bare ratio. Results are recorded in docs/whatif.md ("One clock").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_whatif_cpu import record, recordings_folder
from harness import describe_machine

MODEL = ["--framework", "fsdp2", "--layers", "4", "--dim", "256", "--steps", "12"]
SETTINGS = {"block": ["--wrap", "block"], "pair": ["--wrap", "pair"], "root": ["--wrap", "root"],
            "noreshard": ["--wrap", "block", "--no-reshard-after-forward"]}
PREDICT = {"pair": ["--wrap", "merge:2"], "root": ["--wrap", "root"],
           "noreshard": ["--reshard-after-forward", "false"]}
LOADS = {"light": ("--no-memory",), "heavy": ()}
SETTLING_STEPS = 2  # as profiler_cost.SETTLING_STEPS: the first steps of a run are slower


def bare_step_ms(run: Path) -> float:
    """Median over ranks of each rank's median whole step from step 2 on (a run without the profiler)."""
    per_rank = []
    for path in sorted((run / "timers").glob("rank*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [r["ms"] for r in rows if r["unit"] == "" and r["phase"] == "step" and r["kind"] == "total"
                 and r["step"] >= SETTLING_STEPS and not r.get("partial")]
        per_rank.append(statistics.median(steps))
    return statistics.median(per_rank)


def whatif(run: Path, options: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fsdpviz", "whatif", str(run), *options, "--json", "-q"],
                          check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)


def summary(run: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fsdpviz", "summary", str(run), "--json", "-q"],
                          check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep the recordings here (default: a temp folder)")
    args = parser.parse_args()
    started = time.perf_counter()
    with recordings_folder(args.out) as base:
        recorded: dict[str, list[Path]] = {load: [] for load in LOADS}
        bare: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for i in range(args.rounds):
            for load, options in LOADS.items():
                folder = base / f"block-{load}-{i}"
                if not (folder / "run.json").is_file():
                    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "heavy" else None
                    try:
                        record(folder, SETTINGS["block"], model=MODEL, options=options)
                    finally:
                        if spin is not None:
                            spin.kill()
                recorded[load].append(folder)
                print(f"recorded {folder.name}", file=sys.stderr, flush=True)
            for name, extra in SETTINGS.items():
                folder = base / f"bare-{name}-{i}"
                if not (folder / "run.json").is_file():
                    record(folder, extra, model=MODEL, options=("--mode", "timers"))
                bare[name].append(bare_step_ms(folder))
                print(f"ran {folder.name} bare: {bare[name][-1]:.2f} ms", file=sys.stderr, flush=True)
        print(describe_machine())
        truth = {name: statistics.median(v) / statistics.median(bare["block"]) for name, v in bare.items()}
        print("\n| recording | slowdown | clock | replay error | step (ms) | bare per-block step (ms) |")
        print("|---|---:|---|---:|---:|---:|")
        for load, folders in recorded.items():
            for folder in folders:
                s = summary(folder)
                clock = s.get("clock") or {}
                err = clock.get("replay_error_pct")
                print(f"| {folder.name} | {(s.get('profiler') or {}).get('slowdown')} | {clock.get('basis')} | "
                      f"{'' if err is None else f'{err:.1f} %'} | {s['step_time_ms']:.2f} | "
                      f"{statistics.median(bare['block']):.2f} |")
        print("\n| setting | bare ratio | " + " | ".join(f"predicted from {load}" for load in LOADS)
              + " | light - heavy |")
        print("|---|---:|" + "---:|" * (len(LOADS) + 1))
        for name, options in PREDICT.items():
            ratios = {}
            for load, folders in recorded.items():
                values = []
                for folder in folders:
                    w = whatif(folder, options)
                    values.append(w["predicted"]["step_time_ms"] / w["baseline"]["step_time_ms"])
                ratios[load] = values
            cells = " | ".join(", ".join(f"{v:.3f}" for v in ratios[load]) for load in LOADS)
            gap = statistics.median(ratios["light"]) - statistics.median(ratios["heavy"])
            print(f"| {' '.join(options)} | {truth[name]:.3f} | {cells} | {gap:+.3f} |")
    print(f"\n({time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
