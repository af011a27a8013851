"""``predict``: one recording and a setting -> the step time, communication and memory it would give.

Every analysed step of every rank is simulated twice: as recorded (the *replay*) and under the
setting. The replay measures how well the model explains the recording (``traced_replay_error_pct``); the
prediction is the recording moved by the share the setting moves the simulation (predicted =
recorded x simulated(setting) / simulated(recorded), per rank and step, the mean of the shares), so
whatever the model does not explain cancels out instead of being blamed on the setting.

One clock (replay/clock.py): the recorded figures are the summary's (its step, the bound's exposed
communication and work), and the simulations are the replay without the profiler where the
recorder's timers allow one (:mod:`fsdpviz.replay.calibration` on CPU, :mod:`fsdpviz.replay.hostcost`
on GPU), so the recorded setting predicts the summary exactly. Without such a replay and with the traced step as the summary's, the step moves
by the simulated difference instead.

The recording is read once into a :class:`fsdpviz.replay.model.Model` (the one replay, every view's
clock); checking a setting against it, the baseline, the simulations and the predicted outcome per
unit are one procedure here, read top to bottom.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import msgspec

from fsdpviz.analysis.memory_categories import CATEGORIES
from fsdpviz.analysis.pipeline import RunResult
from fsdpviz.errors import NoDataError, UsageError
from fsdpviz.formatting import NS_PER_MS, rounded_ms
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.replay import comm as comm_model
from fsdpviz.replay import prefetch_args
from fsdpviz.replay import program as prog
from fsdpviz.replay.clock import BASIS_TRACED, PHASE_LIMIT_PCT, RELIABLE_REPLAY_PCT, clock_of, on_clean_step
from fsdpviz.replay.memory import MemoryChange, MemorySetting, predict_step
from fsdpviz.replay.model import SUPPORTED, Model, model_clock
from fsdpviz.replay.recorded import Recording, StepProgram
from fsdpviz.replay.settings import DEFAULT, GIVEN, RECORDED, Settings, Wrap
from fsdpviz.replay.simulate import SimResult, run
from fsdpviz.structure.parallelism import known_dims
from fsdpviz.structure.profiler_cost import HIGH_SLOWDOWN, NO_CLOSER_BASE
from fsdpviz.vocabulary import FSDP1, FSDP2, ZERO3
from fsdpviz.whatif import bounds, known
from fsdpviz.whatif.apply import Apply, apply_code, fsdp1_arguments
from fsdpviz.whatif.stacks import DEEPSPEED, launched_by

if TYPE_CHECKING:
    from fsdpviz.analysis.bound import BoundSummary
    from fsdpviz.structure.profiler_cost import ProfilerCost

# Why a prefetch setting changes nothing on a CPU recording, and where the recording's collectives took no
# time: the reasons, each said with what it leaves (one setting's prediction: PREFETCH_SAME; every depth of
# --explore's grid alike: DEPTHS_ALIKE, where they all do).
CPU_PREFETCH_REASON = ("on a CPU rank the training thread waits out every gloo collective it issues (the replay models "
                       "them as waited for, which reproduces CPU recordings best), so issuing an all-gather earlier "
                       "hides nothing")
# DeepSpeed issues its prefetched gathers asynchronously, so a CPU rank's thread may compute beside them
# (analysis/actions.py ``waits_out_collectives``): there the reason is the replay's, not the run's
ZERO3_CPU_PREFETCH_REASON = ("on a CPU rank the replay holds each of DeepSpeed's collectives as the training thread's "
                             "wait for it, less the compute the recording ran beside it, so when a gather is issued "
                             "moves its prediction only through how DeepSpeed's prefetch bucket groups what it "
                             "fetches; DeepSpeed's prefetched gathers are asynchronous, and what more of them an "
                             "earlier issue would hide is not modelled")
NO_COMM_PREFETCH_REASON = ("the recording's collectives took no time (a fake process group, or nothing to gather), so "
                           "issuing an all-gather earlier or later hides or exposes no communication")
# gloo on CUDA tensors (replay/recorded.py ``serial_collectives``): the step stays (the exposed part may still
# move in the replay, which the split's own note says where its parts then overrun the step)
SERIAL_PREFETCH_REASON = ("the rank's collectives ran on a host backend (gloo on CUDA tensors), one at a time in the "
                          "order issued, each all-gather holding the training thread while it runs (the replay queues "
                          "them so), so issuing a gather earlier leaves the chain of collectives, and the step, as long")
PREFETCH_SAME = "this prefetch predicts the recorded step and exposed communication"
# a world size or host layout on such a recording: its memory moves, its communication cannot be priced
NO_COMM_WORLD_NOTE = ("the recording's collectives took no time (a fake process group, or nothing to gather), so another "
                      "world size or host layout predicts no communication for them: its step holds none, whatever "
                      "the link; record on a real process group to price it")
PREFETCH_SAME_STEP = "this prefetch predicts the recorded step"
DEPTHS_ALIKE = "prefetch depths predict the same step and exposed communication here"
DEPTHS_ALIKE_STEP = "prefetch depths predict the same step here"
CPU_PREFETCH_NOTE = f"{CPU_PREFETCH_REASON}: {PREFETCH_SAME}"
ZERO3_CPU_PREFETCH_NOTE = f"{ZERO3_CPU_PREFETCH_REASON}: {PREFETCH_SAME}"
NO_COMM_PREFETCH_NOTE = f"{NO_COMM_PREFETCH_REASON}: {PREFETCH_SAME}"
SERIAL_PREFETCH_NOTE = f"{SERIAL_PREFETCH_REASON}: {PREFETCH_SAME_STEP}"


class PrefetchAlike(NamedTuple):
    """Why a prefetch setting predicts the recorded step: its note, the reason in it, and how --explore
    says it of the rows it holds for (``rows``) or of every depth (``depths``)."""

    note: str
    reason: str
    rows: str
    depths: str


# Said by a prefetch setting that predicts the recorded step, each where it holds (the advisor and
# --explore say why the prefetch rows read alike: the rows it holds for, or every depth).
PREFETCH_ALIKE: Final = (
    PrefetchAlike(CPU_PREFETCH_NOTE, CPU_PREFETCH_REASON, "predicted as recorded", DEPTHS_ALIKE),
    PrefetchAlike(ZERO3_CPU_PREFETCH_NOTE, ZERO3_CPU_PREFETCH_REASON, "predicted as recorded", DEPTHS_ALIKE),
    PrefetchAlike(NO_COMM_PREFETCH_NOTE, NO_COMM_PREFETCH_REASON, "predicted as recorded", DEPTHS_ALIKE),
    PrefetchAlike(SERIAL_PREFETCH_NOTE, SERIAL_PREFETCH_REASON, "predicted the recorded step", DEPTHS_ALIKE_STEP),
)
PREFETCH_SAME_NOTES: Final = tuple(a.note for a in PREFETCH_ALIKE)
PREFETCH_REASONS: Final = tuple(a.reason for a in PREFETCH_ALIKE)
# Where the recording has fewer than two steps of its step time (compare/spread.py MIN_SPREAD_STEPS): a
# prediction cannot be held to a step-to-step spread, so nothing is advised or ranked on it (whatif's own
# output, --explore and the summary's advice say it alike).
SPREAD_UNKNOWN_WHY = "the recording's step-to-step spread is unknown (fewer than two steps of its step time)"
SPREAD_UNKNOWN = f"{SPREAD_UNKNOWN_WHY}: whether the change is measurable cannot be said"
# Past this slowdown the profiler's own cost is a large part of the traced step the model is built on.


@dataclass(slots=True)
class UnitOutcome:
    """One unit's figures per step (None: unknown, as the summary has it)."""

    name: str
    all_gather_ms: float | None
    forward_ms: float | None
    backward_ms: float | None
    reduce_scatter_ms: float | None
    exposed_comm_ms: float | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "all_gather_ms": self.all_gather_ms, "forward_ms": self.forward_ms,
                "backward_ms": self.backward_ms, "reduce_scatter_ms": self.reduce_scatter_ms,
                "exposed_comm_ms": self.exposed_comm_ms}


@dataclass(slots=True)
class Outcome:
    """Step time, communication, compute and memory of a run (recorded or predicted)."""

    step_time_ms: float
    exposed_comm_ms: float
    comm_ms: float
    compute_ms: float
    peak_allocated_bytes: int | None
    units: list[UnitOutcome]
    # what the peak holds (memory_categories.CATEGORIES); None where it cannot be known, as in `summary`
    memory_categories: dict[str, int | None] | None = None
    memory_unknown: dict[str, str] = field(default_factory=dict)  # category -> why it is None
    memory_assumed: dict[str, str] = field(default_factory=dict)  # category -> what its bytes assume
    fsdp_kernels_ms: float | None = None
    """FSDP's copy kernels outside the model's work and the collectives (the bound's ``fsdp_kernels_ms``):
    compute is the model's alone, so a copy a setting drops leaves this, not compute. None on a CPU, whose
    copies are FSDP's host work."""
    peak_unknown: str | None = None
    """Why ``peak_allocated_bytes`` is None (the prediction's note that says it); None where it is known."""

    def to_json(self) -> dict[str, Any]:
        return {"step_time_ms": self.step_time_ms, "exposed_comm_ms": self.exposed_comm_ms, "comm_ms": self.comm_ms,
                "compute_ms": self.compute_ms, "fsdp_kernels_ms": self.fsdp_kernels_ms,
                "peak_allocated_bytes": self.peak_allocated_bytes, "peak_unknown": self.peak_unknown,
                "memory_categories": self.memory_categories, "memory_unknown": self.memory_unknown,
                "memory_assumed": self.memory_assumed,
                "units": [u.to_json() for u in self.units]}


@dataclass(slots=True)
class Prediction:
    baseline: Outcome
    predicted: Outcome
    settings: Settings
    traced_replay_error_pct: float  # |mean simulated replay step - mean traced step| / traced
    notes: list[str]
    replay: list[SimResult]
    simulated: list[SimResult]
    steps: list[StepProgram]
    memory: list[MemoryChange | None] = field(default_factory=list)  # per step, the memory model's answer
    assumed: list[str] = field(default_factory=list)  # figures neither the recording nor the user gave
    clamps: list[str] = field(default_factory=list)
    """Of ``notes``, those naming a bound the prediction hit (a figure held to 0 or within the predicted
    communication): ``--explore`` shows them with each setting's row."""
    basis: str = BASIS_TRACED
    clock: dict[str, Any] | None = None
    """The recording's clock, as ``summary --json`` says it (replay/clock.py)."""
    profiler: dict[str, Any] | None = None
    """The recording's profiled and unprofiled step times (``summary --json`` ``profiler``); None without timers."""
    paced: bool = False
    """The profiled steps ran faster than the clean ones (``ProfilerCost.replay_adds_time``): the replay
    without the profiler added time to the traced steps, and its words say so."""
    bound: dict[str, Any] | None = None
    """The predicted step's split and bound (``explore.predicted_bound``, as ``--explore`` gives each setting's;
    whatif ``--json``'s ``bound``), with its note where a part was held at 0; None where the recording has no
    split, or where the caller did not ask for one."""
    prefetch_arguments: dict[str, object] | None = None
    """The prefetch setting as the framework's own arguments (:mod:`fsdpviz.replay.prefetch_args`); None
    where run.json does not say what was recorded."""
    spread_ms: float | None = None
    """The recording's own step-to-step spread on the prediction's basis (:func:`recording_spread_ms`);
    None with fewer than two steps (:data:`SPREAD_UNKNOWN_WHY`)."""
    warnings: list[str] = field(default_factory=list)
    """What makes the prediction weak, said before its figures (an unreliable replay, a heavy profiler)."""
    apply: Apply | None = None
    """The setting as code for the recorded architecture (:mod:`.apply`)."""
    parts_over_pct: float | None = None
    """How far the predicted step's parts (compute, exposed communication, FSDP's copy kernels) add up
    past the predicted step, in % of it, where they do by more than :data:`PARTS_OVER_PCT`: the
    simulation's communication and its step disagree (:func:`parts_over`); None where they fit."""

    @property
    def clean_replay_error_pct(self) -> float | None:
        """How far the replay without the profiler misses the timers' clean steps (``clock.replay_error_pct``);
        None where the model does not replay the run without the profiler."""
        value = (self.clock or {}).get("replay_error_pct")
        return None if value is None else float(value)

    def replay_words(self) -> str:
        """How well the model replays the run, both checks named apart (the terminal's and the page's
        replay line): the traced steps as recorded, and without the profiler the timers' clean steps."""
        clean = self.clean_replay_error_pct
        phases = (self.clock or {}).get("phase_error_pct")
        calibration = (self.clock or {}).get("calibration")
        aside = [] if clean is None else ["without the profiler, on the run's clean steps"
                                          if on_clean_step(clean, calibration)
                                          else f"without the profiler, the run's clean steps within {clean:.1f} %"]
        if phases is not None:  # out of sample: where the profiler's share came out (replay/phases.py)
            what = "the time it added per phase" if self.paced else "the profiler's share per phase"
            aside.append(f"out of sample, {what} within {phases:.1f} % of the step")
        # the traced step is what the replay is built from: in sample, unlike the checks after it
        words = (f"the model reproduces the traced step it is built from within {self.traced_replay_error_pct:.1f} % "
                 f"({'; '.join(['in sample', *aside])})")
        if self.parts_over_pct is not None:
            words += f"; this prediction's parts add up {self.parts_over_pct:.1f} % past its step"
        return words

    @property
    def reliable(self) -> bool:
        """Whether the replay reproduces the recording within :data:`RELIABLE_REPLAY_PCT`: the traced
        step, and where the model replays it without the profiler, the timers' clean step too; and where
        the timers time the unprofiled steps' phases, the profiler's share came out of each within
        :data:`PHASE_LIMIT_PCT` of the step (out of sample); and the prediction's own parts fit its step
        (:attr:`parts_over_pct` None)."""
        clean = self.clean_replay_error_pct
        phases = (self.clock or {}).get("phase_error_pct")
        return (self.traced_replay_error_pct <= RELIABLE_REPLAY_PCT and (clean is None or clean <= RELIABLE_REPLAY_PCT)
                and (phases is None or float(phases) <= PHASE_LIMIT_PCT) and self.parts_over_pct is None)

    @property
    def measurable(self) -> bool | None:
        """Whether the predicted step moves by more than the recording's own spread (None: unknown)."""
        if self.spread_ms is None:
            return None
        return abs(self.predicted.step_time_ms - self.baseline.step_time_ms) > self.spread_ms

    def settings_json(self) -> dict[str, dict[str, object]]:
        """The setting predicted, every value filled in, with its prefetch as the framework's arguments
        (``whatif --json``'s ``predicted.settings``, and each ``--explore`` entry's)."""
        out = self.settings.to_json()
        out["prefetch"]["arguments"] = self.prefetch_arguments
        if self.prefetch_arguments is None:
            out["prefetch"]["arguments_unknown"] = PREFETCH_ARGUMENTS_UNKNOWN
        return out

    def to_json(self) -> dict[str, Any]:
        predicted = self.predicted.to_json()
        predicted["settings"] = self.settings_json()
        predicted["spread_ms"] = self.spread_ms
        predicted["measurable"] = self.measurable
        return {"basis": self.basis, "clock": self.clock, "baseline": self.baseline.to_json(), "predicted": predicted,
                "profiler": self.profiler, "traced_replay_error_pct": round(self.traced_replay_error_pct, 2),
                "reliable": self.reliable, "parts_over_pct": self.parts_over_pct, "warnings": self.warnings,
                "apply": self.apply.to_json() if self.apply is not None else None,
                "assumed": self.assumed, "bound": self.bound, "notes": self.notes}


def check(model: Model, settings: Settings) -> None:
    """An error for a setting the model cannot predict for this recording."""
    rec = model.recording
    supported = SUPPORTED[rec.framework]
    changed = {k for k, v in settings.sources.items() if v == GIVEN}
    if "world_size" in changed and settings.world_size < 1:
        raise UsageError(f"--world-size {settings.world_size}: needs at least 1 rank")
    if "world_size" in changed and rec.world_size < 2 and settings.world_size != rec.world_size:
        raise UsageError("the recording ran on one rank: no collective to scale to another world size")
    if "world_size" in changed:
        found = model.result.parallelism
        mesh = found.parallelism
        if found.roles_unknown:
            # the model would scale the whole world as FSDP ranks: right only for a 1-D mesh
            raise UsageError(
                f"--world-size: the run's device mesh has dimension(s) of unknown role "
                f"({', '.join(found.unknown_dims)}), so it may not be 1-D; fsdpviz reads the roles from the "
                f"dimension names ({known_dims()})")
        if mesh.is_2d:
            # the model scales every collective with the world; on a 2-D mesh FSDP's group is one dimension
            raise UsageError(
                f"--world-size: the run's mesh is 2-D (dp_shard {mesh.dp_shard}, dp_replicate {mesh.dp_replicate}, "
                f"tp {mesh.tp}); the model scales the whole world as FSDP ranks, which this run's are not")
    unsupported = sorted(k for k in changed - supported if k not in ("gpus_per_node", "inter_node_gbps"))
    if unsupported:
        raise UsageError(f"{rec.framework}: the model covers {', '.join(_option(k) for k in sorted(supported))}, "
                         f"not {', '.join(_option(k) for k in unsupported)}"
                         + (fsdp1_reshard_hint(rec, settings) if rec.framework == FSDP1 else ""))
    if "keep_last_units" in changed:
        children = [u for u in rec.units if u != ROOT_UNIT]
        if not 0 < settings.keep_last_units <= len(children):
            raise UsageError(f"--keep-last-units {settings.keep_last_units}: the recording has {len(children)} "
                             "non-root unit(s)")
    if "prefetch" in changed and prefetch_args.arguments(rec.framework, settings.prefetch, []) is None:
        raise UsageError(f"--prefetch {settings.prefetch}: {rec.framework} prefetches at most "
                         f"{prefetch_args.FSDP1_MAX_DEPTH} unit ahead (forward_prefetch=True, backward_prefetch="
                         f"{prefetch_args.FSDP1_BACKWARD_DEFAULT}); deeper prefetch is FSDP2's")
    if settings.wrap.kind != "recorded":
        prog.group_units(rec, settings)  # raises for a regex that matches nothing or is finer than recorded


def predict(model: Model, settings: Settings) -> Prediction:
    """Predict ``settings`` (see the module docstring)."""
    check(model, settings)
    rec = model.recording
    if not rec.steps or min(s.step_ns for s in rec.steps) <= 0:
        # the replay's miss of them is unknown, not 0: nothing says the model explains them
        raise NoDataError("the recorded steps last no time (a ProfilerStep span is empty): the model's replay "
                          "cannot be checked against them, so nothing is predicted from them")
    full = _filled(settings, rec)
    # every timing is the replay's without the profiler where the model has one (module docstring)
    timing = model.net or model
    simulated = [run(prog.build(timing.recording, s, _for_program(full, rec), timing.comm, timing.gathers),
                     rec.device == "gpu") for s in timing.recording.steps]
    baseline = _baseline(model)
    setting = memory_setting(rec, full)
    memory = [predict_step(s.memory, setting) if s.memory is not None else None for s in rec.steps]
    memory, floor_note = bounds.floored(memory, [s.memory for s in rec.steps], bounds.only_adds(full, rec))
    peak = _predicted_peak(rec, full, memory)
    clamps: list[str] = []
    predicted = _predicted(timing, simulated, baseline, full, peak, by_share=model.net is not None or (
        model.result.summary.traced_step_time_ms not in (None, baseline.step_time_ms)), notes=clamps)
    recorded_mean = statistics.fmean(s.step_ns for s in rec.steps)
    replay_mean = statistics.fmean(r.step_ns for r in model.replays)
    notes = list(dict.fromkeys(n for r in simulated for n in r.notes))
    notes += list(dict.fromkeys(setting.notes))  # what the memory model could not know, and took instead
    notes += _assumptions(full, rec)
    notes += clamps
    # why a prefetch reads as recorded, said only where it does: ZeRO-3's bucket also groups what it
    # fetches, which moves the step on a CPU rank too
    same_step = abs(predicted.step_time_ms - baseline.step_time_ms) < 0.0005  # the same to the µs shown
    same = same_step and abs(predicted.exposed_comm_ms - baseline.exposed_comm_ms) < 0.0005
    if _prefetch_changed(full, rec) and same and baseline.comm_ms == 0.0:
        notes.append(NO_COMM_PREFETCH_NOTE)
    elif rec.device == "cpu" and _prefetch_changed(full, rec) and same:
        notes.append(ZERO3_CPU_PREFETCH_NOTE if rec.framework == ZERO3 else CPU_PREFETCH_NOTE)
    elif rec.serial_collectives and _prefetch_changed(full, rec) and same_step:
        notes.append(SERIAL_PREFETCH_NOTE)
    no_comm_world = (baseline.comm_ms == 0.0 and predicted.comm_ms == 0.0 and full.world_size > 1
                     and (full.world_size != rec.world_size or bool(_given_hosts(full))))
    if no_comm_world:
        notes.append(NO_COMM_WORLD_NOTE)
    if full.wrap.kind != "recorded" or full.world_size != rec.world_size:  # collectives resized: their fitted lines
        notes += [f"collective model: {n}" for n in timing.comm.notes]
    notes += [n for n in peak.notes if n not in notes]
    if floor_note is not None:
        notes.append(floor_note)
    if baseline.peak_allocated_bytes is None:  # a null without its reason reads as a fault
        baseline.peak_unknown = known.model_peak_note(model)
        notes.append(baseline.peak_unknown)
    if predicted.peak_allocated_bytes is None:  # the setting's own reason (world size) before the recording's
        predicted.peak_unknown = next(iter(peak.notes), None) or baseline.peak_unknown
    if model.sampled is not None:
        notes.append(f"read on {len(model.sampled)} of {len(model.result.analysis.ranks)} ranks spread over the run "
                     f"({', '.join(map(str, model.sampled))}): the run is too large to hold every rank's events")
    cost = model.result.summary.profiler
    replay_error_pct = 100.0 * abs(replay_mean - recorded_mean) / recorded_mean
    clock = clock_of(model.result, model_clock(model))
    over = parts_over(predicted)
    warnings = weaknesses(replay_error_pct, cost, clock.replay_error_pct, clock.phase_error_pct)
    if over is not None:
        warnings.insert(0, f"unreliable: the predicted parts of the step (compute {predicted.compute_ms:,.2f}, exposed "
                           f"communication {predicted.exposed_comm_ms:,.2f}, FSDP's copy kernels "
                           f"{predicted.fsdp_kernels_ms or 0.0:,.2f} ms) add up to {_parts_ms(predicted):,.2f} ms, "
                           f"{over:.1f} % more than the predicted step ({predicted.step_time_ms:,.2f} ms): the simulation's "
                           "communication and its step disagree, so the figures are a direction at most")
    prediction = Prediction(baseline=baseline, predicted=predicted, settings=full, basis=clock.basis,
                      clock=msgspec.to_builtins(clock),
                      profiler={"profiled_step_ms": cost.profiled_step_ms, "unprofiled_step_ms": cost.unprofiled_step_ms,
                                "slowdown": cost.slowdown} if cost is not None else None,
                      paced=cost is not None and cost.replay_adds_time,
                      spread_ms=recording_spread_ms(model, baseline.step_time_ms),
                      warnings=warnings, parts_over_pct=over,
                      traced_replay_error_pct=replay_error_pct,
                      notes=notes, clamps=list(clamps), replay=timing.replays, simulated=simulated,
                      steps=timing.recording.steps, memory=memory,
                      # a bandwidth for collectives that took no time prices nothing: not an assumption then
                      assumed=([] if no_comm_world else assumed(full, rec)) + peak.assumed + mesh_assumed(model, full),
                      prefetch_arguments=prefetch_arguments(rec, full),
                      apply=apply_code(rec, unit_params(model.result), full, settings.describe(),
                                       launched_by(info.command) if (info := model.result.traces.run) else ""))
    if prediction.apply is not None:
        # the code travels alone (a file, a commit): it carries how far its prediction can be trusted
        if prediction.apply.code is not None:
            prediction.apply.code = code_header(prediction) + prediction.apply.code
        for form in prediction.apply.stacks:
            # the DeepSpeed form is JSON, read by json.load in the HF Trainer's and accelerate's
            # HfDeepSpeedConfig: no comment lines (``whatif --code`` says them on stderr)
            if form.text is not None and form.stack != DEEPSPEED:
                form.text = code_header(prediction) + form.text
    return prediction


def fsdp1_reshard_hint(rec: Recording, settings: Settings) -> str:
    """FSDP1 says resharding as one sharding strategy for every unit, which the model does not change:
    the strategy that gives the resharding asked for (hybrid where the recording was), or that the
    recording ran it already; "" where no resharding was asked for."""
    said = []
    if settings.keep_last_units:
        said.append("; FSDP1 reshards every unit alike, by its sharding strategy: no last units can keep theirs")
    wanted = settings.reshard_after_forward
    if wanted is None:
        return "".join(said)
    hybrid = rec.fsdp1_strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
    target = (("HYBRID_SHARD" if hybrid else "FULL_SHARD") if wanted
              else ("_HYBRID_SHARD_ZERO2" if hybrid else "SHARD_GRAD_OP"))
    if rec.fsdp1_strategy == target:
        said.append(f"; the recording ran sharding_strategy=ShardingStrategy.{target} already")
    else:
        what = "reshards parameters after forward" if wanted else "keeps parameters gathered from forward to backward"
        said.append(f"; FSDP1 {what} under sharding_strategy=ShardingStrategy.{target}: record a run with it and "
                    "compare the two (fsdpviz compare)")
    return "".join(said)


def _option(setting: str) -> str:
    """A setting's field as the command line names it (``keep_last_units`` -> ``--keep-last-units``)."""
    return "--" + setting.replace("_", "-")


def code_header(p: Prediction, comment: str = "#") -> str:
    """Comment lines for the top of ``p``'s code: the setting, its predicted step and peak against the
    recorded ones, whether the prediction is reliable (the replay's error) and measurable (against
    the recording's step-to-step spread)."""
    base, new = p.baseline, p.predicted
    change = new.step_time_ms - base.step_time_ms
    share = f", {100.0 * change / base.step_time_ms:+.1f} %" if base.step_time_ms else ""
    lines = [f"fsdpviz whatif: {p.settings.describe()}",
             f"predicted step {new.step_time_ms:,.2f} ms (recorded {base.step_time_ms:,.2f} ms, {change:+,.2f} ms{share})"]
    if new.peak_allocated_bytes is not None and base.peak_allocated_bytes is not None:
        lines.append(f"predicted peak {new.peak_allocated_bytes:,} bytes allocated (recorded "
                     f"{base.peak_allocated_bytes:,})")
    lines.append(f"{'reliable' if p.reliable else 'unreliable'}: {p.replay_words()}; the limit on the replays is "
                 f"{RELIABLE_REPLAY_PCT:g} %, on the per-phase check {PHASE_LIMIT_PCT:g} %, on the parts past the step "
                 f"{PARTS_OVER_PCT:g} %")
    if p.spread_ms is None:
        lines.append(f"measurable: unknown: {SPREAD_UNKNOWN_WHY}")
    else:
        lines.append(f"{'measurable' if p.measurable else 'not measurable'}: the recording's step-to-step spread is "
                     f"{p.spread_ms:,.2f} ms, the predicted change {abs(change):,.2f} ms")
    return "".join(f"{comment} {line}\n" for line in lines) + "\n"


def unit_params(result: RunResult) -> dict[str, list[str]]:
    """Each recorded unit's parameter names, as run.json lists them (empty without run.json units)."""
    run = result.traces.run
    return {} if run is None else {u.unit: [name for name, _ in u.params] for u in run.units}


def recording_spread_ms(model: Model, baseline_ms: float) -> float | None:
    """The recording's spread (:func:`fsdpviz.replay.model.spread_share`) on the prediction's basis, the baseline step."""
    return None if model.spread_share is None else round(model.spread_share * baseline_ms, 3)


# How far (in % of the predicted step) a prediction's parts may add up past its step before no figure
# of it is read as more than a direction (:func:`parts_over`): the replay's own limit, as loose.
PARTS_OVER_PCT: Final = 10.0


def parts_over(predicted: Outcome) -> float | None:
    """How far ``predicted``'s parts of the step (compute, exposed communication and FSDP's copy
    kernels, which never overlap one another in the bound) add up past its step, in % of the step,
    where that is more than :data:`PARTS_OVER_PCT`; None where they fit. The step moves by the
    share the simulated step moves, the exposed communication by the share the simulated exposed
    communication moves: where the simulation counts the second far from the first (gloo's collectives
    on a GPU stream waited on by the host), the two shares disagree, and no figure is read as more than a
    direction."""
    if predicted.step_time_ms <= 0:
        return None
    over = 100.0 * (_parts_ms(predicted) - predicted.step_time_ms) / predicted.step_time_ms
    return round(over, 2) if over > PARTS_OVER_PCT else None


def _parts_ms(outcome: Outcome) -> float:
    """The parts of ``outcome``'s step that never overlap one another: compute, exposed communication,
    FSDP's copy kernels (none on a CPU)."""
    return outcome.compute_ms + outcome.exposed_comm_ms + (outcome.fsdp_kernels_ms or 0.0)


def weaknesses(replay_error_pct: float, cost: ProfilerCost | None, clean_error_pct: float | None = None,
               phase_error_pct: float | None = None) -> list[str]:
    """What makes a recording a weak base for predictions, in words said before the figures
    (``clean_error_pct``: how far the replay without the profiler misses the timers' clean step;
    ``phase_error_pct``: out of sample, how far from the timers' phases it took the profiler's share)."""
    out = []
    if replay_error_pct > RELIABLE_REPLAY_PCT:
        out.append(f"unreliable: the model's replay misses the traced step by {replay_error_pct:.1f} % (more than "
                   f"{RELIABLE_REPLAY_PCT:g} %), so it does not explain this recording well enough for its predicted "
                   "figures to be read as more than a direction")
    elif clean_error_pct is not None and clean_error_pct > RELIABLE_REPLAY_PCT:
        out.append(f"unreliable: without the profiler, the model's replay misses the run's own step (the timers' clean "
                   f"steps) by {clean_error_pct:.1f} % (more than {RELIABLE_REPLAY_PCT:g} %), so it does not explain "
                   "the run well enough for its predicted figures to be read as more than a direction")
    elif phase_error_pct is not None and phase_error_pct > PHASE_LIMIT_PCT:
        where = (f"the time the model's replay added to the step's phases (its profiled steps ran faster than its "
                 f"clean ones) was up to {phase_error_pct:.1f} % of the step away from what the timers saw them gain"
                 if cost is not None and cost.replay_adds_time
                 else f"the model's replay took the profiler's share out of the step's phases up to "
                      f"{phase_error_pct:.1f} % of the step away from where the timers saw it leave")
        out.append(f"unreliable: out of sample, {where} (more than {PHASE_LIMIT_PCT:g} %), so its predicted figures "
                   "are not read as more than a direction")
    if cost is not None and cost.slowdown > HIGH_SLOWDOWN:
        out.append(f"the profiler slowed the recorded steps {cost.slowdown:.2f}x (more than {HIGH_SLOWDOWN:g}x): the "
                   f"traced timeline the model is built on is largely the profiler's own cost; "
                   f"{cost.closer_base or NO_CLOSER_BASE}")
    return out


PREFETCH_ARGUMENTS_UNKNOWN: Final = ("the recording does not say its prefetch arguments, nor (ZeRO-3) its units' "
                                     "parameter elements that a bucket is counted in: run.json, which fsdpviz record "
                                     "writes, holds them")


def prefetch_arguments(rec: Recording, settings: Settings) -> dict[str, object] | None:
    """A filled-in setting's prefetch as its framework's arguments: the recorded ones, or those that
    give the predicted depth (None where run.json does not say what was recorded)."""
    if not settings.prefetch_changed(rec.prefetch):
        return rec.prefetch_args or None
    if rec.framework == FSDP1:
        return fsdp1_arguments(rec, settings)  # what the code writes, a recorded BACKWARD_POST kept
    if rec.framework == ZERO3 and settings.prefetch.isdigit() and not rec.unit_numels:
        return None  # the bucket is in parameter elements, which only run.json gives
    numels = [rec.unit_numels.get(u, 0) for u in rec.units]
    return prefetch_args.arguments(rec.framework, settings.prefetch, numels)


def _for_program(settings: Settings, rec: Recording) -> Settings:
    """The program builder reads an unchanged prefetch -- not given, or given as what was recorded --
    as "replay the recorded issue order"."""
    if not _prefetch_changed(settings, rec):
        return replace(settings, prefetch="recorded")
    return settings


def _prefetch_changed(settings: Settings, rec: Recording) -> bool:
    return settings.prefetch_changed(rec.prefetch)


def _filled(settings: Settings, rec: Recording) -> Settings:
    """``settings`` with every value filled in: recorded ones from the recording, defaults stated."""
    sources = dict(settings.sources)
    values: dict[str, Any] = {}
    if sources.get("wrap") != GIVEN:
        values["wrap"] = Wrap()
        sources["wrap"] = RECORDED
    if sources.get("prefetch") != GIVEN:
        values["prefetch"] = rec.prefetch
        # without run.json's arguments the framework's default is assumed, not read off the recording
        sources["prefetch"] = RECORDED if rec.prefetch_args else DEFAULT
    if sources.get("reshard_after_forward") != GIVEN:
        sources["reshard_after_forward"] = RECORDED
    if sources.get("world_size") != GIVEN:
        values["world_size"] = rec.world_size
        sources["world_size"] = RECORDED
    if sources.get("gpus_per_node") != GIVEN:
        values["gpus_per_node"] = rec.ranks_per_host
        sources["gpus_per_node"] = RECORDED
    if sources.get("inter_node_gbps") != GIVEN:
        if rec.ranks_per_host < rec.world_size:  # the recorded collectives crossed hosts: their own bandwidth
            values["inter_node_gbps"] = 0.0
            sources["inter_node_gbps"] = RECORDED
        else:
            values["inter_node_gbps"] = comm_model.DEFAULT_INTER_HOST_GBPS[rec.device]
            sources["inter_node_gbps"] = DEFAULT
    return replace(settings, sources=sources, **values)


def _beyond_the_units(settings: Settings, rec: Recording) -> list[str]:
    """A given merge or prefetch depth larger than the recording's units allow, said as what it comes to
    (it is predicted as that, not refused: the same script on a deeper model would take it)."""
    notes = []
    children = [u for u in rec.units if u != ROOT_UNIT]
    wrap = settings.wrap
    if settings.sources.get("wrap") == GIVEN and wrap.kind == "merge" and not children:
        notes.append(f"wrap {wrap}: the recording has one unit, the root, so nothing merges: the prediction is the "
                     "recorded setting's")
    elif settings.sources.get("wrap") == GIVEN and wrap.kind == "merge":
        parents = prog.unit_parents(rec)
        widest = max(Counter(parents[u] for u in children).values())
        if widest == 1:
            notes.append(f"wrap {wrap}: no parent holds two units side by side, so nothing merges: the prediction is "
                         "the recorded setting's")
        elif wrap.k > widest:
            notes.append(f"wrap {wrap}: no parent holds more than {widest} unit(s) side by side, so each parent's "
                         f"units become one, as wrap merge:{widest} does")
    depth = settings.prefetch_depth
    if settings.sources.get("prefetch") == GIVEN and depth is not None and children and depth > len(children):
        notes.append(f"prefetch {depth}: the recording has {len(children)} unit(s) after the root, so no gather can "
                     f"be issued more than {len(children)} ahead: as prefetch {len(children)}")
    return notes


def _given_hosts(settings: Settings) -> list[str]:
    """The host layout's options ``settings`` was given."""
    return [o for o in ("gpus_per_node", "inter_node_gbps") if settings.sources.get(o) == GIVEN]


def _hosts_unused(settings: Settings) -> list[str]:
    """A given host layout that the predicted world never uses, said (it is predicted, and changes nothing)."""
    given = _given_hosts(settings)
    world = settings.world_size
    if not given or world < 1:
        return []
    if world == 1:
        options = " and ".join("--" + o.replace("_", "-") for o in given)
        it = "they change" if len(given) > 1 else "it changes"
        return [f"{options}: one rank runs no collective, so no host is crossed: {it} nothing"]
    if "inter_node_gbps" in given and world <= settings.gpus_per_node:
        return [(f"--inter-node-gbps: the {world} ranks fit on one host ({settings.gpus_per_node} per host), so "
                 "no collective crosses hosts: it changes nothing")]
    return []


def _assumptions(settings: Settings, rec: Recording) -> list[str]:
    notes = _beyond_the_units(settings, rec) + _hosts_unused(settings)
    world = settings.world_size
    if world != rec.world_size:
        notes.append(f"world size {rec.world_size} -> {world}: ring collectives move (N-1)/N of the unsharded bytes "
                     "per rank; the sharded parameters, gradients and optimizer state scale with 1/N, the rest of "
                     "memory stays")
        if world > settings.gpus_per_node and settings.sources.get("inter_node_gbps") == RECORDED:
            notes.append(f"{world} ranks at {settings.gpus_per_node} per host: collectives cross hosts at the "
                         "bandwidth the recording's own cross-host collectives had")
    return notes


def assumed(settings: Settings, rec: Recording) -> list[str]:
    """Figures the prediction rests on that neither the recording nor the user gave (said in the
    output's headline): the bandwidth between hosts when the setting crosses hosts the recording
    did not."""
    out = []
    if (settings.world_size > settings.gpus_per_node and settings.sources.get("inter_node_gbps") == DEFAULT):
        out.append(f"{settings.world_size} ranks at {settings.gpus_per_node} per host cross hosts, which the "
                   f"recording did not: {settings.inter_node_gbps:g} GB/s per rank between hosts is assumed "
                   "(--inter-node-gbps to give your fabric's)")
    return out


def mesh_assumed(model: Model, settings: Settings) -> list[str]:
    """A world-size change on a run whose process groups do not say its mesh (no DeviceMesh groups,
    nor run.json's sizes): the model takes the whole world as one FSDP group, and says so."""
    if settings.world_size == model.recording.world_size:
        return []
    mesh = model.result.parallelism
    p = mesh.parallelism
    if None not in (p.dp_shard, p.dp_replicate, p.tp):
        return []
    why = next((str(n).removeprefix("parallelism: ") for n in mesh.notes), "the run does not say its mesh")
    return [f"the mesh is taken as 1-D (every rank one FSDP group, no replication, no tensor parallelism): {why}"]


def _baseline(model: Model) -> Outcome:
    summary = model.result.summary
    rec = model.recording
    times = model.result.analysis.step_times
    compute = statistics.fmean(sum(p.compute_ns for mb in s.micro for p in (*mb.forward, *mb.backward))
                               for s in rec.steps)
    overlap = summary.overlap
    # unknown stays unknown (None), as in the summary
    units = [UnitOutcome(name=u.name, all_gather_ms=u.all_gather_ms, forward_ms=u.forward_ms,
                         backward_ms=u.backward_ms, reduce_scatter_ms=u.reduce_scatter_ms,
                         exposed_comm_ms=u.exposed_comm_ms) for u in summary.units]
    # as `summary --json` says them (one clock: the run's step, its communication); the
    # model's own numbers where the summary has none
    step = summary.step_time_ms if summary.step_time_ms is not None else rounded_ms(
        statistics.fmean(s.step_ns for s in rec.steps))
    with_memory = [s.memory for s in rec.steps if s.memory is not None]
    peak = known.recorded_peak(max(with_memory, key=lambda m: m.peak_bytes) if with_memory else None)
    # the summary's figures, on its clock: the overlap's compute is the bound's model compute, its
    # exposed communication the bound's and its communication moved as that was (``bound.comm_scale``)
    # (analysis/summary.py); the model's own numbers only where the summary has none
    exposed = overlap.exposed_comm_ms if overlap.exposed_comm_ms is not None else rounded_ms(
        float(times["exposed_comm_ns"].mean()))
    busy = overlap.compute_ms if overlap.compute_ms is not None else rounded_ms(compute)
    return Outcome(step_time_ms=step, exposed_comm_ms=exposed,
                   comm_ms=overlap.comm_ms if overlap.comm_ms is not None else rounded_ms(float(times["comm_ns"].mean())),
                   compute_ms=busy,
                   fsdp_kernels_ms=summary.bound.fsdp_kernels_ms if summary.bound is not None else None,
                   peak_allocated_bytes=peak.peak_bytes, units=units, memory_categories=peak.categories,
                   memory_unknown=peak.unknown)


def memory_setting(rec: Recording, settings: Settings) -> MemorySetting:
    """What the memory model (:mod:`fsdpviz.replay.memory`) reads of a filled-in setting."""
    group, new_units, members = prog.regrouped(rec, settings)
    reshard = prog.unit_reshard(rec, settings, new_units, members)
    world = settings.world_size or rec.world_size
    return MemorySetting(
        group=group, order=list(rec.units), reshard={u: reshard.get(group.get(u, u), True) for u in rec.units},
        recorded_reshard=dict(rec.reshard_after_forward),
        prefetch=settings.prefetch if _prefetch_changed(settings, rec) else "recorded",
        scale=rec.world_size / world if world else 1.0,
        drop_gather_buffers=rec.framework == FSDP2 and world == 1 and rec.world_size > 1,
        recorded_prefetch=rec.prefetch, framework=rec.framework, synchronous=rec.device == "cpu",
        **_zero3_bucket(rec, settings, world),
        **_fsdp1_params(rec))


def _fsdp1_params(rec: Recording) -> dict[str, Any]:
    """FSDP1's fields of the memory setting: each unit's parameters' elements and the bytes of one
    (a merged unit's members' parameter gradients wait for its flat gradient)."""
    if rec.framework != FSDP1 or not rec.unit_params:
        return {}
    return {"unit_params": dict(rec.unit_params), "element_bytes": prog.element_bytes_of(rec)}


def _zero3_bucket(rec: Recording, settings: Settings, world: int) -> dict[str, Any]:
    """ZeRO-3's fields of the memory setting: the prefetch bucket the setting writes, when it is not
    the recorded one and run.json lists the units' parameters (the gathers carry parameters)."""
    bucket = prog.zero3_bucket(rec, settings)  # the replay's forward gathers regroup under the same one
    if bucket is None:
        return {}
    recorded = rec.prefetch_args.get("stage3_prefetch_bucket_size")
    return {"zero3_bucket": bucket,
            "zero3_recorded": (recorded, max(rec.world_size, 1)) if isinstance(recorded, int) else None,
            "unit_params": dict(rec.unit_params), "shards": max(world, 1),
            "element_bytes": prog.element_bytes_of(rec)}


def _predicted_peak(rec: Recording, settings: Settings, memory: list[MemoryChange | None]) -> known.PeakMemory:
    """The highest predicted step peak, with what it cannot know (:mod:`.known`)."""
    pairs = [(m, s.memory) for m, s in zip(memory, rec.steps, strict=True) if m is not None]
    if not pairs:
        return known.PeakMemory(None, None)
    change, step = max(pairs, key=lambda p: p[0].peak_bytes)
    world = settings.world_size or rec.world_size
    return known.predicted_peak(change, step, rec.world_size / world, f"{rec.world_size} -> {world}",
                                sized=settings.sources.get("world_size") == GIVEN)


def category_floor(baseline: Outcome, predicted: Outcome) -> int:
    """The least change of a peak's category the terminal and the page list: 1 MiB, or on a small model
    5 % of the larger peak (a model of a few MiB moves its shards by less than a MiB, a third of its peak's
    change)."""
    peaks = [p for p in (baseline.peak_allocated_bytes, predicted.peak_allocated_bytes) if p]
    return max(1, min(1 << 20, int(0.05 * max(peaks)))) if peaks else 1 << 20


def category_moves(baseline: Outcome, predicted: Outcome
                   ) -> tuple[int, list[tuple[str, int, int]], list[tuple[str, int]]]:
    """The peak's categories a setting moves, as the terminal and the page list them: the floor
    (:func:`category_floor`), those that move by it or more (category, recorded, predicted bytes), and the
    smaller moves of 0.01 MiB or more (category, change), said together so that the ones listed are not
    read as the peak's whole change (a few KiB reads as 0.00 MiB: left out)."""
    before, after = baseline.memory_categories or {}, predicted.memory_categories or {}
    floor = category_floor(baseline, predicted)
    listed, smaller = [], []
    for c in CATEGORIES if before and after else ():
        b, a = before.get(c), after.get(c)
        if b is None or a is None:  # cannot be known (memory_unknown says why): no change to show
            continue
        if abs(a - b) >= floor:
            listed.append((c, b, a))
        elif round(abs(a - b) / 2**20, 2) > 0:
            smaller.append((c, a - b))
    return floor, listed, smaller


def within_spread_words(spread_ms: float) -> str:
    """What whatif says of a change within the recording's step-to-step spread (the command, and a saved
    prediction's cells on the report's and compare's pages)."""
    return ("not measurable in this recording: the predicted step moves by less than the recording's own step-to-step "
            f"spread ({spread_ms:,.2f} ms)")


def to_one(recorded_world: int, settings: Settings) -> bool:
    """Whether ``settings`` put a run of several ranks on one: whatif does not simulate that change (the
    step loses the recording's exposed communication and keeps the rest, a note says so), while a
    recording of one rank is simulated like any other."""
    return settings.world_size == 1 and recorded_world > 1


def _predicted(model: Model, simulated: list[SimResult], baseline: Outcome, settings: Settings,
               memory: known.PeakMemory, *, by_share: bool, notes: list[str]) -> Outcome:
    """``simulated`` against ``model``'s replays, moving ``baseline``: the step by the share the
    simulation moves it (``by_share``: the baseline is the run's own step, not the replay's traced
    one), else by the simulated difference; the rest by the simulated difference. A bound that
    changes the prediction is said in ``notes``."""
    replay = model.replays

    def moved(get: Any) -> float:
        return statistics.fmean(get(n) - get(r) for n, r in zip(simulated, replay))

    def shared(recorded_ms: float, get: Any) -> float:
        # the recorded figure moved by the share the simulation moves it: the simulation counts
        # exposed communication its own way (on CPU the host waits out every collective), which a
        # difference would carry into the recording's figure and a share does not
        pairs = [(get(n), get(r)) for n, r in zip(simulated, replay)]
        if all(r > 0 for _, r in pairs):
            return recorded_ms * statistics.fmean(n / r for n, r in pairs)
        return recorded_ms + statistics.fmean(n - r for n, r in pairs) / NS_PER_MS

    if by_share:
        ratio = statistics.fmean(n.step_ns / r.step_ns for n, r in zip(simulated, replay) if r.step_ns)
        step = baseline.step_time_ms * ratio
    else:
        step = baseline.step_time_ms + moved(lambda r: r.step_ns) / NS_PER_MS
    simulated_comm = shared(baseline.comm_ms, lambda r: r.comm_ns)
    comm = max(0.0, simulated_comm)
    if comm != simulated_comm:
        notes.append(f"the predicted communication came out at {simulated_comm:.3f} ms/step (the recording's moved by "
                     "the simulated change) and is held to 0")
    simulated_exposed = shared(baseline.exposed_comm_ms, lambda r: r.exposed_comm_ns)
    to_one_rank = to_one(model.recording.world_size, settings)
    if to_one_rank:
        # a run of many ranks put on one: no collective at all, FSDP's or any other; the step loses the
        # communication the recording exposed (what else one rank changes is not modelled). A recording
        # of one rank is simulated like any other: its program is the one the setting changes.
        comm, exposed = 0.0, 0.0
        step = baseline.step_time_ms - baseline.exposed_comm_ms
        notes.append(f"world size 1 is not simulated: the step loses the {baseline.exposed_comm_ms:.3f} ms/step of "
                     "exposed communication the recording had, and keeps everything else (FSDP's per-unit work, "
                     "which one rank still runs)")
    else:
        # exposed communication within [0, all communication]: the simulation can count more of it as
        # exposed than the recording's overlap does (on CPU the host waits out every collective), and
        # the step moves with the exposed communication the prediction keeps, not with the excess
        exposed = min(max(0.0, simulated_exposed), comm)
        step += exposed - simulated_exposed
        if abs(exposed - simulated_exposed) >= 0.0005:
            notes.append(f"the simulation counts {simulated_exposed:.3f} ms/step of exposed communication, outside "
                         f"[0, {comm:.3f}] (all the predicted communication): held to {exposed:.3f} ms, and the step "
                         f"moved by the {exposed - simulated_exposed:+.3f} ms that changed")
    recorded = baseline.peak_allocated_bytes is not None
    units = _predicted_units(model, simulated, baseline, settings, notes)
    if to_one_rank:  # no unit gathers or reduces on one rank either: known, whatever the bucket
        units = [replace(u, all_gather_ms=0.0, reduce_scatter_ms=0.0, exposed_comm_ms=0.0) for u in units]
        notes[:] = [n for n in notes if n != REBUCKETED_NOTE]
    simulated_compute = shared(baseline.compute_ms, lambda r: r.compute_ns)
    if simulated_compute < 0:
        notes.append(f"the predicted compute came out at {simulated_compute:.3f} ms/step (the recording's moved by the "
                     "simulated change) and is held to 0")
    return Outcome(step_time_ms=round(step, 3),
                   exposed_comm_ms=round(exposed, 3),
                   comm_ms=round(comm, 3),
                   compute_ms=round(max(0.0, simulated_compute), 3),
                   fsdp_kernels_ms=_predicted_kernels(baseline.fsdp_kernels_ms, simulated, replay),
                   peak_allocated_bytes=memory.peak_bytes if recorded else None, units=units,
                   memory_categories=memory.categories if recorded else None,
                   memory_unknown=memory.unknown if recorded else {},
                   memory_assumed=memory.assumed_categories if recorded else {})


def _predicted_kernels(recorded_ms: float | None, simulated: list[SimResult],
                       replay: list[SimResult]) -> float | None:
    """FSDP's copy kernels under a setting: the recording's (the part outside the model's work) moved by
    the share the simulation moves all of FSDP's kernels, over the steps whose replay holds any (a step
    without any has none for a setting to move); the recorded figure where none does. A share, not the
    simulated difference outside the model's work: the replay of the traced steps splits FSDP's kernels
    as the trace did (tests/unit/test_replay_fsdp_kernels.py), but the replay without the profiler, whose
    host launches sooner, runs some of the copies the traced steps ran alone beside the model's work
    (B: 2.21 of 2.49 ms a step), and the bound keeps the traced split."""
    if recorded_ms is None:
        return None
    ratios = [n.fsdp_kernel_ns / r.fsdp_kernel_ns for n, r in zip(simulated, replay) if r.fsdp_kernel_ns > 0]
    return round(recorded_ms * statistics.fmean(ratios), 3) if ratios else recorded_ms


def time_rows(baseline: Outcome, predicted: Outcome) -> list[tuple[str, float, float]]:
    """The step's time figures a prediction is shown with, recorded beside predicted (the terminal's and
    the page's table): FSDP's copy kernels where known (GPU), beside the model's compute."""
    rows = [(label, getattr(baseline, key), getattr(predicted, key))
            for label, key in (("step time", "step_time_ms"), ("exposed communication", "exposed_comm_ms"),
                               ("communication", "comm_ms"), ("compute", "compute_ms"))]
    if baseline.fsdp_kernels_ms is not None and predicted.fsdp_kernels_ms is not None:
        rows.append(("FSDP's copy kernels", baseline.fsdp_kernels_ms, predicted.fsdp_kernels_ms))
    return rows


def split_rows(recorded: BoundSummary | None, split: dict[str, Any] | None) -> list[tuple[str, float, float]]:
    """The rest of the step's split beside :func:`time_rows` (the terminal's table and the page's): FSDP's
    per-unit work and the idle time, the recording's bound beside the prediction's split (``Prediction.bound``),
    so that compute, FSDP's per-unit work, exposed communication and idle add up to the step. A host wait
    that is not known (a CPU rank: nothing waits for the host) is not added in as a 0: the row is other idle."""
    if recorded is None or split is None:
        return []
    known = recorded.host_wait_ms is not None and split["host_wait_ms"] is not None
    return [("FSDP per-unit work", recorded.fsdp_overhead_ms, split["fsdp_overhead_ms"]),
            ("idle (host wait + other idle)" if known else "other idle",
             (recorded.host_wait_ms or 0.0) + recorded.other_idle_ms, (split["host_wait_ms"] or 0.0) + split["other_idle_ms"])]


UNIT_FIELDS = ("all_gather", "forward", "backward", "reduce_scatter", "exposed_comm")
REBUCKETED_FIELDS = ("all_gather", "exposed_comm")  # ZeRO-3's gathers, which another bucket groups otherwise
REBUCKETED_NOTE: Final = (
    "per-unit all-gather and exposed communication unknown (null): under another ZeRO-3 prefetch bucket "
    "DeepSpeed's forward gathers the parameters in other groups, which the recorded units' gathers do not divide "
    "into (a unit's exposed communication holds its gathers'); the step's communication is predicted")


def _predicted_units(model: Model, simulated: list[SimResult], baseline: Outcome,
                     settings: Settings, notes: list[str]) -> list[UnitOutcome]:
    """Per unit, like the step: the recorded numbers of its members moved by the simulated change
    (medians over ranks and steps), so that recorded and predicted units use one definition. A figure
    the change takes below zero is shown as 0, and ``notes`` says which and by how much."""
    group = prog.group_units(model.recording, settings)
    recorded = {u.name: u for u in baseline.units}

    def medians(sims: list[SimResult]) -> dict[str, dict[str, float]]:
        rows: dict[str, list[dict[str, float]]] = {}
        for sim in sims:
            for unit, row in sim.unit_totals().items():
                rows.setdefault(unit, []).append(row)
        return {u: {k: statistics.median(r[k] for r in rs) for k in UNIT_FIELDS} for u, rs in rows.items()}

    new, replay = medians(simulated), medians(model.replays)
    order = _unit_order(list(recorded), group, simulated)
    out = []
    below: list[str] = []
    unreplayed: dict[str, list[str]] = {}
    # under another ZeRO-3 prefetch bucket DeepSpeed fetches the parameters in other groups: the replay
    # counts a group's gather to the unit that issues it, the recorded figures to the units it carries, so
    # a unit's recorded gathers do not carry over, and moved by the replay's change they read past the
    # step (a unit whose recorded gathers the replay counted elsewhere: its share divides by almost 0)
    rebucketed = prog.zero3_bucket(model.recording, settings) is not None
    # every unit the recorded ones group into, those the setting's replay ran nothing of too (unknown)
    units = list(dict.fromkeys([*new, *(group[m] for m in recorded if m in group)]))
    for unit in sorted(units, key=lambda u: (u != ROOT_UNIT, order.get(u, 1 << 30))):
        members = [old for old, grouped in group.items() if grouped == unit]
        # a member the replay of the recording ran nothing of, or a unit the setting's replay ran nothing
        # of: how the change moves its figures is unknown
        missing = [m for m in members if m in recorded and (m not in replay or unit not in new)]
        if missing:
            unreplayed[unit] = missing
        values: dict[str, float | None] = {}
        for k in UNIT_FIELDS:
            if rebucketed and k in REBUCKETED_FIELDS:
                values[f"{k}_ms"] = None
                continue
            known = [getattr(recorded[m], f"{k}_ms") for m in members if m in recorded]
            if None in known or missing:
                values[f"{k}_ms"] = None  # a member's recorded figure, or its replay, is unknown: so is the unit's
                continue
            replayed = sum(replay[m][k] for m in members if m in replay)
            if members and len(known) == len(members):
                # moved by the share the replay moves it, as the step's exposed communication is: the
                # replay counts exposure its own way (on CPU the host waits out every collective), which
                # a difference would carry into the recorded figure and a share does not
                total = sum(v for v in known if v is not None)
                value = (total * new[unit][k] / replayed if replayed > 0
                         else total + (new[unit][k] - replayed) / NS_PER_MS)
            else:  # the summary has none of it: the replay's own figure
                value = new[unit][k] / NS_PER_MS
            if value <= -0.0005:
                below.append(f"{unit} {k.replace('_', ' ')} {value:.3f} ms")
            values[f"{k}_ms"] = round(max(0.0, float(value)), 3)
        out.append(UnitOutcome(name=unit, **values))
    if below:
        # the members' recorded figures (the overlap analysis') less the replay's own count of them: where
        # the replay counts more than the analysis did, the difference can overshoot
        notes.append("per-unit figures the change took below zero, shown as 0 (the members' recorded figures moved "
                     "by the replay's change, which counts them its own way): " + "; ".join(below))
    if rebucketed:
        notes.append(REBUCKETED_NOTE)
    if unreplayed:
        notes.append("per-unit figures unknown (null) where the model's replay of the recording, or of the setting, "
                     "ran nothing of a member, so the change cannot move its recorded figures: "
                     + "; ".join(f"{unit} ({', '.join(of)})" for unit, of in unreplayed.items()))
    return out


def _unit_order(recorded: list[str], group: dict[str, str], simulated: list[SimResult]) -> dict[str, int]:
    """Each predicted unit's place: the recorded forward order of its first member, so
    that a gather issued ahead for a later unit (FSDP's prefetch, ZeRO-3's bucket) moves no unit, nor a
    parent's own work after its children's; a unit no recorded one groups into, where the setting's
    replay first runs it in the forward."""
    order: dict[str, int] = {}  # the root's place is the caller's sort key
    for i, name in enumerate(recorded):
        order.setdefault(group.get(name, name), i)
    for i, s in enumerate(simulated[0].spans if simulated else []):
        if s.unit and s.phase == "forward":
            order.setdefault(s.unit, len(recorded) + i)
    return order
