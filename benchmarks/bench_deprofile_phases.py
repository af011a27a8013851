"""Where each de-profiler takes the profiler's share out, phase by phase, against the recorder's timers:
docs/whatif.md, "Which de-profiler the split reads".

For every shared GPU recording whose timers timed phases in clean steps: the rule
(:mod:`fsdpviz.analysis.bound_phases`: the excess out of the device's waits on the host in proportion
to their time, split by the pass whose launch ended each wait; what the bound falls back on) and the
replay's (a cost per traced host event, the step simulated again: :mod:`fsdpviz.replay.hostcost`; the
bound's split, :mod:`fsdpviz.replay.split`), each against what the timers
saw leave the forward, the backward and the rest of the step (the step less those two; the backward is
read with the rest where the recorder timed none), in % of the unprofiled step, medians over ranks.
The replay's phases are its own check's (:func:`fsdpviz.replay.phases.per_rank_phases`); its rest is
the replayed step's drop less theirs, so that on both rules, as on the timers, the three add up to the
step's drop. Which rule is nearer is judged by each recording's largest phase miss.

    python benchmarks/bench_deprofile_phases.py [--shared ../shared/traces]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from harness import shared_gpu_recordings

from fsdpviz.analysis.bound_phases import REST, bound_phase_check
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.replay.phases import per_rank_phases
from fsdpviz.structure.profiler_cost import STEP_TIMER_PHASE, phase_times
from fsdpviz.vocabulary import BACKWARD, FORWARD
from fsdpviz.whatif.gains import summary_model

ROOT = Path(__file__).resolve().parents[1]


def replay_misses(result: RunResult) -> dict[str, float] | None:
    """The replay's misses on the bound check's partition (module docstring); None without a replay
    without the profiler on a rank that timed its phases, or with steps of several micro-batches (the
    recordings this compares run one a step)."""
    model, _ = summary_model(result)
    if model is None or model.net is None or any(len(s.micro) > 1 for s in model.recording.steps):
        return None
    timed = phase_times(result.traces.timers, result.traces.run)
    before = per_rank_phases(model.recording.steps, model.replays)
    after = per_rank_phases(model.net.recording.steps, model.net.replays)
    if before is None or after is None:
        return None
    misses: list[dict[str, float]] = []
    for rank in sorted(set(before) & set(after) & set(timed)):
        t = timed[rank]
        phases = [p for p in (FORWARD, BACKWARD) if p in t.unprofiled]
        took = {p: before[rank][p] - after[rank][p] for p in phases}
        took[REST] = before[rank][STEP_TIMER_PHASE] - after[rank][STEP_TIMER_PHASE] - sum(took.values())
        seen = {p: t.profiled[p] - t.unprofiled[p] for p in phases}
        seen[REST] = t.profiled[STEP_TIMER_PHASE] - t.unprofiled[STEP_TIMER_PHASE] - sum(seen.values())
        misses.append({p: 100.0 * (took[p] - seen[p]) / t.unprofiled[STEP_TIMER_PHASE] for p in took})
    if not misses:
        return None
    return {p: statistics.median(m[p] for m in misses) for p in misses[0] if all(p in m for m in misses)}


def _cells(miss: dict[str, float] | None) -> str:
    if miss is None:
        return "| | | | "
    cells = [f"{miss[p]:+.1f} %" if p in miss else "with the rest" for p in (FORWARD, BACKWARD, REST)]
    return "| " + " | ".join(cells) + f" | {max(abs(v) for v in miss.values()):.1f} % "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    args = parser.parse_args()
    folders = shared_gpu_recordings(args.shared)
    print("| recording | rule | forward | backward | rest | largest |")
    print("|---|---|---:|---:|---:|---:|")
    largest: dict[str, list[float]] = {"rule": [], "replay": []}
    for folder in folders:
        result = analyse([folder], cache=False, progress=False)
        check = bound_phase_check(result)
        if check is None:
            continue
        replay = replay_misses(result)
        spilled = f" (and {check.spilled_ms:.1f} ms of other idle)" if check.spilled_ms >= 0.001 else ""
        print(f"| {folder.name} | the rule's{spilled} {_cells(check.miss_pct)}|")
        print(f"| | the replay's {_cells(replay)}|", flush=True)
        largest["rule"].append(check.error_pct)
        if replay is not None:
            largest["replay"].append(max(abs(v) for v in replay.values()))
    for rule, values in largest.items():
        if values:
            print(f"\n{rule}: largest phase's miss, median over recordings {statistics.median(values):.1f} %, "
                  f"largest {max(values):.1f} %")


if __name__ == "__main__":
    main()
