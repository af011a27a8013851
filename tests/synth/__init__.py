"""Synthetic GPU FSDP2 traces whose per-unit answers are known by construction.

A :class:`Scenario` describes a job (units with sizes and compute times, prefetch policy, ranks,
rank clocks, stragglers, HSDP); :func:`generate_run` simulates it (``timeline``), writes one Kineto
trace per rank shaped like real GPU traces (``kineto``) and returns the expected analysis results
(``expected``), computed from the model rather than from fsdpviz's analysis code.

    from synth import Scenario, generate_run, make_units, make_root
    run = generate_run(Scenario(units=make_units(4), root=make_root()), tmp_path)
    traces = load_traces(run.paths)
    ... compare with run.expected.spans / unit_steps / step_peaks / clock_offsets / skew

:func:`generate_large_run` writes big runs for benchmarks (e.g. 64 ranks x 80 units with about a
million events per rank) by simulating one shared timeline and serialising its events once.
Tests import this package as ``synth`` (``tests/`` is on ``sys.path`` under pytest); scripts
outside pytest add the ``tests`` folder to ``sys.path`` first.
"""

from __future__ import annotations

import gzip
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from fsdpviz.naming import unit_from_label

from .expected import Expected, build_expected
from .fsdp2 import Fsdp2Engine
from .kineto import TRACE_FILE, event_dicts, header, write_rank
from .scenario import ROOT, Scenario, UnitSpec, make_root, make_units, merge_into_root, merge_units

__all__ = [
    "ROOT",
    "Expected",
    "Scenario",
    "SynthRun",
    "UnitSpec",
    "generate_large_run",
    "generate_run",
    "make_root",
    "make_units",
    "merge_into_root",
    "merge_units",
    "simulate",
]


@dataclass(kw_only=True, slots=True)
class SynthRun:
    """Files written for a scenario and what the analysis should find in them."""

    scenario: Scenario
    paths: list[Path]
    """One trace per rank, in rank order."""
    folder: Path
    """The folder holding them (a run folder with run.json when asked for)."""
    expected: Expected
    n_events: int
    """Trace events per rank (complete + instant + flow + metadata)."""


def simulate(sc: Scenario) -> Fsdp2Engine:
    """Run the scenario's schedule; the engine holds the events and the truth."""
    engine = Fsdp2Engine(sc, 1 if sc.shared_timeline else sc.world_size)
    engine.run()
    return engine


def generate_run(sc: Scenario, out_dir: str | Path, *, run_folder: bool = False,
                 ranks: list[int] | None = None, expected_ranks: list[int] | None = None,
                 gzip_level: int = 6) -> SynthRun:
    """Simulate ``sc`` and write ``rank{R}.trace.json.gz`` for every rank (or only ``ranks``).

    ``run_folder=True`` writes a run folder instead (``run.json`` + ``traces/``), as
    ``fsdpviz record`` would, with the units and framework in run.json. ``expected_ranks`` limits
    the expected answers to some ranks (default: every rank written).
    """
    out = Path(out_dir)
    trace_dir = out / "traces" if run_folder else out
    trace_dir.mkdir(parents=True, exist_ok=True)
    engine = simulate(sc)
    wanted = list(range(sc.world_size)) if ranks is None else sorted(ranks)
    timeline_of = {r: 0 if sc.shared_timeline else r for r in wanted}
    paths, n_events = [], 0
    shared_gz: bytes | None = None
    for r in wanted:
        path = trace_dir / TRACE_FILE.format(rank=r)
        if sc.shared_timeline:
            if shared_gz is None:  # identical events on every rank: serialise and compress once
                dicts = event_dicts(engine.events, sc, r, 0, True)
                n_events = len(dicts)
                shared_gz = gzip.compress(orjson.dumps(dicts), compresslevel=gzip_level)
                del dicts
            write_rank(path, header(sc, r, True), b"", level=gzip_level, body_gz=shared_gz)
        else:
            body = event_dicts(engine.events, sc, r, timeline_of[r], False)
            n_events = len(body)
            write_rank(path, header(sc, r, False), body, level=gzip_level)
        paths.append(path)
    if run_folder:
        _write_run_json(sc, out)
    exp_ranks = wanted if expected_ranks is None else sorted(expected_ranks)
    expected = build_expected(sc, engine.truth, exp_ranks, {r: timeline_of.get(r, 0) for r in exp_ranks})
    return SynthRun(scenario=sc, paths=paths, folder=out, expected=expected, n_events=n_events)


def _prefetch(names: list[str], i: int, setting: object) -> list[str] | str:
    """run.json's prefetch entry of unit ``i`` (FSDP2: the units prefetched explicitly, or "default")."""
    if setting == "implicit":
        return "default"
    depth = int(setting)  # type: ignore[call-overload]
    return [unit_from_label(n) for n in names[i + 1:i + 1 + depth]]


def _measured(sc: Scenario) -> Any:
    """What ``fsdpviz record`` measures on a rank when the trace begins, as the generator made it
    (timeline.py: the shards, their gradients -- kept from step to step: the zero_grad range frees
    nothing -- and the optimizer state, all allocated before the trace)."""
    from fsdpviz.runfolder import RankMemory, TraceStartMemory

    psi = sum(sc.padded_numel(u) for u in sc.all_units())
    share = sc.dtype_bytes * psi // sc.shard_size
    return RankMemory(trace_start=TraceStartMemory(
        step=sc.steps[0], device="cuda", sharded_param_bytes=share,
        optimizer_state_bytes=sc.optimizer_bytes_per_param * psi // sc.shard_size,
        gradient_bytes_kept=share))


def _write_run_json(sc: Scenario, out: Path) -> None:
    """A run.json as ``fsdpviz record`` writes it (``fsdpviz.runfolder``), for an FSDP2 job with the
    scenario's units."""
    from fsdpviz.runfolder import (
        ProfileInfo,
        RankInfo,
        RunInfo,
        UnitInfo,
        encode_run_json,
    )

    forward = [u.name for u in sc.all_units()]
    backward = [forward[0], *reversed(forward[1:])] if sc.root is not None else list(reversed(forward))
    units = [
        UnitInfo(unit=unit_from_label(u.name), order=order, param_numel=u.numel, param_bytes=u.numel * sc.dtype_bytes,
                 dtype="bfloat16", parent="" if u.name == ROOT or sc.root is None else ROOT,
                 reshard_after_forward=u.reshard_after_forward,
                 forward_prefetch=_prefetch(forward, order, sc.forward_prefetch),
                 backward_prefetch=_prefetch(backward, backward.index(u.name), sc.backward_prefetch))
        for order, u in enumerate(sc.all_units())
    ]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    run = RunInfo(
        fsdpviz_version="0.1.0", label="synthetic", command=["torchrun", "train.py"], cwd=str(out),
        start_time=stamp, end_time=stamp, exit_code=0, status="ok", world_size=sc.world_size, hosts=["synthetic"],
        framework="fsdp2", units=units, versions={"torch": "2.13.0"},
        profile=ProfileInfo(schedule="optimizer_steps", steps=list(sc.steps)),
        ranks=[RankInfo(rank=r, memory=_measured(sc)) for r in range(sc.world_size)],
    )
    (out / "run.json").write_bytes(encode_run_json(run))


def generate_large_run(out_dir: str | Path, *, world_size: int = 64, n_units: int = 80,
                       events_per_rank: int = 1_000_000, steps: tuple[int, ...] = (1, 2, 3),
                       clock_offset_ns: dict[int, int] | None = None, **scenario: object) -> SynthRun:
    """A big FSDP2 run for benchmarks: ``world_size`` ranks sharing one timeline.

    ``kernels_per_unit`` is chosen so that each rank's trace holds about ``events_per_rank``
    events. The event body is serialised and compressed (gzip level 1) once and shared by every
    rank's file; expected answers are computed for rank 0 only (every rank shares its timeline,
    clocks may differ through ``clock_offset_ns``). Measured: 64 ranks x 80 units x ~1.2M events
    per rank in about 30 s (one core), 16 MB per file.
    """
    # Events per forward kernel: op range, mm, launch, kernel, flow pair (6); backward has 2x the
    # kernels; labels, gathers and memory add a little per unit.
    per_unit_step = 3 * 6 + 0.0
    kernels = max(1, int(events_per_rank / (per_unit_step * n_units * len(steps))) - 1)
    units = make_units(n_units, numel=25_000_000, fwd_ns=2_000_000, bwd_ns=4_000_000)
    sc = Scenario(units=units, root=make_root(numel=60_000_000), world_size=world_size, steps=steps,
                  kernels_per_unit=kernels, shared_timeline=True, clock_offset_ns=clock_offset_ns or {},
                  **scenario)  # type: ignore[arg-type]
    return generate_run(sc, out_dir, expected_ranks=[0], gzip_level=1)
