"""The bound under the rule and as the replay's split, on the shared GPU recordings: docs/whatif.md,
"The bound, the replay's split".

For every shared GPU recording: the bound as the analysis alone gives it (the rule's), and as every view
gives it once the run's model is read (``whatif.gains.completed_summary``: the replay's split where the
clock is ``replayed``, :mod:`fsdpviz.replay.split`): host wait, FSDP's per-unit work, other idle and
exposed communication, ms a step of the clean step; what the replay left to the rule (the run's median
traced parts less the replay's median drop of the parts it moves, against the clean step); and
``deprofiled_by``. Then, per replayed rank, each part the split moves (host wait, FSDP's hooks' wait,
exposed communication) and other idle as the trace holds it, as the model's replay of the traced steps
holds it and as its replay without the profiler does: what the split takes out of a part is the second
less the third, and the first against the second is the replay's own miss of that part.

    python benchmarks/bench_replay_split.py [--shared ../shared/traces]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from harness import shared_gpu_recordings

from fsdpviz.analysis.bound import BoundSummary, traced_parts
from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.replay.split import per_rank_parts, replay_drops
from fsdpviz.structure.deprofile import Parts, replay_moved
from fsdpviz.whatif.gains import completed_summary, summary_model

ROOT = Path(__file__).resolve().parents[1]


def _waits(b: BoundSummary) -> str:
    return f"{b.host_wait_ms or 0.0:.1f} / {b.fsdp_overhead_ms:.1f} / {b.other_idle_ms:.1f} / {b.exposed_comm_ms:.1f}"


def _left_to_rule(run: RunResult, step: float) -> float | None:
    """What the replay's drop left of the timers' excess (ms a step), or None without it."""
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
    folders = shared_gpu_recordings(args.shared)
    print("| recording | rule: host wait / FSDP's per-unit work / other idle / exposed communication | "
          "as every view gives it | left to the rule | `deprofiled_by` |")
    print("|---|---|---|---:|---|")
    part_rows: list[str] = []
    for folder in folders:
        run = analyse([folder], cache=False, progress=False)
        rule = run.summary.bound
        bound = completed_summary(run).bound
        if rule is None or bound is None:
            continue
        left = _left_to_rule(run, bound.step_ms)
        print(f"| {folder.name} | {_waits(rule)} | {_waits(bound)} | "
              f"{'-' if left is None else f'{left:.1f}'} | {bound.deprofiled_by} |", flush=True)
        part_rows += _part_rows(run, folder.name)
    if part_rows:
        print("\n(each: trace / replayed as traced / replayed without the profiler, ms a step)\n")
        print("| recording | rank | host wait | FSDP's hooks' wait | other idle | exposed communication |")
        print("|---|---:|---|---|---|---|")
        print("\n".join(part_rows))


def _part_rows(run: RunResult, name: str) -> list[str]:
    """Per replayed rank, each part as the trace, the traced replay and the net replay hold it (ms a step)."""
    model, _ = summary_model(run)
    if model is None or model.net is None:
        return []
    traced = per_rank_parts(model.recording.steps, model.replays)
    net = per_rank_parts(model.net.recording.steps, model.net.replays)
    out = []
    for r in run.overlap.to_dict(orient="records"):
        rank, parts = int(r["rank"]), traced_parts(r)[1]
        if int(r["bound_window_ns"]) > 0 and rank in traced and rank in net:
            cells = [" / ".join(f"{getattr(p, part) or 0.0:.1f}" for p in (parts, traced[rank], net[rank]))
                     for part in ("host_wait", "fsdp_host", "other_idle", "exposed_comm")]
            out.append(f"| {name} | {rank} | " + " | ".join(cells) + " |")
    return out


if __name__ == "__main__":
    main()
