"""Read FSDP unit labels out of trace annotations: which unit, which action, which pass.

Two label families name units:

- FSDP2 writes its own ``record_function`` ranges (present in any FSDP2 trace, recorded by fsdpviz
  or not): ``FSDP::pre_forward (blocks.3)``, ``FSDP::all_gather (blocks.3)``,
  ``FSDP::forward_prefetch for blocks.4``, ``FSDP::post_backward_reduce (blocks.3) [pg=2]``... The
  root unit's labels carry no name (``FSDP::pre_forward``); ``FSDP::post_backward_rs_wait ()`` is
  the root's wait.
- For FSDP1 and ZeRO-3, which name no units, ``fsdpviz record`` adds ranges in its own namespace:
  ``fsdpviz::forward (fqn)``, ``fsdpviz::backward (fqn)``, ``fsdpviz::all_gather (fqn)``,
  ``fsdpviz::reduce_scatter (fqn)`` (``(root)`` for the root module); for ZeRO-3 also
  ``fsdpviz::fetch (fqn)`` / ``fsdpviz::release (fqn)`` (DeepSpeed's parameter fetch and release for
  a module: framework work inside the unit's window) and the unit-less ``fsdpviz::engine_forward``,
  ``fsdpviz::engine_backward``, ``fsdpviz::engine_step`` around DeepSpeed's engine calls.

FSDP1's own ``FullyShardedDataParallel._pre_forward``-style ranges carry no unit but are framework
work (unshard, waits, resharding), so the analysis keeps them out of a unit's compute; so are the
autograd functions through which DeepSpeed, module backward hooks and FSDP2's post-backward run
(``PreBackwardFunctionForModule``, ``PostBackwardFunctionModule``, ``BackwardHookFunction``,
FSDP2's ``RegisterPostBackwardFunction`` and their ``...Backward`` nodes), which appear as CPU ops:
FSDP2's node holds, beside its ``FSDP::post_backward_*`` labels, the dispatch of the hook at each unit
boundary, which a merged unit does not run.

**Passes.** A step may run several forward and backward passes of the whole model (gradient
accumulation: one per micro-batch, then one optimizer step). A new pass starts where the model's
forward starts again after a backward: FSDP2's ``FSDP::root_pre_forward``, fsdpviz's
``fsdpviz::engine_forward`` or ``fsdpviz::forward ((root))`` -- only after some backward label of
the step, and never inside a backward range (those would be recomputation). Each label gets the
index of its pass in the step (``micro``). Forward labels after the first backward label *of their
pass* are activation-checkpoint recomputation, which runs inside backward: they count as backward.

Names repeat thousands of times, so each distinct name is parsed once and the result mapped onto
the rows through the categorical codes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.naming import ROOT_UNIT, clean_fqn, unit_from_label
from fsdpviz.structure.categorical import as_str
from fsdpviz.trace import schema
from fsdpviz.trace.unit_names import FSDP2_LABEL_RE, FSDP2_PREFETCH_RE

ROOT: Final = ROOT_UNIT  # the root unit's name (its FSDP2 labels are bare)

FAMILY_FSDP2: Final = "fsdp2"
FAMILY_FSDPVIZ: Final = "fsdpviz"
FAMILY_FSDP1: Final = "fsdp1"
FAMILY_HOOKS: Final = "hooks"  # framework hook autograd functions (CPU ops)

_FSDP2_RE: Final = FSDP2_LABEL_RE
_FSDP2_PREFETCH_RE: Final = FSDP2_PREFETCH_RE
_FSDPVIZ_RE: Final = re.compile(r"^fsdpviz::(?P<action>\w+)(?: \((?P<fqn>.*)\))?$")
_FSDP1_PREFIX: Final = "FullyShardedDataParallel."
_HOOK_FUNCTIONS: Final = ("PreBackwardFunctionForModule", "PostBackwardFunctionModule", "BackwardHookFunction")
# FSDP2's: the op itself, not the engine's ``evaluate_function`` range around its backward, which also
# adds the node's output gradients into a shared input's buffer (model work where the unit's input
# feeds more than the unit)
_FSDP2_HOOK_OPS: Final = ("RegisterPostBackwardFunction",)
_AUTOGRAD_NODE: Final = "autograd::engine::evaluate_function: "
_FSDP1_MODULE_FORWARD: Final = "FullyShardedDataParallel.forward"

# Actions that open / close a unit's window, per family and pass.
PRE_FORWARD: Final = "pre_forward"
POST_FORWARD: Final = "post_forward"
PRE_BACKWARD: Final = "pre_backward"
POST_BACKWARD_ACTIONS: Final = frozenset(
    {"post_backward_accumulate", "post_backward_reshard", "post_backward_rs_wait", "post_backward_reduce"}
)
ROOT_POST_BACKWARD: Final = "root_post_backward_callback"
GATHER_ACTION: Final = "all_gather"
COPY_OUT_ACTION: Final = "all_gather_copy_out"
FSDP2_REDUCE_ACTION: Final = "post_backward_reduce"
FSDPVIZ_REDUCE_ACTION: Final = "reduce_scatter"
FETCH_ACTIONS: Final = frozenset({"fetch", "release"})  # ZeRO-3: DeepSpeed's per-module fetch / release
ENGINE_FORWARD: Final = "engine_forward"  # ZeRO-3: DeepSpeed's engine calls (name no unit)
ENGINE_BACKWARD: Final = "engine_backward"
ENGINE_STEP: Final = "engine_step"
ENGINE_ACTIONS: Final = frozenset({ENGINE_FORWARD, ENGINE_BACKWARD, ENGINE_STEP})
RESHARD_ACTIONS: Final = {POST_FORWARD: vocabulary.FORWARD, "post_backward_reshard": vocabulary.BACKWARD}

# The pass a label belongs to, when it says so itself.
_FORWARD_ACTIONS: Final = frozenset(
    {"root_pre_forward", PRE_FORWARD, POST_FORWARD, "forward_prefetch", "forward", ENGINE_FORWARD})
_BACKWARD_ACTIONS: Final = frozenset(
    {PRE_BACKWARD, "backward_prefetch", ROOT_POST_BACKWARD, "backward", ENGINE_BACKWARD} | POST_BACKWARD_ACTIONS
)

LABELS: Final[schema.Schema] = {
    "rank": "int32",
    "lane": "string",
    "step": "int32",
    "start_ns": "int64",
    "end_ns": "int64",
    "family": "string",  # fsdp2 / fsdpviz / fsdp1
    "action": "string",  # pre_forward, all_gather, forward_prefetch, forward, ... ("" for fsdp1)
    "unit": "string",  # the unit the label names (prefetch: its target); "" when none
    "phase": "string",  # forward / backward when the label implies it, else ""
    "micro": "int32",  # the pass of the step it belongs to (micro-batch under gradient accumulation)
}
PASS_STARTS: Final[schema.Schema] = {"rank": "int32", "step": "int32", "start_ns": "int64"}


@dataclass(frozen=True, slots=True)
class LabelInfo:
    """What one label name says."""

    family: str
    action: str
    unit: str
    phase: str


def _unit_name(fqn: str | None) -> str:
    fqn = (fqn or "").strip()
    return ROOT if fqn in ("", ROOT) else clean_fqn(fqn)


def _phase_of(action: str) -> str:
    if action in _FORWARD_ACTIONS:
        return vocabulary.FORWARD
    if action in _BACKWARD_ACTIONS:
        return vocabulary.BACKWARD
    return ""


def listed_units(label_unit: str) -> list[str]:
    """The units an fsdpviz label lists (a ZeRO-3 bucket: ``blocks.0, blocks.1`` -> ``blocks.0``,
    ``blocks.1``); one unit gives itself."""
    return [part.strip() for part in label_unit.split(",")]


def parse_label_name(name: str) -> LabelInfo | None:
    """Parse one annotation name; None when it is not an FSDP / fsdpviz label."""
    if name.startswith("FSDP::"):
        match = _FSDP2_PREFETCH_RE.match(name) or _FSDP2_RE.match(name)
        if match is None:
            return None
        action = match.group("action")
        # Labels that do not name a unit (root_pre_forward, inputs_to_device, ...) keep unit "".
        names_unit = action not in ("root_pre_forward", ROOT_POST_BACKWARD, "inputs_to_device",
                                    "cast_forward_inputs", "cast_forward_outputs")
        fqn = (match.group("fqn") or "").strip()
        unit = (unit_from_label(fqn) if fqn else ROOT) if names_unit else ""
        return LabelInfo(FAMILY_FSDP2, action, unit, _phase_of(action))
    if name.startswith("fsdpviz::"):
        match = _FSDPVIZ_RE.match(name)
        if match is None:
            return None
        action = match.group("action")
        unit = "" if action in ENGINE_ACTIONS else _unit_name(match.group("fqn"))
        return LabelInfo(FAMILY_FSDPVIZ, action, unit, _phase_of(action))
    if name.startswith(_FSDP1_PREFIX) and name != _FSDP1_MODULE_FORWARD:
        return LabelInfo(FAMILY_FSDP1, "", "", "")
    return None


def parse_hook_op_name(name: str) -> LabelInfo | None:
    """A CPU op that is a framework hook's autograd function, else None."""
    base = name.removeprefix(_AUTOGRAD_NODE)
    if base.startswith(_HOOK_FUNCTIONS) or name.startswith(_FSDP2_HOOK_OPS):
        return LabelInfo(FAMILY_HOOKS, "", "", "")
    return None


@lru_cache(maxsize=1 << 16)
def _label_info(name: str) -> LabelInfo | None:
    """:func:`parse_label_name`, else :func:`parse_hook_op_name`: kept per name, since a run's labels are
    parsed more than once (the whole-step overlap per rank, the per-unit analysis, the replay) and every
    step repeats its names."""
    return parse_label_name(name) or parse_hook_op_name(name)


def parse_labels(events: pd.DataFrame) -> pd.DataFrame:
    """The LABELS table: every FSDP2 / fsdpviz / FSDP1 annotation of ``events`` (any ranks)."""
    kinds = events["kind"]
    ann = events[((kinds == schema.KIND_ANNOTATION) | (kinds == schema.KIND_CPU_OP)).to_numpy()]
    if ann.empty:
        return schema.make_empty(LABELS)
    names = ann["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        names = names.astype("category")
    cats = names.cat.categories
    # annotations are labels; of the CPU ops only the framework hook functions
    infos = [_label_info(str(c)) for c in cats.tolist()]
    hit = np.array([i is not None for i in infos], dtype=bool)
    codes = names.cat.codes.to_numpy()
    keep = (codes >= 0) & hit[np.clip(codes, 0, None)] if len(cats) else np.zeros(len(ann), bool)
    is_op = (ann["kind"] == schema.KIND_CPU_OP).to_numpy()
    families = np.array([i.family if i is not None else "" for i in infos], dtype=object)
    keep &= ~is_op | (families[np.clip(codes, 0, None)] == FAMILY_HOOKS)
    ann = ann[keep]
    codes = codes[keep]
    if ann.empty:
        return schema.make_empty(LABELS)

    def column(attr: str) -> np.ndarray:
        values = np.array([getattr(i, attr) if i is not None else "" for i in infos], dtype=object)
        return values[codes]

    start = ann["start_ns"].to_numpy(np.int64)
    frame = pd.DataFrame({
        "rank": ann["rank"].to_numpy(),
        "lane": as_str(ann["lane"]),
        "step": ann["step"].to_numpy(),
        "start_ns": start,
        "end_ns": start + ann["dur_ns"].to_numpy(np.int64),
        "family": column("family"),
        "action": column("action"),
        "unit": column("unit"),
        "phase": column("phase"),
    })
    frame = frame.sort_values(["rank", "lane", "start_ns", "end_ns"], ascending=[True, True, True, False],
                              kind="stable")
    return schema.conform(mark_recompute(frame.reset_index(drop=True)), LABELS, table="labels")


def pass_starts(labels: pd.DataFrame) -> pd.DataFrame:
    """PASS_STARTS: where each forward pass of the model after a step's first one begins.

    Candidates are the labels that open the model's forward (FSDP2's ``root_pre_forward``,
    fsdpviz's ``engine_forward`` and the root's ``fsdpviz::forward``); fsdpviz's candidates inside
    one of its backward ranges are recomputation, not a pass. A candidate opens a new pass when a
    backward label of the step started since the previous candidate (the root's forward inside
    ``engine_forward`` is the same pass) or, for the first candidate, since the step began. The
    step's first pass needs no start: whatever comes before the first start is pass 0.
    """
    # the string columns copied out once: compared as arrays, not as columns (a fixed cost per comparison)
    family, action = as_str(labels["family"]), as_str(labels["action"])
    fsdpviz_open = (family == FAMILY_FSDPVIZ) & ((action == ENGINE_FORWARD) | (
        (action == vocabulary.FORWARD) & (as_str(labels["unit"]) == ROOT)))
    is_cand = ((family == FAMILY_FSDP2) & (action == "root_pre_forward")) | fsdpviz_open
    if not is_cand.any():
        return schema.make_empty(PASS_STARTS)
    ranks = labels["rank"].to_numpy()
    steps = labels["step"].to_numpy()
    start = labels["start_ns"].to_numpy(np.int64)
    end = labels["end_ns"].to_numpy(np.int64)
    backward = as_str(labels["phase"]) == vocabulary.BACKWARD
    fsdpviz_bwd = backward & (family == FAMILY_FSDPVIZ) & ((action == vocabulary.BACKWARD) | (action == ENGINE_BACKWARD))
    rows: list[tuple[int, int, int]] = []
    groups = pd.DataFrame({"rank": ranks, "step": steps}).groupby(["rank", "step"], sort=False).indices
    for (rank, step), mine in groups.items():
        idx = mine[is_cand[mine]]
        if len(idx) == 0:
            continue
        idx = idx[np.argsort(start[idx], kind="stable")]
        b_start = np.sort(start[mine[backward[mine]]])
        bw = mine[fsdpviz_bwd[mine]]
        ranges_s, ranges_e = start[bw], end[bw]
        previous = np.iinfo(np.int64).min  # the step's first opening starts a pass if backward came before
        for i in idx.tolist():
            t = int(start[i])
            if fsdpviz_open[i] and ((ranges_s <= t) & (t < ranges_e)).any():
                continue  # the root's forward recomputed inside a backward
            if np.searchsorted(b_start, t, side="left") > np.searchsorted(b_start, previous, side="right"):
                rows.append((int(rank), int(step), t))
            previous = t
    frame = pd.DataFrame(rows, columns=list(PASS_STARTS))
    return schema.conform(frame, PASS_STARTS, table="pass starts")


def pass_index(starts: pd.DataFrame, ranks: np.ndarray | int, steps: np.ndarray,
               t: np.ndarray) -> np.ndarray:
    """The pass (``micro``) each point ``(rank, step, t)`` falls in: 0 before the step's second
    pass starts, 1 after it, ... (``starts``: :func:`pass_starts`)."""
    t = np.asarray(t, dtype=np.int64)
    out = np.zeros(len(t), dtype=np.int32)
    if starts.empty or len(t) == 0:
        return out
    ranks = np.broadcast_to(np.asarray(ranks), t.shape)
    steps = np.asarray(steps)
    point_groups = pd.DataFrame({"rank": ranks, "step": steps}).groupby(["rank", "step"], sort=False).indices
    by_group = {key: np.sort(rows["start_ns"].to_numpy(np.int64))
                for key, rows in starts.groupby(["rank", "step"], sort=False)}
    for key, idx in point_groups.items():
        s = by_group.get((int(key[0]), int(key[1])))
        if s is not None:
            out[idx] = np.searchsorted(s, t[idx], side="right")
    return out


def after_first_backward(labels: pd.DataFrame, ranks: np.ndarray | int, steps: np.ndarray,
                         micros: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Whether each point lies at or after the first backward label of its pass (rank, step, micro)."""
    t = np.asarray(t, dtype=np.int64)
    backward = as_str(labels["phase"]) == vocabulary.BACKWARD
    if not backward.any() or len(t) == 0:
        return np.zeros(len(t), dtype=bool)
    # each pass's first backward start, found by one sort of the passes' keys (the labels' and the
    # points') rather than a group-by and a reindex on a MultiIndex
    label_keys = np.stack([labels[c].to_numpy(np.int64)[backward] for c in ("rank", "step", "micro")], axis=1)
    point_keys = np.stack([np.broadcast_to(np.asarray(ranks), t.shape).astype(np.int64),
                           np.asarray(steps).astype(np.int64), np.asarray(micros).astype(np.int64)], axis=1)
    _, key_of = np.unique(np.concatenate([label_keys, point_keys]), axis=0, return_inverse=True)
    key_of = key_of.reshape(-1)
    none = np.iinfo(np.int64).max
    first = np.full(int(key_of.max()) + 1, none, dtype=np.int64)
    np.minimum.at(first, key_of[:len(label_keys)], labels["start_ns"].to_numpy(np.int64)[backward])
    mine = first[key_of[len(label_keys):]]
    return (mine != none) & (t >= mine)  # in int64: a float would round wall-clock nanoseconds to 256


def mark_recompute(labels: pd.DataFrame) -> pd.DataFrame:
    """Give each label its pass (``micro``, see the module docstring); forward labels after the
    first backward label of their pass are activation-checkpoint recomputation (FSDP2 runs
    ``pre_forward`` again inside backward, fsdpviz's module hooks see the recomputed forward):
    they belong to backward."""
    labels = labels.assign(micro=pass_index(pass_starts(labels), labels["rank"].to_numpy(),
                                            labels["step"].to_numpy(), labels["start_ns"].to_numpy()))
    forward = (labels["phase"] == vocabulary.FORWARD).to_numpy()
    if not forward.any():
        return labels
    late = forward & after_first_backward(labels, labels["rank"].to_numpy(), labels["step"].to_numpy(),
                                          labels["micro"].to_numpy(), labels["start_ns"].to_numpy())
    if late.any():
        labels.loc[late, "phase"] = vocabulary.BACKWARD
    return labels


def optimizer_own_starts(ranks: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                         labels: pd.DataFrame) -> np.ndarray:
    """Where each optimizer step range (``Optimizer.step#``: its ranks, starts and ends) begins its own
    work. A step given a closure (``optimizer.step(closure)``: Lightning's automatic optimization) runs
    the closure's forward and backward inside its range: its own work begins after the last unit label
    of a forward or backward that began inside it, and only in a range that holds a forward's label (a
    framework's step never runs a forward). Other ranges begin where they began. (An optimizer that
    calls its closure several times, LBFGS, has its work between the calls left to no part.)"""
    out = np.asarray(starts, dtype=np.int64).copy()
    if not len(out) or not len(labels):
        return out
    passes = labels[np.isin(labels["phase"].to_numpy(), (vocabulary.FORWARD, vocabulary.BACKWARD))
                    & (as_str(labels["unit"]) != "")]
    if not len(passes):
        return out
    rank_of = passes["rank"].to_numpy()
    begin = passes["start_ns"].to_numpy(np.int64)
    finish = passes["end_ns"].to_numpy(np.int64)
    forward = (passes["phase"] == vocabulary.FORWARD).to_numpy()
    for i, (rank, lo, hi) in enumerate(zip(ranks, out, ends)):
        inside = (rank_of == rank) & (begin >= lo) & (begin < hi)
        if (inside & forward).any():
            out[i] = min(int(hi), max(int(lo), int(finish[inside].max())))
    return out


def has_unit_labels(labels: pd.DataFrame) -> bool:
    """Whether the labels name units at all (else only the whole-step analysis applies)."""
    return bool((labels["family"].isin([FAMILY_FSDP2, FAMILY_FSDPVIZ]) & (labels["unit"] != "")).any())
