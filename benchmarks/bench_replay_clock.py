"""Does whatif's advice depend on how much the profiler slowed the recording? Bare truth on 2 CPU ranks.

Records ``examples/train.py`` (FSDP2, 12 steps; by default 4 blocks of dim 256) per block under two
profiler loads and runs every setting bare (``fsdpviz record --mode timers``: no profiler, the timers
only), round by round so that the machine's drift falls on all alike. The loads (``--loads``):

- ``light``: ``--no-memory``;
- ``heavy``: allocator events recorded, and a process spinning on one of the two cores while it
  records (contention: it slows the clean steps as much as the profiled ones);
- ``stack``: ``--stack`` (each op's Python stack) with allocator events: a profiler whose cost per op
  is several times the light one's (on the small model, ``--dim 32 --layers 8``, the profiled steps
  ran 1.3-1.8x their clean pace, against 1.0-1.4x light);
- ``window``: ``stack``, and a process spinning on one core from the start until the trace is written,
  so that the profiled steps share a core and the clean steps after them do not: a recording whose
  profiled steps ran twice their clean pace or more, as on a machine where another job ran while the
  profiler did.

From each per-block recording ``whatif`` predicts one root unit, pairs (``merge:2``) and no resharding
after forward as a share of the recorded step. Two truths: each round also measures every setting bare
inside one process per rank, interleaved (``inproc_cpu_truth.py``, ``--truth-rounds`` rounds in it, 3 by
default: separate processes
on a shared 2-core machine drift 20-30 %; a setting's step there is its steps' median, as fsdpviz's
step is), and the ratios are the medians over every round of every such process (the ratios of the
mean step, which the tenth to fourteenth runs in docs/whatif.md read, get a verdict line of their own when
the kept files hold them; ``--pool`` over folders some of which hold the mean only reads every one as the
mean); and the bare runs' step of that setting over the bare per-block step, separate runs
(each: the median over ranks of its clean steps' median, steps 2 on).

    python benchmarks/bench_replay_clock.py [--rounds 2] [--truth-rounds 3] [--loads light,heavy] [--dim 256 --layers 4] [--out DIR]
    python benchmarks/bench_replay_clock.py --loads light,window --pool DIR [DIR ...]   # kept runs of one model

Prints per recording its slowdown and clock, then per setting the predicted ratios from each load
beside the bare ratio, and how far each median could move with other recordings and other bare
processes (bootstrap intervals). ``--pool`` adds, per setting, how far the bare ratio and each load's
median moved from run to run. Run again with the same ``--out``, it reads the recordings and bare
runs kept there instead of making them again. Results are recorded in docs/whatif.md ("One clock").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_whatif_cpu import record, recordings_folder
from harness import describe_machine
from inproc_cpu_truth import MEAN_STEP, MEDIAN_STEP, common_statistic, measure, rounds_of


def model(dim: int, layers: int) -> list[str]:
    """The example trainer's flags for the benchmark's model."""
    return ["--framework", "fsdp2", "--layers", str(layers), "--dim", str(dim), "--steps", "12"]


SETTINGS = {"block": ["--wrap", "block"], "pair": ["--wrap", "pair"], "root": ["--wrap", "root"],
            "noreshard": ["--wrap", "block", "--no-reshard-after-forward"]}
PREDICT = {"pair": ["--wrap", "merge:2"], "root": ["--wrap", "root"],
           "noreshard": ["--reshard-after-forward", "false"]}
LOADS = {"light": ("--no-memory",), "heavy": (), "stack": ("--stack",), "window": ("--stack",)}
SPIN = {"heavy"}  # loads recorded beside a process spinning on one core
SPIN_UNTIL_TRACE = {"window"}  # loads recorded beside one until the first trace is written
SETTLING_STEPS = 2  # as profiler_cost.SETTLING_STEPS: the first steps of a run are slower
RESAMPLES = 2000  # bootstrap resamples behind each interval


def bare_step_ms(run: Path) -> float:
    """Median over ranks of each rank's median whole step from step 2 on (a run without the profiler)."""
    per_rank = []
    for path in sorted((run / "timers").glob("rank*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [r["ms"] for r in rows if r["unit"] == "" and r["phase"] == "step" and r["kind"] == "total"
                 and r["step"] >= SETTLING_STEPS and not r.get("partial")]
        per_rank.append(statistics.median(steps))
    return statistics.median(per_rank)


def intervals(predicted: list[dict[str, list[float]]], bare: list[list[list[float]]],
              seed: int = 0) -> dict[str, tuple[float, float]]:
    """5-95 % bootstrap intervals of each load's median prediction minus the bare ratio, and of the
    first load's median minus the second's (key ``"loads"``), over runs: per run, each load's predicted
    ratios and its bare processes' rounds. Runs are resampled, then within each its recordings one by
    one and its bare processes whole (a process's rounds share its state; separate processes drift),
    so that the intervals hold the drift between runs as well as within one."""
    rng = np.random.default_rng(seed)
    loads = list(predicted[0])
    draws: dict[str, list[float]] = {key: [] for key in [*loads, "loads"]}
    for _ in range(RESAMPLES):
        rounds: list[float] = []
        picked: dict[str, list[float]] = {load: [] for load in loads}
        for run in rng.integers(len(predicted), size=len(predicted)):
            processes = bare[run]
            for i in rng.integers(len(processes), size=len(processes)):
                rounds.extend(processes[i])
            for load in loads:
                values = predicted[run][load]
                picked[load].extend(rng.choice(values, size=len(values)))
        truth = float(np.median(rounds))
        medians = {load: float(np.median(values)) for load, values in picked.items()}
        for load in loads:
            draws[load].append(medians[load] - truth)
        draws["loads"].append(medians[loads[0]] - medians[loads[1]])
    return {key: (float(np.quantile(v, 0.05)), float(np.quantile(v, 0.95))) for key, v in draws.items()}


def kill_at_first_trace(folder: Path, spin: subprocess.Popen) -> None:
    """Stop ``spin`` when the recording in ``folder`` has written its first trace (its profiled steps
    are over; the clean steps follow)."""
    while spin.poll() is None:
        if any((folder / "traces").glob("rank*.trace.json*")):
            spin.kill()
            spin.wait()
            return
        time.sleep(0.02)


def whatif(run: Path, options: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fsdpviz", "whatif", str(run), *options, "--json", "-q"],
                          check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)


def summary(run: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "fsdpviz", "summary", str(run), "--json", "-q"],
                          check=True, capture_output=True, text=True)
    return json.loads(proc.stdout)


def traced_parts_ms(run: Path) -> tuple[float, float]:
    """The recording's compute and collectives per step as traced (medians over its steps and ranks):
    how unevenly a load slowed them."""
    from fsdpviz.analysis.pipeline import analyse
    from fsdpviz.replay.recording import read_recording

    steps = read_recording(analyse([run], cache=False, progress=False)).steps
    compute = [sum(p.compute_ns for mb in s.micro for p in (*mb.forward, *mb.backward)) for s in steps]
    collectives = [sum(g.comm_ns for g in s.gathers) + sum(r.comm_ns for r in s.reduces) for s in steps]
    return statistics.median(compute) / 1e6, statistics.median(collectives) / 1e6


def truth_rounds(measured: list[dict], statistic: str
                 ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[list[float]]]]:
    """Per setting, the in-process measurements' rounds read as ``statistic`` (``inproc_cpu_truth.rounds_of``):
    every round of every process, each process's median, and each process's rounds."""
    every: dict[str, list[float]] = {name: [] for name in SETTINGS}
    medians: dict[str, list[float]] = {name: [] for name in SETTINGS}
    rounds: dict[str, list[list[float]]] = {name: [] for name in SETTINGS}
    for one_process in measured:
        for name, values in (rounds_of(one_process, statistic) or {}).items():
            every[name].extend(values)
            medians[name].append(statistics.median(values))
            rounds[name].append(values)
    return every, medians, rounds


def worst_miss(medians: dict[str, float], truth: float) -> float:
    """The load's median furthest from the bare ratio, as median minus bare."""
    return max((m - truth for m in medians.values()), key=abs)


def step_ratio(run: Path, options: list[str]) -> float:
    """whatif's predicted step over its baseline step for ``run`` under ``options``."""
    w = whatif(run, options)
    return float(w["predicted"]["step_time_ms"] / w["baseline"]["step_time_ms"])


def pool(folders: list[Path], loads: list[str]) -> None:
    """Kept runs of this benchmark (``--out`` folders of one model each, run with these loads), read
    again: per setting, each run's medians against its own bare ratio, then every recording of each load
    against every bare round of every run (for the intervals, runs resampled, and within each its
    recordings and its bare processes)."""
    first, second = loads
    runs = []
    for folder in folders:
        if not folder.is_dir():
            raise SystemExit(f"error: {folder} is not a folder (give --out folders of this benchmark)")
        recorded = {load: [f for f in sorted(folder.glob(f"block-{load}-*")) if (f / "run.json").is_file()]
                    for load in loads}
        missing = [load for load, found in recorded.items() if not found]
        if missing:
            raise SystemExit(f"error: {folder} holds no finished {' or '.join(missing)} recording "
                             "(block-LOAD-N with its run.json; run the benchmark with --out there first)")
        processes = [json.loads(p.read_text()) for p in sorted(folder.glob("inproc-*.json"))]
        if not processes or any(name not in rounds["per_round"] for rounds in processes for name in PREDICT):
            raise SystemExit(f"error: {folder} holds no bare rounds of every setting (inproc-N.json)")
        ratios = {name: {load: [step_ratio(f, options) for f in recorded[load]] for load in loads}
                  for name, options in PREDICT.items()}
        runs.append((folder, ratios, processes))
        print(f"read {folder}", file=sys.stderr, flush=True)
    # runs measured before the median step was kept hold the mean only: pooled with them, every run is read as
    # the mean step, so that one truth is never two statistics
    statistic = common_statistic([m for _, _, processes in runs for m in processes])
    runs = [(folder, ratios, [rounds_of(m, statistic) or {} for m in processes]) for folder, ratios, processes in runs]
    print(describe_machine())
    print(f"\nThe in-process truth: each setting's {statistic} step per round"
          + ("" if statistic == MEDIAN_STEP else " (some folders hold measurements made before the median step was "
             "kept: every one is read as the mean)") + ".")
    print(f"\n| setting | run | bare, in one process | {first} median | {second} median | {first} - {second} "
          f"| worst median - bare |")
    print("|---|---|---:|---:|---:|---:|---:|")
    inside = agree = cells = 0
    moved: list[tuple[str, list[float], dict[str, list[float]]]] = []
    for name, options in PREDICT.items():
        truths: list[float] = []
        run_medians: dict[str, list[float]] = {load: [] for load in loads}
        for folder, ratios, processes in runs:
            truth = statistics.median(v for rounds in processes for v in rounds[name])
            medians = {load: statistics.median(ratios[name][load]) for load in loads}
            truths.append(truth)
            for load in loads:
                run_medians[load].append(medians[load])
            worst = worst_miss(medians, truth)
            inside += sum(abs(m - truth) <= 0.10 for m in medians.values())
            agree += abs(medians[first] - medians[second]) <= 0.10
            cells += 1
            print(f"| {' '.join(options)} | {folder.parent.name}/{folder.name} | {truth:.3f} | {medians[first]:.3f} | {medians[second]:.3f} | "
                  f"{medians[first] - medians[second]:+.3f} | {worst:+.3f} |")
        every = {load: [v for _, ratios, _ in runs for v in ratios[name][load]] for load in loads}
        by_process = [rounds[name] for _, _, processes in runs for rounds in processes]
        truth = statistics.median(v for rounds in by_process for v in rounds)
        medians = {load: statistics.median(v) for load, v in every.items()}
        spans = intervals([ratios[name] for _, ratios, _ in runs],
                          [[rounds[name] for rounds in processes] for _, _, processes in runs])
        print(f"| {' '.join(options)} | all {len(runs)} ({len(every[first])} + {len(every[second])} recordings, "
              f"{len(by_process)} bare processes) | {truth:.3f} | {medians[first]:.3f} "
              f"({spans[first][0]:+.3f} to {spans[first][1]:+.3f}) | {medians[second]:.3f} "
              f"({spans[second][0]:+.3f} to {spans[second][1]:+.3f}) | {medians[first] - medians[second]:+.3f} "
              f"({spans['loads'][0]:+.3f} to {spans['loads'][1]:+.3f}) | "
              f"{worst_miss(medians, truth):+.3f} |")
        moved.append((" ".join(options), truths, run_medians))
    print(f"\nEach run: {inside} of {2 * cells} medians within 0.10 of its bare ratio, the loads within 0.10 "
          f"of each other on {agree} of {cells} (pooled rows: the 5-95 % intervals of each median minus bare, "
          "and of the two loads' difference, runs resampled and within them recordings and bare processes)")
    # How far the truth itself moves between runs bounds what "within 0.10 of bare, run by run" can ask of
    # a prediction made from that run's recordings: one that stays put misses some run by at least half the
    # bare ratio's range over the runs.
    print("\n| setting | bare ratio over the runs (range) | its half-range: the least worst miss of a prediction "
          "that stays put | " + " | ".join(f"{load} medians over the runs (range)" for load in loads) + " |")
    print("|---|---|---:|" + "---|" * len(loads))
    for setting, truths, run_medians in moved:
        cells_ = " | ".join(f"{min(v):.3f}-{max(v):.3f} ({max(v) - min(v):.3f})" for v in run_medians.values())
        print(f"| {setting} | {min(truths):.3f}-{max(truths):.3f} ({max(truths) - min(truths):.3f}) | "
              f"{(max(truths) - min(truths)) / 2:.3f} | {cells_} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loads", default="light,heavy", help="the two loads compared, of: " + ", ".join(LOADS))
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--truth-rounds", type=int, default=3,
                        help="rounds of every setting in each in-process bare measurement (one per --rounds)")
    parser.add_argument("--out", type=Path, default=None, help="keep the recordings here (default: a temp folder)")
    parser.add_argument("--pool", type=Path, nargs="+", default=None, metavar="DIR",
                        help="read kept runs (--out folders of one model) again and pool them; records nothing")
    args = parser.parse_args()
    names = args.loads.split(",")
    if len(names) != 2 or len(set(names)) != 2 or not set(names) <= set(LOADS):
        parser.error(f"--loads: two of {', '.join(LOADS)}, comma-separated")
    if min(args.rounds, args.truth_rounds) < 1:
        parser.error("--rounds and --truth-rounds must be at least 1")
    if args.pool:
        pool(args.pool, names)
        return
    loads = {name: LOADS[name] for name in names}
    trainer = model(args.dim, args.layers)
    started = time.perf_counter()
    with recordings_folder(args.out) as base:
        recorded: dict[str, list[Path]] = {load: [] for load in loads}
        bare: dict[str, list[float]] = {name: [] for name in SETTINGS}
        measured_all: list[dict] = []  # each in-process measurement's JSON, one per round
        for i in range(args.rounds):
            for load, load_options in loads.items():
                folder = base / f"block-{load}-{i}"
                if not (folder / "run.json").is_file():
                    spin = (subprocess.Popen([sys.executable, "-c", "while True: pass"])
                            if load in SPIN | SPIN_UNTIL_TRACE else None)
                    watch = None
                    if spin is not None and load in SPIN_UNTIL_TRACE:
                        watch = threading.Thread(target=kill_at_first_trace, args=(folder, spin), daemon=True)
                        watch.start()
                    try:
                        record(folder, SETTINGS["block"], model=trainer, options=load_options)
                    finally:
                        if spin is not None:
                            spin.kill()
                            spin.wait()
                recorded[load].append(folder)
                print(f"recorded {folder.name}", file=sys.stderr, flush=True)
            for name, extra in SETTINGS.items():
                folder = base / f"bare-{name}-{i}"
                if not (folder / "run.json").is_file():
                    record(folder, extra, model=trainer, options=("--mode", "timers"))
                bare[name].append(bare_step_ms(folder))
                print(f"ran {folder.name} bare: {bare[name][-1]:.2f} ms", file=sys.stderr, flush=True)
            measured = base / f"inproc-{i}.json"
            if not measured.is_file():
                measured.write_text(json.dumps(measure(args.dim, args.layers, rounds=args.truth_rounds)))
            one_process = json.loads(measured.read_text())
            measured_all.append(one_process)
            print(f"measured in one process: {one_process['ratios']}", file=sys.stderr, flush=True)
        # a kept --out folder may hold measurements made before the median step was kept (the mean only):
        # the truth is the median step where every process holds it, else the mean, never the two pooled
        statistic = common_statistic(measured_all)
        inproc, per_process, by_process = truth_rounds(measured_all, statistic)
        # the same truth read as the mean step (all the steps' time over their count), as earlier runs read it
        inproc_mean, per_process_mean, _ = (truth_rounds(measured_all, MEAN_STEP) if statistic == MEDIAN_STEP
                                            else truth_rounds([], MEAN_STEP))
        print(describe_machine())
        print(f"\nThe in-process truth: each setting's {statistic} step per round"
              + ("" if statistic == MEDIAN_STEP else " (this folder holds measurements made before the median "
                 "step was kept)") + ".")
        separate = {name: statistics.median(v) / statistics.median(bare["block"]) for name, v in bare.items()}
        truth = {name: statistics.median(v) for name, v in inproc.items()}
        ratio_of = {(folder, name): step_ratio(folder, options)
                    for folders in recorded.values() for folder in folders for name, options in PREDICT.items()}
        # per recording: its out-of-sample phase check beside how far its own predictions miss bare, so that
        # whether the check foretells a miss can be read off
        print("\n| recording | slowdown | clock | replay error | phase check: largest miss (phase) | step (ms) "
              "| bare per-block step, separate runs (ms) | traced compute / collectives per step (ms) | "
              + " | ".join(f"{name} - bare" for name in PREDICT) + " |")
        print("|---|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(PREDICT))
        for load, folders in recorded.items():
            for folder in folders:
                s = summary(folder)
                clock = s.get("clock") or {}
                err = clock.get("replay_error_pct")
                misses = clock.get("phase_miss_pct") or {}
                worst_phase = max(misses, key=lambda p: abs(misses[p])) if misses else None
                phase = "" if worst_phase is None else f"{misses[worst_phase]:+.1f} % ({worst_phase})"
                compute, collectives = traced_parts_ms(folder)
                print(f"| {folder.name} | {(s.get('profiler') or {}).get('slowdown')} | {clock.get('basis')} | "
                      f"{'' if err is None else f'{err:.1f} %'} | {phase} | {s['step_time_ms']:.2f} | "
                      f"{statistics.median(bare['block']):.2f} | {compute:.1f} / {collectives:.1f} | "
                      + " | ".join(f"{ratio_of[(folder, name)] - truth[name]:+.3f}" for name in PREDICT) + " |")
        first, second = loads
        # the truth's own reproducibility: its per-process medians, which drift between processes
        print("\n| setting | bare, in one process (range of its processes' medians) | bare, separate runs | "
              + " | ".join(f"predicted from {load}" for load in loads)
              + f" | {first} - {second} (medians) | worst median - in-process bare |")
        print("|---|---:|---:|" + "---:|" * (len(loads) + 2))
        spans: dict[str, dict[str, tuple[float, float]]] = {}
        # this run's verdict, read as #45's "within 0.10 of each other and of interleaved bare runs" reads
        off: list[str] = []  # the medians further than 0.10 from the in-process bare ratio
        n_medians = n_singles = singles_within = 0
        loads_apart = 0.0
        for name, options in PREDICT.items():
            ratios = {}
            for load, folders in recorded.items():
                ratios[load] = [ratio_of[(folder, name)] for folder in folders]
            cells = " | ".join(", ".join(f"{v:.3f}" for v in ratios[load]) for load in loads)
            medians = {load: statistics.median(v) for load, v in ratios.items()}
            worst = worst_miss(medians, truth[name])
            for load in loads:
                n_medians += 1
                if abs(medians[load] - truth[name]) > 0.10:
                    off.append(f"{' '.join(options)} {load} {medians[load] - truth[name]:+.3f}")
                n_singles += len(ratios[load])
                singles_within += sum(abs(v - truth[name]) <= 0.10 for v in ratios[load])
            loads_apart = max(loads_apart, abs(medians[first] - medians[second]))
            spread = f"{min(per_process[name]):.3f}-{max(per_process[name]):.3f}"
            print(f"| {' '.join(options)} | {truth[name]:.3f} ({spread}) | {separate[name]:.3f} | {cells} | "
                  f"{medians[first] - medians[second]:+.3f} | {worst:+.3f} |")
            spans[name] = intervals([ratios], [by_process[name]])
        print(f"\nThis run: {n_medians - len(off)} of {n_medians} medians within 0.10 of the in-process bare ratio"
              + (f" (further: {'; '.join(off)})" if off else "")
              + f"; the two loads' medians within {loads_apart:.3f} of each other on every setting; "
              f"{singles_within} of {n_singles} single predictions within 0.10.")
        if all(inproc_mean[name] for name in PREDICT):
            # the truth as the mean step: one slow step of a process moves it, where the median does not
            within_mean = 0
            cells_mean = []
            for name, options in PREDICT.items():
                truth_mean = statistics.median(inproc_mean[name])
                medians = {load: statistics.median(ratio_of[(f, name)] for f in folders)
                           for load, folders in recorded.items()}
                within_mean += sum(abs(m - truth_mean) <= 0.10 for m in medians.values())
                cells_mean.append(f"{' '.join(options)} {truth_mean:.3f} ({min(per_process_mean[name]):.3f}-"
                                  f"{max(per_process_mean[name]):.3f}; "
                                  + ", ".join(f"{load} {m - truth_mean:+.3f}" for load, m in medians.items()) + ")")
            print(f"The mean step's truth (its processes' range; median - bare): {'; '.join(cells_mean)}; "
                  f"{within_mean} of {n_medians} medians within 0.10 of it.")
        # how far the medians could move with other recordings and other bare processes
        print(f"\n| setting | {first} median - bare (5-95 %) | {second} median - bare | {first} - {second} |")
        print("|---|---:|---:|---:|")
        for name, options in PREDICT.items():
            print(f"| {' '.join(options)} | " + " | ".join(f"{lo:+.3f} to {hi:+.3f}" for lo, hi in
                                                       (spans[name][first], spans[name][second], spans[name]["loads"]))
                  + " |")
    print(f"\n({time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
