"""What a finding's suggested knob would gain, predicted: the words the report adds to a finding.

:func:`completed_summary` is the summary every view shows (``summary``, ``record``'s closing lines,
``compare``, the notebook): the recording read for prediction once, for the actions' predicted gains
and the clock (:mod:`fsdpviz.replay.clock`).

A finding suggests a knob only where the trace shows its cause (``analysis/findings.py``). Where the
model covers that knob -- explicit prefetch, one unit more of prefetch, keeping the first backward
unit's parameters -- the knob is predicted on the recording and the finding quotes the result:
``predicted -8.2 ms/step (-12 %), peak +3.0 MiB``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

import msgspec

from fsdpviz.analysis.actions import (
    KIND_BOUND,
    Action,
    fold,
    full_bucket,
    one_per_setting,
    waits_out_collectives,
    with_prediction,
)
from fsdpviz.analysis.bound import BY_RULE, KIND_COMMUNICATION, KIND_HOST
from fsdpviz.analysis.summary import Summary
from fsdpviz.errors import FsdpvizError
from fsdpviz.formatting import mib_change_text, mib_text
from fsdpviz.replay import prefetch_args, split
from fsdpviz.replay.clock import clock_of
from fsdpviz.replay.model import SUPPORTED, Gain, Model, model_clock, model_ranks, read_model
from fsdpviz.replay.recorded import Recording
from fsdpviz.replay.settings import GIVEN, Settings
from fsdpviz.trace.schema import OVERLAP_GPU
from fsdpviz.vocabulary import ZERO3
from fsdpviz.whatif.explore import device_budget, grid
from fsdpviz.whatif.predict import PREFETCH_SAME_NOTES, SPREAD_UNKNOWN, Prediction, predict

if TYPE_CHECKING:
    from fsdpviz.analysis.pipeline import RunResult


def recorded_depth(rec: Recording) -> int:
    """How many units ahead the recording prefetched: its explicit depth; under ZeRO-3, the most units in a
    row the recorded ``stage3_prefetch_bucket_size`` holds (the bucket :func:`prefetch_args.arguments`
    gives a depth), as the code ``whatif`` writes would set it; else 0 (the framework's default, or none)."""
    if rec.prefetch.isdigit():
        return int(rec.prefetch)
    bucket = rec.prefetch_args.get("stage3_prefetch_bucket_size")
    if rec.framework != ZERO3 or not isinstance(bucket, int) or not rec.unit_numels:
        return 0
    numels = [rec.unit_numels.get(u, 0) for u in rec.units]
    held = [d for d in range(1, len(numels) + 1)
            if cast(int, (prefetch_args.arguments(ZERO3, str(d), numels) or {})["stage3_prefetch_bucket_size"]) <= bucket]
    return max(held, default=0)


def deeper_prefetch(model: Model) -> Settings | None:
    """One unit more of prefetch than the recording's (:func:`recorded_depth`; a framework default that
    prefetches, FSDP's one unit in backward, counts as one), where the framework can say it and the
    model has units to prefetch: what both the bound's and a finding's "prefetch more" knob stand for."""
    rec = model.recording
    depth = recorded_depth(rec)
    deeper = depth + 1 if rec.framework == ZERO3 else max(depth, 1) + 1
    if rec.framework == ZERO3 and deeper > len(rec.units):
        return None  # the bucket holds every unit already
    return Settings().with_(prefetch=str(deeper)) if prefetch_args.arguments(rec.framework, str(deeper), [0]) else None


def setting_for(knob: str, model: Model) -> Settings | None:
    """The setting a finding's knob text stands for, or None when the model does not cover it."""
    rec = model.recording
    depth = int(rec.prefetch) if rec.prefetch.isdigit() else 0
    if knob.startswith("reshard_after_forward=False for "):
        return Settings().with_(keep_last_units=1)
    if knob.startswith("prefetch one more unit ahead") or "stage3_prefetch_bucket_size" in knob:
        return deeper_prefetch(model)
    if "prefetch" in knob and depth == 0:  # FSDP2's set_modules_to_*_prefetch, FSDP1's forward/backward_prefetch
        return Settings().with_(prefetch="1")
    return None


def describe_gain(model: Model, settings: Settings) -> str:
    """``predicted -8.2 ms/step (-12 %), peak +3.0 MiB`` for ``settings``; "" when it cannot be predicted."""
    try:
        p = predict(model, settings)
    except FsdpvizError:
        return ""
    return prediction_words(p)


def prediction_words(p: Prediction) -> str:
    """``predicted -8.2 ms/step (-12 %), peak +3.0 MiB`` of one prediction."""
    base, new = p.baseline, p.predicted
    diff = new.step_time_ms - base.step_time_ms
    text = f"predicted {diff:+.2f} ms/step"
    if base.step_time_ms:
        text += f" ({100 * diff / base.step_time_ms:+.1f} %)"
    if base.peak_allocated_bytes is not None and new.peak_allocated_bytes is not None:
        text += f", peak {mib_change_text(new.peak_allocated_bytes - base.peak_allocated_bytes)}"
    else:  # unknown is not "no change": said (a run without memory: the summary's no_memory note says why)
        text += ", peak unknown"
    return text


def gains(model: Model, knobs: Iterable[str]) -> dict[str, str]:
    """Knob text -> the predicted gain, for the knobs the model covers (each predicted once)."""
    out: dict[str, str] = {}
    done: dict[str, str] = {}
    for knob in dict.fromkeys(k for k in knobs if k):
        settings = setting_for(knob, model)
        if settings is None:
            continue
        key = settings.describe()
        if key not in done:
            done[key] = describe_gain(model, settings)
        if done[key]:
            out[knob] = f"{done[key]} (fsdpviz whatif: {key})"
    return out


def action_settings(action: Action, model: Model) -> list[Settings]:
    """The settings an action's knob stands for, the one to advise chosen among them by
    :func:`predict_actions`: the bound's (coarser units when the host bounds the step, or exposed
    communication a CPU rank's -- the wraps ``--explore`` tries, pairs and one root unit; one more unit
    of prefetch when communication bounds a GPU's),
    else its findings' knob."""
    if action.kind == KIND_BOUND:
        rec = model.recording
        if _wraps_knob(action, model):
            return [s for s in grid(model)[0] if s.sources.get("wrap") == GIVEN]
        if action.cause == KIND_COMMUNICATION and not action.why_not:
            if rec.framework == ZERO3:  # DeepSpeed's bucket: the findings' knob, one setting for both
                return [s] if (s := deeper_prefetch(model)) is not None else []
            depth = str((int(rec.prefetch) if rec.prefetch.isdigit() else 0) + 1)
            # one unit more than recorded, where the framework can express it (FSDP1: one unit at most)
            return [Settings().with_(prefetch=depth)] if prefetch_args.arguments(rec.framework, depth, []) else []
        return []
    first = action.knob.split("; ")[0]
    found = setting_for(first, model) if first else None
    return [found] if found is not None else []


def _wraps_knob(action: Action, model: Model) -> bool:
    """The bound's action whose knob is fewer, larger units: the host bounds the step, or exposed
    communication does on a CPU rank, which waits out each collective (analysis/actions.py's knobs)."""
    rec = model.recording
    return action.kind == KIND_BOUND and (
        action.cause == KIND_HOST
        or (action.cause == KIND_COMMUNICATION and waits_out_collectives(rec.device, rec.framework)))


def _more_prefetch(action: Action, model: Model) -> bool:
    """Whether an action's knob is more prefetch: the bound's where exposed communication bounds a step
    whose collectives are not waited out (a GPU's, DeepSpeed's on a CPU rank), or a finding's."""
    if action.kind == KIND_BOUND:
        return action.cause == KIND_COMMUNICATION and not _wraps_knob(action, model)
    return "prefetch" in action.knob


def action_setting(action: Action, model: Model) -> Settings | None:
    """The setting an action advises or prices (:func:`action_settings`, the best of them), or None."""
    candidates = action_settings(action, model)
    return _best(model, candidates) if candidates else None


def _no_wrap(model: Model) -> str:
    """Why fewer units is not advised on this recording: the model forms no other wrap for its
    framework, or the run is one unit already (``--explore`` tries no wrap either)."""
    rec = model.recording
    if "wrap" not in SUPPORTED[rec.framework]:
        return f"fsdpviz whatif cannot predict fewer units ({rec.framework}: other wrap policies are not modelled)"
    return "the run is one unit already (the root), so there are no units to merge into fewer"


def _best(model: Model, candidates: list[Settings]) -> Settings:
    """Of an action's settings, the one ``--explore`` would put first: of those whose prediction is
    known, from a reliable replay and within the device's memory (where the trace states it), the
    fastest; else the fastest known; else the first."""
    priced = []
    for settings in candidates:
        change, *_, unreliable, _because, peak = _priced(model, settings)
        if change is not None:
            priced.append((not unreliable and not _over_memory(model, peak), change, settings))
    usable = [p for p in priced if p[0]] or priced
    return min(usable, key=lambda p: p[1])[2] if usable else candidates[0]


def _priced(model: Model, settings: Settings) -> Gain:
    """:func:`_change` of ``settings``, predicted once per model whichever view asks (``Model.gains``)."""
    key = settings.describe()
    if key not in model.gains:
        model.gains[key] = _change(model, settings)
    return model.gains[key]


def _over_memory(model: Model, peak: int | None) -> str:
    """Why a setting whose predicted peak is ``peak`` is not advised for memory ("" if it fits): it exceeds
    the device's memory the trace states, as ``--explore`` lists such a setting apart."""
    budget = device_budget(model)
    if peak is None or budget is None or peak <= budget:
        return ""
    return f"its predicted peak, {mib_text(peak)}, exceeds the device's {mib_text(budget)}"


def predict_actions(model: Model, actions: Sequence[Action]) -> list[Action]:
    """``actions`` with their knobs predicted on the recording (each setting once), advised by whatif's
    own rules (analysis/actions.py ``with_prediction``: a gain beyond the recording's spread, from a
    reliable replay), actions that lead to one setting made one (``one_per_setting``); folding again,
    since an action may have lost its knob."""
    out = []
    keys: list[str | None] = []
    for action in actions:
        candidates = action_settings(action, model) if action.knob else []
        if not candidates:
            full = (full_bucket(model.result.traces.run)
                    if model.recording.framework == ZERO3 and _more_prefetch(action, model) else "")
            if action.knob and full:
                # more prefetch is the knob, but the recorded bucket holds every unit already: said why
                action = with_prediction(action, None, "", because=full)
            elif action.knob and _wraps_knob(action, model):
                # fewer units is the bound's knob, but the model can form no other units here: unknown,
                # so not advised, and said why (--explore leaves every wrap out the same way)
                action = with_prediction(action, None, "", because=_no_wrap(model))
            out.append(action)
            keys.append(None)
            continue
        settings = _best(model, candidates)
        key = settings.describe()
        change, words, code, spread, unreliable, because, peak = _priced(model, settings)
        unreliable = unreliable or _over_memory(model, peak)
        if change is None and because:  # unknown: which setting, said with why
            because = f"{because} (fsdpviz whatif: {key})"
        # no spread to hold the change to: not advised (--explore ranks nothing there either), said why
        predicted = with_prediction(action, change, f"{words} (fsdpviz whatif: {key})" if words else "",
                                    spread_ms=spread, unreliable=unreliable, because=because,
                                    spread_unknown=SPREAD_UNKNOWN)
        if predicted.knob:
            predicted = msgspec.structs.replace(predicted, knob=_naming(predicted.knob, settings),
                                                apply_code=code or predicted.apply_code)
        out.append(predicted)
        keys.append(key)
    return fold(one_per_setting(out, keys))


def _naming(knob: str, settings: Settings) -> str:
    """An advised knob naming the one setting it was priced and advised as: the knobs' texts name every
    setting of a kind (``--wrap merge:2, or root``), of which whatif stands behind only the one it
    predicted (another may be within the spread, or slower)."""
    flags = settings.flags()
    if not flags:
        return knob
    return re.sub(r"\(fsdpviz whatif --[^)]*\)", lambda _: f"(fsdpviz whatif {flags})", knob, count=1)


def _change(model: Model, settings: Settings) -> Gain:
    """(predicted change in ms, its words, its code, the recording's spread, why the replay is
    unreliable or "", why the model predicts no change where it knows, or cannot predict one, the
    predicted peak) of ``settings``."""
    try:
        p = predict(model, settings)
    except FsdpvizError as exc:  # unknown, not zero: not advised, and the action says why
        return None, "", None, None, "", f"fsdpviz whatif cannot predict it ({exc})", None
    code = p.apply.code if p.apply is not None else None
    whose = "this setting's prediction" if p.parts_over_pct is not None else "its replay of this recording"
    unreliable = "" if p.reliable else (
        f"fsdpviz whatif calls {whose} unreliable ({p.warnings[0]})" if p.warnings
        else f"fsdpviz whatif calls {whose} unreliable")
    because = next((n for n in PREFETCH_SAME_NOTES if n in p.notes), "")
    return (p.predicted.step_time_ms - p.baseline.step_time_ms, prediction_words(p), code, p.spread_ms,
            unreliable, because, p.predicted.peak_allocated_bytes)



def predicted_actions(run: RunResult, actions: Sequence[Action] | None = None, *,
                      model: Model | None = None) -> list[Action]:
    """``actions`` (default: the run's, ``Summary.actions``) with their knobs predicted on ``model``
    (default: the run read on a few of its ranks, :func:`summary_model`); as they
    are where the recording cannot be read for prediction (no units, another framework)."""
    actions = run.summary.actions if actions is None else actions
    if not any(a.knob for a in actions) or not run.has_units:
        return list(actions)
    if model is None:
        model, _ = summary_model(run)
    return list(actions) if model is None else predict_actions(model, actions)




_MODEL_MEMO = "whatif.summary_model"
# RunResult.memo's name of the completed summary; fsdpviz.cache puts a cached one there, so that every
# view of the result reads it instead of replaying the recording and pricing its actions again
SUMMARY_MEMO = "whatif.completed_summary"


def summary_model(run: RunResult) -> tuple[Model | None, str]:
    """The run's one model (:func:`fsdpviz.replay.model.model_ranks`: every rank up to
    ``MODEL_RANKS``, else that many spread over the run), or None and why not; read once per result
    (``RunResult.memo``), whichever views of it ask: the summary's actions, ``whatif`` and the report
    read the same ranks, and ``clock.ranks`` names them."""
    if _MODEL_MEMO not in run.memo:
        run.memo[_MODEL_MEMO] = _read_summary_model(run)
    return cast("tuple[Model | None, str]", run.memo[_MODEL_MEMO])


def clock_notes(run: RunResult) -> list[str]:
    """What the run's summary says of its own clock that holds for every prediction read off it (an old
    recording's clean steps that timed every unit): the notes ``whatif`` adds to its own, in every view."""
    from fsdpviz.structure.records import CLEAN_STEPS_UNIT_TIMED

    return [n for n in run.summary.notes if n.code == CLEAN_STEPS_UNIT_TIMED]


def on_replay_split(run: RunResult) -> RunResult:
    """``run`` with its bound the replay's split where it is to be (a GPU run whose step is the timers'):
    its model read (:func:`summary_model`, which adopts the split) unless it was, or the summary cache
    gave the completed summary; what a view calls before it reads the run's figures
    (``RunResult.summary``, ``RunResult.analysis``) without the completed summary."""
    bound = run.bound_split
    if (bound is not None and bound.device == OVERLAP_GPU and bound.deprofiled_by == BY_RULE
            and _MODEL_MEMO not in run.memo and SUMMARY_MEMO not in run.memo):
        summary_model(run)
    return run


def _read_summary_model(run: RunResult) -> tuple[Model | None, str]:
    model: Model | None = None
    why = "no FSDP units: nothing to replay"
    if run.has_units:
        try:
            model, why = read_model(run, ranks=model_ranks(run.analysis.ranks)), ""
        except FsdpvizError as exc:
            why = str(exc)
    # the run's bound is the replay's split from here on, for every view (replay/split.py)
    split.adopt(run, model, why)
    return model, why


def completed_summary(run: RunResult) -> Summary:
    """``run``'s summary with its actions' knobs predicted and its clock, computed once per result
    (``RunResult.memo``) on the one model read (:func:`summary_model`)."""
    if SUMMARY_MEMO not in run.memo:
        model, why_not = summary_model(run)
        run.memo[SUMMARY_MEMO] = msgspec.structs.replace(
            run.summary, actions=predicted_actions(run, model=model),
            clock=clock_of(run, None if model is None else model_clock(model), why_not))
    summary = run.memo[SUMMARY_MEMO]
    assert isinstance(summary, Summary)
    return summary
