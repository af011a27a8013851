"""How far the replay without the profiler misses each recording's unprofiled steps, and what two
recordings of one setting predict: the tables of docs/whatif.md ("One clock", "The replay's error").

For every bundled sample, every shared H100 recording and the H200 recordings of model B it prints the
profiler's slowdown, the clock, and ``clock.replay_error_pct``: the replay of the traced steps, taken
off the profiler by the one de-profiler's measured factor (CPU) or per-event cost (GPU), against the
timers' clean steps. On CPU that factor is the clean step over the traced one, so this figure is the
replay's miss of the traced steps carried to the clean clock, not a check on anything the trace does
not hold; on a GPU the excess is the clean steps' too, and only how much of it the step loses is the
replay's. Beside it, the replay of the traced steps against the traced steps themselves (whatif's
``replay_error_pct``).

Out of sample, per phase: where did the profiler's share come out? The replay splits its step into
forward (from the step's start to its last forward span), backward (to its last backward span) and
the optimizer (the rest); the recorder's timers time the root module's forward, autograd's backward
and ``optimizer.step`` in the profiled steps and in unprofiled ones -- every step in recordings older
than the unit-timed steps, only the unit-timed ones (one by default, with the units' timers running)
since. Per phase, the profiler's cost the replay takes out (the traced replay's phase less the replay
without the profiler's) against the cost the timers saw (the profiled steps' phase less the
unprofiled ones'), both read by their own definition of the phase, so that the definitions cancel;
the difference in % of the unprofiled step. Nothing in the replay was fitted to a phase: a phase off
means the one factor (CPU) or the per-event cost (GPU) put the profiler's share in the wrong part of
the step. Per rank, medians over the steps; the row gives the median over ranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.errors import FsdpvizError
from fsdpviz.replay.settings import Settings, Wrap
from fsdpviz.whatif.gains import completed_summary, summary_model
from fsdpviz.whatif.predict import predict

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"root": Settings().with_(wrap=Wrap("root")), "merge:2": Settings().with_(wrap=Wrap("merge", k=2)),
            "reshard false": Settings().with_(reshard_after_forward=False)}
# ../shared/traces/gpu-h200/README.md: ratios of the medians of 9 in-process interleaved bare rounds
H200_BARE = {"root": 0.67, "merge:2": 0.84, "reshard false": 0.84}


PHASES = ("forward", "backward", "optimizer")


def _timed_phases(folder: Path) -> dict[int, tuple[dict[str, float], dict[str, float], int]]:
    """Per rank: the timers' median of each phase and of the step over its profiled steps, and over its
    unprofiled steps that timed every phase (not the warm-up before the profiled ones or the step after),
    and how many of those."""
    run = json.loads((folder / "run.json").read_text())
    out: dict[int, tuple[dict[str, float], dict[str, float], int]] = {}
    for info in run["ranks"]:
        path = folder / "timers" / f"rank{info['rank']}.jsonl"
        if not path.is_file():
            continue
        steps: dict[int, dict[str, float]] = {}
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("unit") == "" and r.get("kind") == "total" and r.get("ms") is not None and not r.get("partial"):
                steps.setdefault(r["step"], {})[r["phase"]] = r["ms"]
        profiled = info.get("profiled_steps") or run["profile"]["steps"]
        busy = {*profiled, min(profiled) - 1, max(profiled) + 1}
        whole = [s for s, p in steps.items() if all(k in p for k in (*PHASES, "step"))]
        traced = [steps[s] for s in whole if s in profiled]
        kept = [steps[s] for s in whole if s >= 2 and s not in busy]
        if kept and traced:
            out[info["rank"]] = ({k: statistics.median(p[k] for p in traced) for k in (*PHASES, "step")},
                                 {k: statistics.median(p[k] for p in kept) for k in (*PHASES, "step")}, len(kept))
    return out


def _replayed_phases(model: Any, net: bool) -> dict[int, dict[str, float]]:
    """Per rank: the median over its replayed steps (``net``: without the profiler) of each phase, ms:
    forward to the end of the last forward span, backward to the end of the last backward one, the
    optimizer the rest of the step."""
    source = (model.net or model) if net else model
    per_rank: dict[int, list[dict[str, float]]] = {}
    for step, sim in zip(source.recording.steps, source.replays):
        forward = max((s.end for s in sim.spans if s.phase == "forward"), default=0.0)
        backward = max((s.end for s in sim.spans if s.phase == "backward"), default=forward)
        per_rank.setdefault(step.rank, []).append({"forward": forward / 1e6, "backward": (backward - forward) / 1e6,
                                                   "optimizer": (sim.step_ns - backward) / 1e6})
    return {rank: {k: statistics.median(s[k] for s in steps) for k in PHASES} for rank, steps in per_rank.items()}


def phase_row(folder: Path, model: Any) -> str:
    """The out-of-sample table's row for ``folder``: per phase, the profiler's cost the replay takes out
    and the cost the timers saw, ms, and their difference in % of the unprofiled step."""
    timed, traced, clean = _timed_phases(folder), _replayed_phases(model, False), _replayed_phases(model, True)
    ranks = sorted(set(timed) & set(traced) & set(clean))
    if not ranks:
        return (f"| {folder.name} | 0 | | | | no unprofiled step timed its phases (a recording's first unit-timed "
                "step follows the trace export; later ones, `--unit-timer-steps 2` and more, count) |")
    cells, worst = [], 0.0
    for phase in PHASES:
        taken = [traced[r][phase] - clean[r][phase] for r in ranks]
        seen = [timed[r][0][phase] - timed[r][1][phase] for r in ranks]
        miss = statistics.median(100.0 * (t - s) / timed[r][1]["step"] for t, s, r in zip(taken, seen, ranks))
        worst = max(worst, abs(miss))
        cells.append(f"{statistics.median(taken):.1f} / {statistics.median(seen):.1f} ({miss:+.1f} %)")
    steps = min(timed[r][2] for r in ranks)
    return f"| {folder.name} | {steps} | {' | '.join(cells)} | {worst:.1f} % |"


def row(folder: Path) -> tuple[str, dict[str, float] | None]:
    """One table row for ``folder``, and its predicted step ratios (None where it cannot be read)."""
    result = analyse([folder], cache=False, progress=False)
    summary = completed_summary(result)
    clock, cost = summary.clock, summary.profiler
    model, why = summary_model(result)
    if model is None or clock is None:
        return f"| {folder.name} | | | | | {why} |", None
    base = predict(model, Settings())
    ratios: dict[str, float] = {}
    for name, settings in SETTINGS.items():
        try:
            p = predict(model, settings)
        except FsdpvizError:
            continue
        ratios[name] = p.predicted.step_time_ms / p.baseline.step_time_ms
    slowdown = f"{cost.slowdown:.2f}x" if cost is not None else "n/a"
    clean = f"{clock.replay_error_pct:.1f} %" if clock.replay_error_pct is not None else "n/a"
    PHASE_ROWS.append(phase_row(folder, model))
    return (f"| {folder.name} | {summary.device} | {slowdown} | {clock.basis} | {clean} | "
            f"{base.replay_error_pct:.1f} % |"), ratios


PHASE_ROWS: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "traces")
    parser.add_argument("--also", type=Path, nargs="*", default=[], metavar="RUN",
                        help="more run folders to put in the tables (e.g. recordings a benchmark kept)")
    args = parser.parse_args()
    folders = [p for p in sorted((ROOT / "sample_traces").iterdir()) if (p / "run.json").is_file()]
    folders += [p for p in sorted((args.shared / "gpu-fsdp").glob("h100-*")) if p.is_dir()]
    h200 = [args.shared / "gpu-h200" / name for name in ("B", "Bl", "Broot")]
    folders += [p for p in h200 if p.is_dir()]
    folders += [p for p in args.also if (p / "run.json").is_file()]
    print("| recording | device | slowdown | clock | replay vs clean steps | replay vs traced |")
    print("|---|---|---:|---|---:|---:|")
    predicted: dict[str, dict[str, float]] = {}
    errors = []
    for folder in folders:
        line, ratios = row(folder)
        print(line, flush=True)
        if ratios is not None:
            predicted[folder.name] = ratios
        cell = line.split("|")[5].strip()
        if cell.endswith("%"):
            errors.append(float(cell.removesuffix(" %")))
    if errors:
        print(f"\nreplay vs clean steps: median {statistics.median(errors):.1f} %, largest {max(errors):.1f} %")
    print("\nOut of sample, per phase: the profiler's cost the replay takes out / the cost the timers saw (ms), "
          "and the difference in % of the unprofiled step; medians over ranks:\n")
    print("| recording | unprofiled steps timed | forward | backward | optimizer | largest |")
    print("|---|---:|---:|---:|---:|---:|")
    for line in PHASE_ROWS:
        print(line)
    if "B" in predicted and "Bl" in predicted:
        print("\n| setting | bare (in-process) | predicted from B | from Bl | B − Bl |")
        print("|---|---:|---:|---:|---:|")
        for name, bare in H200_BARE.items():
            b, bl = predicted["B"].get(name), predicted["Bl"].get(name)
            if b is None or bl is None:
                continue
            print(f"| {name} | {bare:.2f} | {b:.3f} | {bl:.3f} | {b - bl:+.3f} |")
    print(json.dumps({"predicted_ratios": predicted}, indent=None))


if __name__ == "__main__":
    main()
