"""The bound's waits under the rule and divided by the replay, on the shared GPU recordings: docs/whatif.md,
"The bound's waits, divided by the replay".

For every shared GPU recording: the bound as the analysis alone gives it (the rule's), and as every view
gives it once the run's model is read (``whatif.gains.completed_summary``: the replay's division where
the clock is ``replayed``, :mod:`fsdpviz.replay.split`): host wait, FSDP's per-unit work and other idle,
ms a step of the clean step; what the replay left to the rule (the run's median traced parts less the
replay's median drop of the waits, against the clean step); and ``deprofiled_by``.

    python benchmarks/bench_replay_split.py [--shared ../shared/traces]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from fsdpviz.analysis.bound import BoundSummary, traced_parts
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.replay.split import replay_drops
from fsdpviz.structure.deprofile import Parts, replay_moved
from fsdpviz.whatif.gains import completed_summary, summary_model

ROOT = Path(__file__).resolve().parents[1]


def _waits(b: BoundSummary) -> str:
    return f"{b.host_wait_ms or 0.0:.1f} / {b.fsdp_overhead_ms:.1f} / {b.other_idle_ms:.1f}"


def _left_to_rule(run: RunResult, step: float) -> float | None:
    """What the replay's drop of the waits left of the timers' excess (ms a step), or None without it."""
    model, _ = summary_model(run)
    drops, _ = replay_drops(model) if model is not None else (None, "")
    if not drops:
        return None
    rows = [traced_parts(r)[1] for r in run.overlap.to_dict(orient="records") if int(r["bound_window_ns"]) > 0]

    def median(parts: list[Parts]) -> Parts:
        return Parts(*(statistics.median(p[i] or 0.0 for p in parts) for i in range(len(Parts._fields))))

    return replay_moved(median(rows), median(list(drops.values())), step).left.total - step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    args = parser.parse_args()
    folders = [p for p in sorted((args.shared / "gpu-fsdp").glob("h100-*")) if p.is_dir()]
    folders += [p for p in (args.shared / "gpu-h200" / n for n in ("B", "Bl", "Broot")) if p.is_dir()]
    print("| recording | rule: host wait / FSDP's per-unit work / other idle | as every view gives it | "
          "left to the rule | `deprofiled_by` |")
    print("|---|---|---|---:|---|")
    for folder in folders:
        run = analyse([folder], cache=False, progress=False)
        rule = run.summary.bound
        bound = completed_summary(run).bound
        if rule is None or bound is None:
            continue
        left = _left_to_rule(run, bound.step_ms)
        print(f"| {folder.name} | {_waits(rule)} | {_waits(bound)} | "
              f"{'-' if left is None else f'{left:.1f}'} | {bound.deprofiled_by} |", flush=True)


if __name__ == "__main__":
    main()
