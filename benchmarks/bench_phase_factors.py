"""Two factors per CPU rank, the collectives' and the host work's, fitted on the timers' phases: do they predict better than one?

Reads the run folders that ``bench_replay_clock.py --out`` keeps (the example trainer, FSDP2 on 2 gloo
ranks, per-block recordings under two profiler loads beside in-process bare truth). No recording is
made here.

The replay without the profiler on CPU (:mod:`fsdpviz.replay.calibration`) scales every traced duration
of a rank by one factor, its clean step over its traced one. Where a core is shared through the
profiled window, gloo's collectives slow several times more than the compute, and one factor scales the
two alike. The alternative read here: per rank, the collectives' times (each gather's and reduction's
``comm_ns`` and ``ar_ns``, the segments' waits) scaled by ``r`` times the host work's factor ``kc``, ``r``
taken from :data:`GRID` (each step's first gather also holds the ranks meeting after the optimizer
step, scaled with it). For each ``r``, ``kc`` is the one that puts the replay on the rank's clean step (the
replay scales with every duration, so ``kc`` is the clean step over the replay at ``kc = 1``); the ``r``
kept is the one whose replayed phases (forward, backward, optimizer: :func:`fsdpviz.replay.phases.sim_phases`)
take out of each phase what the timers saw leave it (the traced replay's phase less the profiled steps'
plus the unprofiled steps', least squares), on the profiled steps whose phases the timers timed, as the
phase check (:func:`fsdpviz.replay.phases.phase_check`) reads them. A rank without such a fit is scaled
by its one factor, as whatif scales it. Then each setting's step ratio is predicted from every
per-block recording both ways, beside the in-process bare ratio. docs/whatif.md ("One clock") quotes
the figures.

``--optimizer-own``: the optimizer's segment (FSDP2 runs no collective there) scaled by its own factor,
the share of the traced replay's optimizer phase that the timers saw it keep without the profiler, and
``kc`` and ``r`` fitted on the forward and the backward alone (``kc`` by least squares, not put on the
clean step; two targets for two factors, so the fit is all but exact and ``r`` reaches the grid's ends
more often).

    python benchmarks/bench_replay_clock.py --loads light,window --dim 256 --layers 4 --rounds 3 --out /tmp/clock-b
    python benchmarks/bench_phase_factors.py /tmp/clock-b [--optimizer-own]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import sys
from pathlib import Path

from inproc_cpu_truth import pooled_rounds

from fsdpviz.analysis.pipeline import analyse
from fsdpviz.replay import model as replay_model
from fsdpviz.replay import program as prog
from fsdpviz.replay.calibration import _scale_segment, scaled_step
from fsdpviz.replay.model import Model, read_model, recorded_settings
from fsdpviz.replay.phases import per_rank_phases
from fsdpviz.replay.recorded import StepProgram
from fsdpviz.replay.settings import Settings, parse_wrap
from fsdpviz.replay.simulate import SimResult, run
from fsdpviz.structure.profiler_cost import STEP_PHASES, clean_step_ms, phase_times
from fsdpviz.vocabulary import OPTIMIZER
from fsdpviz.whatif.predict import predict

SETTINGS = {"pair": Settings().with_(wrap=parse_wrap("merge:2")), "root": Settings().with_(wrap=parse_wrap("root")),
            "noreshard": Settings().with_(reshard_after_forward=False)}
WORDS = {"pair": "--wrap merge:2", "root": "--wrap root", "noreshard": "--reshard-after-forward false"}
GRID = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0)  # the collectives' factor over the host work's


def two_factor_step(step: StepProgram, kc: float, r: float, k_optimizer: float | None = None) -> StepProgram:
    """``step`` with its host work scaled by ``kc`` and its collectives by ``r * kc``; the optimizer's
    segment (the step's last), its waits included, by ``k_optimizer`` alone where given."""
    out = scaled_step(step, kc)
    for g in out.gathers:
        g.comm_ns *= r
    for red in out.reduces:
        red.comm_ns *= r
        red.ar_ns *= r
    for mb in out.micro:
        for segment in (mb.pre, mb.mid):
            segment.comm_ns = [t * r for t in segment.comm_ns]
    if k_optimizer is not None:
        _scale_segment(out.post, k_optimizer / kc)
    else:
        out.post.comm_ns = [t * r for t in out.post.comm_ns]
    return out


def fitted_factors(model: Model, optimizer_own: bool = False) -> dict[int, tuple[float, float, float | None]]:
    """Per rank of ``model``'s recording that timed its phases and its clean steps: (``kc``, ``r``, the
    optimizer's own factor or None) as the module docstring fits them."""
    result, rec = model.result, model.recording
    timed = phase_times(result.traces.timers, result.traces.run)
    clean = clean_step_ms(result.traces.timers, result.traces.run)
    traced_sims = dict(zip(map(id, rec.steps), model.replays))  # the traced steps' replays, read with the model

    def replay(steps: list[StepProgram]) -> list[SimResult]:
        return [run(prog.build(rec, s, recorded_settings(), model.comm, model.gathers), False) for s in steps]

    out: dict[int, tuple[float, float, float | None]] = {}
    for rank in sorted(set(timed) & set(clean)):
        # the steps the timers' profiled side is read from, as the phase check reads them
        steps = [s for s in rec.steps if s.rank == rank
                 and (not timed[rank].profiled_steps or s.step in timed[rank].profiled_steps)]
        traced = per_rank_phases(steps, [traced_sims[id(s)] for s in steps]) if steps else None
        if traced is None:
            continue
        profiled, unprofiled = timed[rank].profiled, timed[rank].unprofiled
        # what each phase should keep: the traced replay's phase less the profiler's share the timers saw
        target = {p: traced[rank][p] - profiled[p] + unprofiled[p] for p in STEP_PHASES if p in unprofiled}
        k_optimizer = (target[OPTIMIZER] / traced[rank][OPTIMIZER] if optimizer_own and traced[rank][OPTIMIZER] > 0
                       and target.get(OPTIMIZER, 0.0) > 0 else None)
        fitted = {p: want for p, want in target.items() if k_optimizer is None or p != OPTIMIZER}
        best: tuple[float, float, float] | None = None
        for r in GRID:
            at_one = [two_factor_step(s, 1.0, r, k_optimizer) for s in steps]
            sims = replay(at_one)
            phases = per_rank_phases(at_one, sims)
            if phases is None:
                continue
            if k_optimizer is None:  # the replay scales with kc: this kc puts it on the clean step
                kc = clean[rank][0] / statistics.fmean(sim.step_ns / 1e6 for sim in sims)
            else:  # the forward and the backward scale with kc, the optimizer's segment does not
                kc = (sum(want * phases[rank][p] for p, want in fitted.items())
                      / sum(phases[rank][p] ** 2 for p in fitted))
            miss = sum((kc * phases[rank][p] - want) ** 2 for p, want in fitted.items())
            if best is None or miss < best[0]:
                best = (miss, kc, r)
        if best is not None:
            out[rank] = (best[1], best[2], k_optimizer)
    return out


def ratio(model: Model, settings: Settings) -> float:
    p = predict(model, settings)
    return p.predicted.step_time_ms / p.baseline.step_time_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+", help="folders kept by bench_replay_clock.py (--out)")
    parser.add_argument("--optimizer-own", action="store_true",
                        help="the optimizer's segment on its own factor, the two fitted on the forward and backward")
    args = parser.parse_args()
    for base in args.folders:
        truths = sorted(base.glob("inproc-*.json"))
        runs = sorted(p for p in base.glob("block-*-*") if (p / "run.json").is_file())
        if not truths or not runs:
            sys.exit(f"{base}: no per-block recordings and in-process truth (a folder kept by bench_replay_clock.py --out)")
        print(f"\n{base}\n")
        print("| recording | rank: one factor / kc, r (, the optimizer's own) |")
        print("|---|---|")
        models: dict[str, list[tuple[Model, Model]]] = {}
        for path in runs:
            result = analyse([path], cache=False, progress=False)
            model = read_model(result)
            factors = fitted_factors(model, args.optimizer_own)
            one = model.calibration.scale if model.calibration is not None else {}
            rec = copy.copy(model.recording)
            rec.steps = [two_factor_step(s, *factors[s.rank]) if s.rank in factors
                         else scaled_step(s, one[s.rank]) if s.rank in one else s for s in rec.steps]
            two = dataclasses.replace(model, net=replay_model._model(result, rec, None), gains={})
            print(f"| {path.name} | " + "; ".join(f"{rank}: {one.get(rank, float('nan')):.3f} / {kc:.3f}, {r}"
                                                 + (f", optimizer {ko:.3f}" if ko is not None else "")
                                                 for rank, (kc, r, ko) in factors.items()) + " |", flush=True)
            models.setdefault(path.name.split("-")[1], []).append((model, two))
        statistic, per_round = pooled_rounds(truths)
        print(f"\n| setting | bare, in one process ({statistic} step) | " + " | ".join(f"{load}: one factor / two" for load in models) + " |")
        print("|---|---:|" + "---:|" * len(models))
        for name, settings in SETTINGS.items():
            cells = [f"{statistics.median(ratio(m, settings) for m, _ in pairs):.3f} / "
                     f"{statistics.median(ratio(t, settings) for _, t in pairs):.3f}" for pairs in models.values()]
            print(f"| {WORDS[name]} | {statistics.median(per_round[name]):.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
