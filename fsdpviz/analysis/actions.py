"""Findings a person reads in ten seconds: the bound first, alike findings as one line, at most
:data:`MAX_SHOWN` actions, the rest folded (but the profiler's action past ``HIGH_SLOWDOWN``).

A run of 8 units whose all-gathers all outlast the compute before them has 16 findings that say the
same thing (one per unit and pass). The user needs one line: "all-gathers outlast the previous
unit's compute in 16 unit-passes: 54-68 ms each, 1,030 ms/step". So:

- findings of one kind and cause (analysis/findings.py ``CAUSE_*``) become one :class:`Action` with
  the range of their losses and its total;
- the step's bound (analysis/bound.py) comes first where something other than compute takes a
  notable share of the step (:data:`NOTABLE_LOSS`), with the knob of that bound;
- a knob that cannot help on this run is said so instead of advised (prefetch cannot hide gloo's
  collectives on a GPU: the host backend runs them synchronously, see :func:`knob_blocked`); a knob
  whose predicted gain is nothing is not advised either (fsdpviz/whatif/gains.py fills the
  predictions where the recording can be simulated).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Final

import msgspec

from fsdpviz import vocabulary
from fsdpviz.analysis import findings as fnd
from fsdpviz.analysis.bound import (
    KIND_COMMUNICATION,
    KIND_HOST,
    KIND_IDLE,
    KIND_MEMORY,
    KIND_MIXED,
    MEMORY_MARGIN,
    BoundSummary,
)
from fsdpviz.analysis.units import UnitSummary
from fsdpviz.formatting import ms_text
from fsdpviz.naming import ROOT_UNIT
from fsdpviz.runfolder import RunInfo
from fsdpviz.structure.records import Finding
from fsdpviz.trace import schema

MAX_SHOWN: Final = 5
# A bound's loss below this share of the step is not worth an action of its own.
NOTABLE_LOSS: Final = 0.05
# A predicted change smaller than this (ms per step, or a gain) is no gain.
NO_GAIN_MS: Final = 0.005

KIND_BOUND: Final = "bound"

KNOB_HOST: Final = ("fewer or larger units (fsdpviz whatif --wrap merge:2, or root), torch.compile or CUDA graphs "
                    "(fewer launches per unit), a larger micro-batch (more work per launch)")
# a CPU rank launches nothing: only the per-unit hooks and copies are left to cut
KNOB_HOST_CPU: Final = "fewer or larger units (fsdpviz whatif --wrap merge:2, or root): fewer hooks and copies"
# a CPU rank waits out every collective FSDP issues (analysis/overlap.py), so an earlier gather hides
# nothing there: fewer, larger collectives are what moves its exposed communication
KNOB_COMMUNICATION_CPU: Final = ("fewer or larger units (fsdpviz whatif --wrap merge:2, or root): fewer collectives, "
                                 "each waited out by the training thread; prefetch cannot hide them on a CPU rank")
KNOB_COMMUNICATION: Final = ("prefetch earlier (fsdpviz whatif --prefetch 1, or 2 on FSDP2), fewer ranks per node "
                             "sharing a link, a faster link")
KNOB_MEMORY: Final = ("the advisor: fsdpviz whatif RUN --explore --memory-budget {budget} ranks the settings "
                      "whose predicted peak fits the device by predicted step time")
CPU_BLOCKS: Final = ("prefetch cannot help on a CPU rank: FSDP's training thread waits out every gloo collective "
                     "it issues, a prefetched one too, so nothing computes while it runs")  # FSDP2 and FSDP1
HOST_BACKEND_BLOCKS: Final = ("prefetch cannot help on this run: the gloo backend runs each collective of CUDA "
                              "tensors synchronously through the host, so nothing computes while it runs; NCCL "
                              "would let prefetched gathers overlap compute")

# The words of a group of alike findings: (what happened, in how many unit-passes).
_GROUP_WORDS: Final = {
    fnd.CAUSE_OUTLASTS_COMPUTE: "all-gathers outlast the previous unit's compute (prefetched)",
    fnd.CAUSE_NOT_PREFETCHED: "all-gathers issued only after the previous unit finished computing (not prefetched)",
    fnd.CAUSE_STARTED_LATE: "all-gathers started only after the previous unit finished computing",
    fnd.CAUSE_REGATHERED: "backward re-gathers parameters resharded after forward",
    fnd.CAUSE_FIRST_GATHER: "the first all-gathers of the forward pass have no compute to hide behind",
    fnd.CAUSE_FIRST_COMPUTE: "the first units to compute in the forward pass wait for their gathers",
    fnd.CAUSE_NOTHING_LEFT: "reductions with no compute left to hide behind",
    fnd.CAUSE_OUTLASTS_AFTER: "reductions outlast the compute that runs after them",
    fnd.CAUSE_WAITED_OUT: "reductions the training thread waits out (a CPU rank computes nothing while they run)",
}

# The collectives a reduction group is about: an HSDP run has both, whose groups would read alike.
_REDUCTIONS: Final = {"exposed_reduce_scatter": "reduce-scatters", "exposed_all_reduce": "HSDP all-reduces"}
# How many unit-passes a group's line names before it counts the rest.
_NAMED_PASSES: Final = 3


def _group_words(kind: str, cause: str, fallback: str) -> str:
    """What happened in a group of alike findings, naming the collectives of a reduction group."""
    words = _GROUP_WORDS.get(cause, fallback)
    return _REDUCTIONS[kind] + words.removeprefix("reductions") if words.startswith("reductions") and kind in _REDUCTIONS \
        else words


def _passes_text(where: Sequence[str]) -> str:
    """`` (blocks.0 backward, blocks.1 backward)``: the unit-passes a group names, the first few and a count."""
    named = [w for w in where if w]
    if not named:
        return ""
    rest = len(named) - _NAMED_PASSES
    return f" ({', '.join(named[:_NAMED_PASSES])}{f' and {rest} more' if rest > 0 else ''})"


class Action(msgspec.Struct, kw_only=True):
    """One line of advice: the bound, or alike findings grouped (``summary --json`` ``actions``)."""

    kind: str
    """``bound``, or the findings' kind (``exposed_all_gather``, ``exposed_reduce_scatter``, ...)."""
    cause: str
    """The bound's loss (``host`` / ``communication`` / ``idle``), or the findings' cause."""
    message: str
    count: int
    """Findings in it (unit-passes, ranks); 1 for the bound, and the findings of the groups merged into it
    (they lead to its setting: :func:`one_per_setting`)."""
    lost_ms_per_step: float | None
    """The time lost per step: the findings' total, or the bound's part."""
    lost_ms_min: float | None = None
    lost_ms_max: float | None = None
    """The range of the findings' losses (None for the bound)."""
    knob: str = ""
    """What to try; "" where nothing is advised (``why_not`` says why, where a knob was considered)."""
    predicted_gain: str = ""
    """The predicted effect of the knob (fsdpviz whatif), in words; "" where not predicted."""
    predicted_change_ms: float | None = None
    """The predicted change of the step (negative: faster); None where not predicted."""
    why_not: str = ""
    """Why a knob the findings suggest is not advised here."""
    units: list[str] = msgspec.field(default_factory=list)
    """The unit-passes (``"blocks.3 forward"``) or ranks the findings name."""
    folded: bool = False
    """Beyond the first :data:`MAX_SHOWN` actions."""
    apply_code: str | None = None
    """The advised setting as code for the recorded architecture (``fsdpviz whatif ... --code``), where
    a knob is advised and whatif writes one (whatif/apply.py)."""


def waits_out_collectives(device: str | None, framework: str) -> bool:
    """Whether the run's training thread waits out every collective its framework issues: FSDP2 and
    FSDP1 on a CPU rank (analysis/overlap.py). DeepSpeed issues its prefetched gathers asynchronously,
    so its CPU ranks do compute beside some (the committed ZeRO-3 example hides 5.7 %)."""
    return device == schema.OVERLAP_CPU and framework != vocabulary.ZERO3


def knob_blocked(knob: str, host_backend_on_gpu: bool, waits_out: bool = False) -> str:
    """Why ``knob`` cannot help on this run ("" where it may): prefetch, where the thread waits out every
    collective (:func:`waits_out_collectives`, gloo on CUDA tensors)."""
    if "prefetch" not in knob:
        return ""
    if waits_out:
        return CPU_BLOCKS
    return HOST_BACKEND_BLOCKS if host_backend_on_gpu else ""


def full_bucket(run: RunInfo | None) -> str:
    """Why no larger ZeRO-3 prefetch bucket fetches earlier ("" where one may): the recorded
    ``stage3_prefetch_bucket_size`` (run.json's units) already holds every unit's parameters, as
    DeepSpeed's default of 50,000,000 elements does on a model smaller than that."""
    if run is None or run.framework != vocabulary.ZERO3:
        return ""
    buckets = [u.forward_prefetch for u in run.units
               if isinstance(u.forward_prefetch, int) and not isinstance(u.forward_prefetch, bool)]
    total = sum(max(u.param_numel, 0) for u in run.units)
    if not buckets or not total or buckets[0] < total:
        return ""
    return (f"the recorded stage3_prefetch_bucket_size ({buckets[0]:,} elements) already holds every unit's parameters "
            f"({total:,} elements): a larger bucket fetches nothing earlier")


def _range_text(values: Sequence[float]) -> str:
    lo, hi = min(values), max(values)
    return ms_text(lo) if ms_text(lo) == ms_text(hi) else f"{ms_text(lo).removesuffix(' ms')}-{ms_text(hi)}"


def group_findings(findings: Sequence[Finding], *, host_backend_on_gpu: bool = False,
                   waits_out: bool = False) -> list[Action]:
    """Alike findings (one kind and cause) as one action each; the profiler's finding is about the
    trace, not the run, and stays its own line. ``waits_out``: :func:`waits_out_collectives`."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        key = (f.kind, f.cause) if f.cause and f.cause in _GROUP_WORDS else (f.kind, f"{f.cause}#{len(groups)}")
        groups.setdefault(key, []).append(f)
    out = []
    for (kind, cause), members in groups.items():
        lost = [f.lost_ms_per_step for f in members if f.lost_ms_per_step is not None]
        # one figure for the action's loss: its message and its lost_ms_per_step print the same number
        total = round(sum(lost), 3) if lost else None
        knobs = list(dict.fromkeys(f.knob for f in members if f.knob))
        where = [f"{f.unit} {f.phase}".strip() if f.unit else (f"rank {f.rank}" if f.rank >= 0 else "")
                 for f in members]
        if len(members) == 1:
            message = members[0].message
        else:
            words = _group_words(kind, cause, members[0].message)
            message = (f"{words} in {len(members)} unit-passes: {_range_text(lost)} each, {ms_text(total)}/step"
                       if total is not None else f"{words} in {len(members)} unit-passes") + _passes_text(where)
        knob = knobs[0] if len(knobs) == 1 else "; ".join(knobs)
        why_not = (knob_blocked(knob, host_backend_on_gpu, waits_out) if knob  # each pass's own reason, once
                   else _joined_reasons(f.why_not for f in members if f.why_not))
        out.append(Action(kind=kind, cause=cause.split("#")[0], message=message, count=len(members),
                          lost_ms_per_step=total,
                          lost_ms_min=min(lost) if lost else None, lost_ms_max=max(lost) if lost else None,
                          knob="" if why_not else knob, why_not=why_not, units=[w for w in where if w]))
    return out


def _joined_reasons(reasons: Iterable[str]) -> str:
    """Distinct reasons in one sentence, those that open alike ("no deeper prefetch hides it: the forward
    pass ...", "... : the backward pass ...") said once with their particulars after it."""
    heads: dict[str, list[str]] = {}
    for reason in dict.fromkeys(reasons):
        head, sep, tail = reason.partition(": ")
        heads.setdefault(head if sep else reason, []).append(tail if sep else "")
    return "; ".join(f"{head}: {'; '.join(t for t in tails if t)}" if any(tails) else head
                     for head, tails in heads.items())


def _per_unit_text(units: Sequence[UnitSummary]) -> str:
    """``; per unit, compute 2.50-9.96 ms against 115.89-143.60 ms of all-gather per step`` (the units'
    medians per step, forward and backward each; the root, which holds what no block does, left out),
    "" without units that gather."""
    inner = [u for u in units if u.name != ROOT_UNIT] or list(units)
    compute = [v for u in inner for v in (u.forward_ms, u.backward_ms) if v]
    gathers = [u.all_gather_ms for u in inner if u.all_gather_ms]
    if not compute or not gathers:
        return ""
    return f"; per unit, compute {_range_text(compute)} against {_range_text(gathers)} of all-gather per step"


def budget_text(size_bytes: int) -> str:
    """A ``--memory-budget`` value that is at most ``size_bytes`` (``79GiB``, ``1536MiB``)."""
    gib, mib = size_bytes // (1 << 30), size_bytes // (1 << 20)
    return f"{gib}GiB" if gib >= 8 else f"{mib}MiB"


def memory_action(bound: BoundSummary | None) -> Action | None:
    """A memory-bound run's first action (its peak within :data:`~fsdpviz.analysis.bound.MEMORY_MARGIN`
    of the device's memory): the advisor, with the device's memory as the budget."""
    if bound is None or bound.kind != KIND_MEMORY or not bound.peak_allocated_bytes or not bound.device_memory_bytes:
        return None
    peak, device = bound.peak_allocated_bytes, bound.device_memory_bytes
    message = (f"memory-bound: the peak of allocated memory is {peak / (1 << 30):,.1f} GiB of the device's "
               f"{device / (1 << 30):,.1f} GiB ({100 * peak / device:.0f} %, within {100 * MEMORY_MARGIN:.0f} %): "
               "a setting that holds more (larger units, no resharding, deeper prefetch, a larger micro-batch) "
               "may not fit")
    return Action(kind=KIND_BOUND, cause=KIND_MEMORY, message=message, count=1, lost_ms_per_step=None,
                  knob=KNOB_MEMORY.format(budget=budget_text(device)))


def bound_action(bound: BoundSummary | None, *, host_backend_on_gpu: bool = False,
                 units: Sequence[UnitSummary] = (), framework: str = "") -> Action | None:
    """The step's largest loss as the first action, where it takes :data:`NOTABLE_LOSS` of the step."""
    if bound is None or bound.loss is None or bound.loss.share < NOTABLE_LOSS:
        return None
    loss, pct = bound.loss, f"{100 * bound.loss.share:.0f} %"
    step = f"the {ms_text(bound.step_ms)} {'unprofiled ' if bound.basis == 'unprofiled' else ''}step"
    kind = bound.time_kind or bound.kind if bound.kind == KIND_MEMORY else bound.kind
    head = (f"{kind}-bound" if kind != KIND_MIXED else "no single bound") + ": "
    if kind != loss.kind:
        head += f"compute {ms_text(bound.compute_ms)} of {step}; the largest loss: "
        step = "the step"
    knob, why_not = "", ""
    if loss.kind == KIND_HOST and bound.device == schema.OVERLAP_CPU:
        message = (f"{head}the training thread runs FSDP's per-unit work (hooks, copy-in and copy-out) "
                   f"{ms_text(loss.ms)} of {step} ({pct})")
        knob = KNOB_HOST_CPU
    elif loss.kind == KIND_HOST:
        message = (f"{head}the host side takes {ms_text(loss.ms)} of {step} ({pct}, launch-bound): FSDP's "
                   f"per-unit work {ms_text(bound.fsdp_overhead_ms)} (its copy kernels "
                   f"{ms_text(bound.fsdp_kernels_ms or 0.0)}, the GPU waiting while its hooks ran "
                   f"{ms_text(bound.fsdp_overhead_ms - (bound.fsdp_kernels_ms or 0.0))}) and the GPU waiting for "
                   f"the model's launches {ms_text(bound.host_wait_ms or 0.0)}")
        knob = KNOB_HOST
    elif loss.kind == KIND_COMMUNICATION:
        message = f"{head}exposed communication {ms_text(loss.ms)} of {step} ({pct})"
        if kind == loss.kind:
            message += f"; compute {ms_text(bound.compute_ms)}"
        message += _per_unit_text(units)
        knob = KNOB_COMMUNICATION_CPU if waits_out_collectives(bound.device, framework) else KNOB_COMMUNICATION
        if host_backend_on_gpu:
            why_not = HOST_BACKEND_BLOCKS
            knob = "NCCL instead of gloo for GPU tensors, fewer ranks per node sharing a link, a faster link"
    elif loss.kind == KIND_IDLE and bound.device == schema.OVERLAP_CPU:
        # a CPU rank's other idle: the compute thread between traced ops (analysis/bound.py)
        message = (f"{head}the compute thread runs no traced op {ms_text(loss.ms)} of {step} ({pct}): Python "
                   "between ops, the data loader, or waits the trace does not name (on gloo's threads, a "
                   "synchronisation)")
    elif loss.kind == KIND_IDLE:
        message = (f"{head}the GPU idles {ms_text(loss.ms)} of {step} ({pct}) with its next work already launched: "
                   "waits on events (another stream, a host-side collective, a synchronisation)")
    else:
        return None
    return Action(kind=KIND_BOUND, cause=loss.kind, message=message, count=1, lost_ms_per_step=loss.ms,
                  knob=knob, why_not=why_not)


def build_actions(findings: Sequence[Finding], bound: BoundSummary | None, *,
                  host_backend_on_gpu: bool = False, units: Sequence[UnitSummary] = (),
                  framework: str = "") -> list[Action]:
    """The bound's action, then the grouped findings by time lost; all beyond :data:`MAX_SHOWN` folded."""
    grouped = group_findings(findings, host_backend_on_gpu=host_backend_on_gpu,
                             waits_out=bound is not None and waits_out_collectives(bound.device, framework))
    first = [a for a in (memory_action(bound), bound_action(bound, host_backend_on_gpu=host_backend_on_gpu,
                                                                 units=units, framework=framework)) if a is not None]
    return fold([*first, *grouped])


def fold(actions: Sequence[Action]) -> list[Action]:
    """Advised actions first (a knob to try), then the others, each by time lost; everything after the
    first :data:`MAX_SHOWN` folded. The bound's action keeps the first place, the profiler's share the
    last: the run itself does not lose it (as the findings list it); past ``HIGH_SLOWDOWN`` it is a caveat
    on every figure above it and is never folded."""
    head = [a for a in actions if a.kind == KIND_BOUND]
    rest = sorted((a for a in actions if a.kind != KIND_BOUND), key=lambda a: -(a.lost_ms_per_step or 0.0))
    own = [a for a in rest if a.cause != fnd.CAUSE_PROFILER]
    ordered = head + [a for a in own if a.knob] + [a for a in own if not a.knob] + [
        a for a in rest if a.cause == fnd.CAUSE_PROFILER]
    return [msgspec.structs.replace(a, folded=i >= MAX_SHOWN and not (
        a.cause == fnd.CAUSE_PROFILER and fnd.LARGELY_PROFILERS in a.message)) for i, a in enumerate(ordered)]


def with_prediction(action: Action, change_ms: float | None, words: str, *, spread_ms: float | None = None,
                    unreliable: str = "", because: str = "", spread_unknown: str = "") -> Action:
    """``action`` with the predicted effect of its knob, advised by whatif's own rules (``--explore``'s):
    not when it is predicted to gain nothing, not when the replay behind it is unreliable
    (``unreliable``: why), not when the gain is within the recording's step-to-step spread
    (``spread_ms``), nor where that spread is unknown (``spread_unknown``: why, with ``spread_ms`` None);
    ``why_not`` says which (``because``: why the model predicts no gain, where known).
    ``change_ms`` None with ``because``: the model cannot predict the setting's effect (unknown, not
    zero), so it is not advised, and ``because`` says why; None without: not predicted, left as it is."""
    if change_ms is None:
        if because:
            return msgspec.structs.replace(action, knob="", predicted_gain="", predicted_change_ms=None,
                                           why_not=action.why_not or f"not advised: {because}")
        return action
    said = words.removeprefix("predicted ")
    why = ""
    # in whatif's own order: an unreliable replay says nothing; a change within the spread is not
    # measurable in this recording, whichever its sign; beyond it, a slower step is no gain
    if unreliable:
        why = f"not advised: {unreliable} ({said})"
    elif spread_ms is None and spread_unknown:
        why = f"not advised: {spread_unknown} ({said})"
    elif spread_ms is not None and abs(change_ms) <= spread_ms:
        # the figure first, then why it is not read as a change: a large predicted move beside "no change"
        # would read as a contradiction
        why = (f"not advised: fsdpviz whatif predicts {said}, within the recording's {spread_ms:.2f} ms "
               f"step-to-step spread: not measurable in this recording") + (f" ({because})" if because else "")
    elif change_ms > -NO_GAIN_MS:
        why = f"not advised: fsdpviz whatif predicts no gain ({said})" + (f": {because}" if because else "")
    if why:
        return msgspec.structs.replace(action, knob="", predicted_gain=words, predicted_change_ms=round(change_ms, 3),
                                       why_not=action.why_not or why)
    return msgspec.structs.replace(action, predicted_gain=words, predicted_change_ms=round(change_ms, 3))


def one_per_setting(actions: Sequence[Action], setting_of: Sequence[str | None]) -> list[Action]:
    """``actions`` with those whose knob leads to one setting (``setting_of``: each action's, None for
    none) made one: the first keeps its place and its words, and takes the others' words, units, count
    and losses. Findings' groups hold other unit-passes, so their losses add up; the bound's loss is a
    part of the step that already holds what findings lose there, so it stays as it is."""
    out: list[Action] = []
    first: dict[str, int] = {}
    for action, key in zip(actions, setting_of, strict=True):
        if key is None or key not in first:
            if key is not None:
                first[key] = len(out)
            out.append(action)
            continue
        kept = out[first[key]]
        merged = msgspec.structs.replace(
            kept, message=f"{kept.message.rstrip('.')}; {action.message}", count=kept.count + action.count,
            units=list(dict.fromkeys([*kept.units, *action.units])))
        if kept.kind != KIND_BOUND:  # a group's unknown loss leaves the total unknown, not smaller
            total = _known(kept.lost_ms_per_step, action.lost_ms_per_step)
            lows = _known(kept.lost_ms_min, action.lost_ms_min) if total else None
            highs = _known(kept.lost_ms_max, action.lost_ms_max) if total else None
            merged = msgspec.structs.replace(merged, lost_ms_per_step=round(sum(total), 3) if total else None,
                                             lost_ms_min=min(lows) if lows else None,
                                             lost_ms_max=max(highs) if highs else None)
        out[first[key]] = merged
    return out


def _known(*values: float | None) -> list[float] | None:
    """``values`` where every one is known; None where one is not."""
    return None if any(v is None for v in values) else [v for v in values if v is not None]


def action_text(action: Action, said: Collection[str] = ()) -> str:
    """The one line a person reads: the loss, what to try and what it gains, or why nothing is advised.
    ``said``: the reasons (``why_not``) lines read before this one gave in full; one of them is given by
    its opening clause only, "(as above)"."""
    text = action.message.rstrip(".") + "."
    if action.knob:
        text += f" Try: {action.knob}."
        if action.predicted_gain:
            text += f" {action.predicted_gain[0].upper()}{action.predicted_gain[1:]}."
    if action.why_not:
        why = f"{action.why_not.split(': ', 1)[0]} (as above)" if action.why_not in said else action.why_not
        text += f" {why[0].upper()}{why[1:]}."
    return text


def action_texts(actions: Sequence[Action]) -> list[str]:
    """:func:`action_text` of each action, in order, each reason why nothing is advised given in full
    once: on a CPU rank two actions about gathers both end with why prefetch cannot help, and the
    second says so in its opening clause."""
    said: set[str] = set()
    out = []
    for action in actions:
        out.append(action_text(action, said))
        if action.why_not:
            said.add(action.why_not)
    return out
