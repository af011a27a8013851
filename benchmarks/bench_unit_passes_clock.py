"""A GPU unit's forward and backward on the run's clock, against the recorder's own per-unit timers.

The shared recordings whose timers clocked every unit in the profiled steps and in the clean steps
after them (../shared/traces/gpu-h200/ B, Bl, Broot; ../shared/traces/gpu-fsdp/ the two FSDP1 ones):
per (recording, pass), how much the timers' passes shrink from the profiled steps to the clean ones,
beside how much the summary's passes move from the trace, and how far other rules for the idle inside a
pass would land (every host-wait gap out, every gap out, none moved: the trace's).

    python benchmarks/bench_unit_passes_clock.py

Prints one row per (recording, pass) and the misses summed over them. Results are recorded in
docs/concepts.md ("The summary's units"); tests/unit/test_unit_passes_clock.py holds the rule to them.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.rawfiles import unit_timer_ratio

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.analysis.units import moved_pass_ns, unit_stats

SHARED = ROOT.parent / "shared" / "traces"
RECORDINGS = [SHARED / "gpu-h200" / n for n in ("B", "Bl", "Broot")] + \
    [SHARED / "gpu-fsdp" / n for n in ("h100-fsdp1-fake8-block", "h100-fsdp1-ws1-block")]
PHASES = ("forward", "backward")


def main() -> None:
    missing = [str(p) for p in RECORDINGS if not p.is_dir()]
    if missing:
        sys.exit(f"error: {', '.join(missing)}: the shared GPU recordings are not beside this checkout")
    warnings.filterwarnings("ignore")
    rules = ("this rule", "host gaps out", "all gaps out", "as traced")
    misses = dict.fromkeys(rules, 0.0)
    closer = dict.fromkeys(rules, 0)
    print(f"| recording | pass | timers | {' | '.join(rules)} |")
    print("|---|---|---:|" + "---:|" * len(rules))
    for folder in RECORDINGS:
        run = analyse([folder], cache=False, progress=False)
        a, bound = run.analysis, run.summary.bound
        k = bound.device_scale if bound is not None else 1.0
        us = a.unit_steps
        # the same units' passes under each rule: (host-wait gaps' factor, other idle's factor)
        factors = {"this rule": run.gap_scales, "host gaps out": (0.0, 1.0), "all gaps out": (0.0, 0.0),
                   "as traced": (k, k)}
        stats = {name: unit_stats(us.assign(compute_clock_ns=moved_pass_ns(
            us["compute_ns"].astype(float), us["host_gap_ns"], us["idle_gap_ns"], k, *f)), a.units)
            for name, f in factors.items()}
        for phase in PHASES:
            timers = unit_timer_ratio(folder, phase)
            traced = float(a.unit_stats[f"{phase}_ns"].sum()) * k
            ratios = {name: float(s[f"{phase}_clock_ns"].sum()) / traced for name, s in stats.items()}
            for name, ratio in ratios.items():
                misses[name] += abs(ratio - timers)
                closer[name] += abs(ratio - timers) < abs(1.0 - timers)
            print(f"| {folder.name} | {phase} | {timers:.3f} | " + " | ".join(f"{ratios[n]:.3f}" for n in rules) + " |")
    print("\nsummed |miss| against the timers' ratio: " + ", ".join(f"{n} {misses[n]:.3f}" for n in rules))
    print("pairs closer than the trace: " + ", ".join(f"{n} {closer[n]}" for n in rules))


if __name__ == "__main__":
    main()
