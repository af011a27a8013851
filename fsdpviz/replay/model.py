"""The one replay of a recording: read once (:func:`read_model`, on every rank or on the ranks asked
for or sampled), played back as recorded on each analysed step of those ranks and, where the
recorder's timers allow, without the profiler (``net``: :mod:`.calibration` on CPU, :mod:`.hostcost`
on GPU).

What it replays is the run's clock (``clock.clock_of`` over :func:`model_clock`: which clock the
summary's step is on, and how far the replay without the profiler misses it); the actions'
predicted gains and every ``whatif`` setting play the same programs under the setting
(``whatif.predict``) and move the recorded figures by the share it moves them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fsdpviz.analysis.compare.spread import spread_ms, step_values_ms
from fsdpviz.analysis.pipeline import LabelledRun, RunResult
from fsdpviz.errors import UsageError
from fsdpviz.replay import comm as comm_model
from fsdpviz.replay import hostcost
from fsdpviz.replay import program as prog
from fsdpviz.replay.calibration import Calibration, calibrate, rank_factors, scaled
from fsdpviz.replay.clock import Replayed
from fsdpviz.replay.phases import phase_check
from fsdpviz.replay.recorded import Gather, Recording, StepProgram
from fsdpviz.replay.recording import read_recording
from fsdpviz.replay.settings import Settings
from fsdpviz.replay.simulate import SimResult, run
from fsdpviz.structure.profiler_cost import clean_step_ms, phase_times
from fsdpviz.vocabulary import FSDP1, FSDP2, ZERO3

SAMPLED_RANKS = 16  # ranks read of a run held rank by rank (read_model)
# The ranks one model of a run is read on, whichever view asks (summary's actions, whatif, explore,
# the report): every rank up to this many, else this many spread evenly over the run (the first and
# the last included, so a model of a multi-host run sees every host's end). One model per run.
MODEL_RANKS = 8
# the settings the replay can play a recording under, per framework
SUPPORTED = {
    FSDP2: {"wrap", "prefetch", "reshard_after_forward", "keep_last_units", "world_size"},
    FSDP1: {"wrap", "prefetch", "world_size"},
    ZERO3: {"prefetch", "world_size"},
}


# A priced setting, as the actions read it (whatif.gains): its predicted change in ms, its words, its
# code, the recording's spread, why the replay is unreliable ("" if it is not), why nothing changes,
# its predicted peak (None: unknown)
Gain = tuple[float | None, str, str | None, float | None, str, str, int | None]


@dataclass(slots=True)
class Model:
    """A recording read for prediction (read once, predicted many times)."""

    result: RunResult
    recording: Recording
    comm: comm_model.CommModel
    gathers: dict[tuple[str, str], Gather]
    replays: list[SimResult] = field(default_factory=list)
    sampled: list[int] | None = None  # the ranks read, when not every rank was
    net: Model | None = None  # the same recording without the profiler (GPU: hostcost; CPU: calibration)
    calibration: Calibration | None = None  # CPU: how ``net`` was put on the timers' clean steps
    spread_share: float | None = None  # the recording's step-to-step spread over its step (spread_share)
    # setting (Settings.describe()) -> its predicted change, words and code, as the actions' gains read them
    gains: dict[str, Gain] = field(default_factory=dict)
    replayed: Replayed | None = None  # what model_clock read of it, once (every prediction states the clock)


def model_ranks(ranks: Sequence[int]) -> list[int] | None:
    """The ranks of ``ranks`` the run's one model reads (:data:`MODEL_RANKS`); None: every one."""
    every = sorted(ranks)
    if len(every) <= MODEL_RANKS:
        return None
    return [every[i] for i in sorted({round(i * (len(every) - 1) / (MODEL_RANKS - 1)) for i in range(MODEL_RANKS)})]


def read_model(result: RunResult, ranks: Sequence[int] | None = None) -> Model:
    """Read ``result`` for prediction; an error when it holds nothing the model can use.

    ``ranks``: read only these ranks' steps (a quicker, rougher model for a big run: the baseline
    stays the whole run's, the predicted change is the mean over these ranks). A run too large to
    hold whole (``result.events_kept`` False) is read on ``SAMPLED_RANKS`` ranks spread over it
    unless ``ranks`` says otherwise: reading every rank's events again would hold the whole run."""
    analysis = result.analysis
    sampled = None
    if ranks is None and not result.events_kept and len(analysis.ranks) > SAMPLED_RANKS:
        every = sorted(analysis.ranks)
        ranks = sampled = [every[i] for i in sorted({round(i * (len(every) - 1) / (SAMPLED_RANKS - 1))
                                                      for i in range(SAMPLED_RANKS)})]
    if not analysis.has_units or analysis.units.empty:
        raise UsageError("the recording has no FSDP units (no FSDP2 / FSDP1 / ZeRO-3 labels): nothing to predict")
    if analysis.framework not in SUPPORTED:
        raise UsageError(f"framework {analysis.framework}: predictions cover FSDP2, FSDP1 and ZeRO-3")
    rec = read_recording(result, ranks)
    if not rec.steps:
        raise UsageError("no analysed step holds a complete forward and backward: nothing to predict")
    model = _model(result, rec, sampled)
    model.spread_share = spread_share(result)
    cost = result.profiler
    gpu = rec.device == "gpu"
    if gpu:
        # the profiler's excess per traced host event: on the H100 recordings it predicts the wraps
        # better than host work scaled as on CPU (docs/whatif.md, "One clock")
        per_op_ns = hostcost.per_op_ns(cost, rec)
        if per_op_ns > 0:
            model.net = net_of_events(result, per_op_ns, ranks, sampled)
    elif cost is not None and cost.headline:
        def replay_ns(steps: list[StepProgram]) -> list[float]:
            return [run(prog.build(rec, s, recorded_settings(), model.comm, model.gathers), False).step_ns
                    for s in steps]

        model.calibration = calibrate(rec, rank_factors(result), clean_step_ms(result.traces.timers, result.traces.run),
                                      replay_ns)
        if model.calibration.scale:
            model.net = _model(result, scaled(rec, model.calibration.scale), sampled)
    return model


def net_of_events(result: RunResult, per_op_ns: float, ranks: Sequence[int] | None = None,
                  sampled: list[int] | None = None) -> Model:
    """The recording read with the host's time net of ``per_op_ns`` per traced host event
    (:mod:`.hostcost`), replayed: ``Model.net`` of a GPU recording. A CPU recording's net model scales
    each rank instead (:mod:`.calibration`); ``benchmarks/bench_profiler_events.py`` reads CPU ones
    this way beside it."""
    return _model(result, read_recording(result, ranks, per_op_ns=per_op_ns), sampled)


def costs_of(rec: Recording) -> tuple[comm_model.CommModel, dict[tuple[str, str], Gather]]:
    """The recording's collectives and FSDP's host work around them, fitted per kind (:mod:`.comm`), and
    a recorded gather per (unit, phase): what a program under another setting is costed from."""
    # each step's first all-gather also waits for the ranks to meet after the step's boundary (comm.fit)
    samples = [("all_gather", g.bytes, g.comm_ns) for s in rec.steps for g in s.gathers[1:]]
    meeting = [("all_gather", s.gathers[0].bytes, s.gathers[0].comm_ns) for s in rec.steps if s.gathers]
    samples += [("reduce_scatter", r.bytes, r.comm_ns) for s in rec.steps for r in s.reduces]
    # FSDP's host work around its collectives (a gather's copy-in and call, its copy-out, a reduction's
    # labels) grows with their bytes too
    samples += [(prog.GATHER_HOST, g.bytes, g.host_ns) for s in rec.steps for g in s.gathers]
    samples += [(prog.COPY_OUT_HOST, g.bytes, g.copy_out_host_ns) for s in rec.steps for g in s.gathers]
    if rec.device == "cpu":  # only CPU programs read it (program.build)
        samples += [(prog.REDUCE_HOST, r.bytes, r.host_ns) for s in rec.steps for r in s.reduces]
    fitted = comm_model.fit(samples, rec.world_size, rec.ranks_per_host,
                            per_call=frozenset({prog.GATHER_HOST, prog.COPY_OUT_HOST, prog.REDUCE_HOST}),
                            link=comm_model.NOMINAL_LINK.get(rec.device), meeting=meeting,
                            wait_in_proportion=rec.device == "cpu")
    fitted.meeting_ns = prog.meeting_ns(rec, fitted)
    gathers: dict[tuple[str, str], Gather] = {}
    for s in rec.steps:
        for g in s.gathers:
            gathers.setdefault((g.unit, g.phase), g)
    return fitted, gathers


def _model(result: RunResult, rec: Recording, sampled: list[int] | None) -> Model:
    fitted, gathers = costs_of(rec)
    model = Model(result=result, recording=rec, comm=fitted, gathers=gathers, sampled=sampled)
    model.replays = [run(prog.build(rec, s, recorded_settings(), fitted, gathers), rec.device == "gpu")
                     for s in rec.steps]
    return model


def recorded_settings() -> Settings:
    return Settings(prefetch="recorded")


def model_clock(model: Model) -> Replayed:
    """What ``model`` replays without the profiler, for the run's clock (:func:`.clock.clock_of`); read
    once per model."""
    if model.replayed is not None:
        return model.replayed
    every = len(model.result.analysis.ranks)
    ranks = sorted({s.rank for s in model.recording.steps})
    net = model.net
    phases, why = None, ""
    if net is not None:
        timers = model.result.traces.timers
        scaled_ranks = set(model.calibration.scale) if model.calibration is not None else None
        phases, why = phase_check(model.recording.steps, model.replays, net.recording.steps, net.replays,
                                  phase_times(timers, model.result.traces.run), scaled_ranks)
    model.replayed = Replayed(net_replays_ms=None if net is None else [r.step_ns / 1e6 for r in net.replays],
                              calibration=model.calibration,
                              # named where the model did not read every rank of the world: too many to
                              # read, or some traced none (their predictions are the traced ranks')
                              ranks=None if len(ranks) == every and not model.result.summary.missing_ranks else ranks,
                              phases=phases, phases_why=why)
    return model.replayed


def spread_share(result: RunResult) -> float | None:
    """The recording's own step-to-step spread as a share of its step: the range of the steps the
    summary's step time comes from (the clean unprofiled steps where the timers give it, else the
    analysed steps as traced; with fewer than three clean steps, the traced steps' where they range
    wider: compare/spread.py ``step_values_ms``; each step the median over ranks, as ``compare`` measures
    it) over that step time. None with fewer than two such steps. Read once per model, for every prediction."""
    spread = spread_ms(step_values_ms(LabelledRun(label="", source="", result=result), "step_time_ms"))
    step = result.summary.step_time_ms
    return spread / step if spread is not None and step else None
