"""Where the profiler's cost goes on CPU: hidden behind collectives or on the step, and a model that takes it out per event.

Reads the run folders that ``bench_merged_parts.py --out`` and ``bench_replay_clock.py --out`` keep
(the example trainer, FSDP2 on 2 gloo ranks). No recording is made here.

Per recording: its traced step and its clean unprofiled step (the recorder's timers; medians over
steps and ranks), the profiler's excess (their difference), the host events the profiler traced per
step, and the excess per traced event. On one rank of a CPU run every op is the training thread's,
so a profiler that costs the same per event costs a comm-bound step (one whose collectives the
thread waits out) less than a compute-bound one with as many events: the cost hides in the waits.

Then, where the folder holds the in-process bare truth of ``bench_replay_clock.py``
(``inproc-*.json``), each setting's ratio predicted from every per-block recording two ways: by the
model (:mod:`fsdpviz.replay.calibration`, each rank's durations scaled by its clean step over its
traced one) and by the recording read net of its excess per traced event
(:func:`fsdpviz.replay.model.net_of_events`, as whatif reads a GPU recording), with the replay of that
net reading against the clean step. docs/whatif.md ("One clock") quotes the figures.

    python benchmarks/bench_merged_parts.py --dim 32 --layers 8 --rounds 3 --out /tmp/parts-a
    python benchmarks/bench_profiler_events.py /tmp/parts-a
    python benchmarks/bench_replay_clock.py --loads light,window --dim 32 --layers 8 --rounds 3 --out /tmp/clock-a
    python benchmarks/bench_profiler_events.py /tmp/clock-a
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

from inproc_cpu_truth import pooled_rounds

from fsdpviz.analysis.pipeline import RunResult, analyse
from fsdpviz.replay import hostcost
from fsdpviz.replay.model import Model, net_of_events, read_model
from fsdpviz.replay.settings import Settings, parse_wrap
from fsdpviz.structure.profiler_cost import clean_step_ms
from fsdpviz.whatif.predict import predict

SETTINGS = {"pair": Settings().with_(wrap=parse_wrap("merge:2")), "root": Settings().with_(wrap=parse_wrap("root")),
            "noreshard": Settings().with_(reshard_after_forward=False)}
WORDS = {"pair": "--wrap merge:2", "root": "--wrap root", "noreshard": "--reshard-after-forward false"}


def events_reading(result: RunResult) -> tuple[dict[str, float], Model, Model | None]:
    """The recording's profiler figures (ms, events), its model, and where the profiler's steps ran
    slower than its clean ones, its net-of-events model."""
    model = read_model(result)
    rec = model.recording
    cost = result.summary.profiler
    clean = clean_step_ms(result.traces.timers, result.traces.run)
    nan = float("nan")
    # the timers' profiled and clean steps, as whatif takes the profiler's excess on a GPU (hostcost)
    profiled_ms = cost.profiled_step_ms if cost is not None else nan
    clean_ms = statistics.median(ms for ms, _count in clean.values()) if clean else nan
    excess_ms = profiled_ms - clean_ms
    per_event_ns = excess_ms * 1e6 / rec.host_ops_per_step if rec.host_ops_per_step else nan
    net_ns = hostcost.per_op_ns(cost, rec)  # as whatif takes it on a GPU: none where the timers show no excess
    net = net_of_events(result, net_ns) if net_ns > 0 else None
    figures = {"traced": statistics.median(s.step_ns for s in rec.steps) / 1e6, "profiled": profiled_ms,
               "clean": clean_ms, "excess": excess_ms, "events": rec.host_ops_per_step,
               "per_event_ns": per_event_ns,
               "net_replay": statistics.median(r.step_ns for r in net.replays) / 1e6 if net else nan}
    return figures, model, net


def ratio(model: Model, settings: Settings) -> float:
    p = predict(model, settings)
    return p.predicted.step_time_ms / p.baseline.step_time_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+",
                        help="folders kept by bench_merged_parts.py or bench_replay_clock.py (--out)")
    args = parser.parse_args()
    for base in args.folders:
        runs = sorted(p for p in base.iterdir() if (p / "run.json").is_file() and not p.name.startswith("bare-"))
        if not runs:
            sys.exit(f"{base}: no recordings (a folder kept with --out by bench_merged_parts.py or bench_replay_clock.py)")
        print(f"\n{base}\n")
        print("| recording | traced steps (ms) | profiled steps, timed (ms) | clean steps, timed (ms) | excess (ms) "
              "| traced host events per step | excess per event (ns) | replay net of it (ms) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        models: dict[str, list[tuple[Model, Model | None]]] = {}
        for run in runs:
            result = analyse([run], cache=False, progress=False)
            f, model, net = events_reading(result)
            print(f"| {run.name} | {f['traced']:.2f} | {f['profiled']:.2f} | {f['clean']:.2f} | {f['excess']:.2f} | {f['events']:,.0f} | "
                  f"{f['per_event_ns']:,.0f} | {f['net_replay']:.2f} |", flush=True)
            if run.name.startswith("block-") and run.name.count("-") == 2:
                models.setdefault(run.name.split("-")[1], []).append((model, net))
        truths = sorted(base.glob("inproc-*.json"))
        if not truths or not models:
            continue
        statistic, per_round = pooled_rounds(truths)
        print(f"\n| setting | bare, in one process ({statistic} step) | "
              + " | ".join(f"{load}: model / net of events" for load in models) + " |")
        print("|---|---:|" + "---:|" * len(models))
        for name, settings in SETTINGS.items():
            cells = []
            for pairs in models.values():
                scaled = statistics.median(ratio(m, settings) for m, _net in pairs)
                nets = [ratio(_with_net(m, net), settings) for m, net in pairs if net is not None]
                cells.append(f"{scaled:.3f} / {statistics.median(nets):.3f}" if nets else f"{scaled:.3f} / -")
            print(f"| {WORDS[name]} | {statistics.median(per_round[name]):.3f} | " + " | ".join(cells) + " |")


def _with_net(model: Model, net: Model) -> Model:
    """``model`` predicting on ``net`` (the net-of-events reading) in place of its calibrated one."""
    return dataclasses.replace(model, net=net, calibration=None, gains={})


if __name__ == "__main__":
    main()
