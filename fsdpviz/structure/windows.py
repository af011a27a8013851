"""Unit windows: when each unit ran its forward and backward, and which CPU time was its own compute.

A unit's **window** in a pass runs from the label that opens it to the label that closes it:

- FSDP2 forward: ``FSDP::pre_forward (u)`` start -> ``FSDP::post_forward (u)`` end;
  backward: ``FSDP::pre_backward (u)`` start -> end of its last ``FSDP::post_backward_* (u)``.
- fsdpviz ranges (FSDP1, ZeRO-3): ``fsdpviz::forward (u)`` / ``fsdpviz::backward (u)`` as they are.

Its **compute region** is the part between FSDP's own pre and post work: from the end of the
pre label to the start of the first post label (for fsdpviz ranges, the whole range). When FSDP2
defers a unit's post-backward to ``FSDP::root_post_backward_callback`` the region stops where that
callback starts.

The unit's **compute pieces** are its region minus the windows of other units that claim part of it,
and minus the framework's labels inside it (prefetches, waits, FSDP1 hooks, ZeRO-3 fetches and
releases): the CPU time the unit spent in its own model code. On GPU the kernels launched from those
pieces are the unit's compute. A window claims the time it shares with another unit's region when

- its unit is a descendant of the other (the root's own compute is what lies outside its children),
  wherever the labels open: FSDP2 opens the root's bare ``FSDP::pre_backward`` inside the backward
  of the unit that computes first in backward (``[norm, output]`` in the torchtitan shape), yet that
  unit's gradients are its own work;
- or it opens inside the other's region and is not its ancestor: a sibling that starts before this
  unit's window closes, as when autograd runs FSDP1's next unit while the previous one still
  accumulates gradients -- from there on the time is the newer unit's.

Ancestry is the nesting of the forward windows (:func:`unit_ancestors`).
"""

from __future__ import annotations

from typing import Final, Literal, cast

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure import label_rules as rules
from fsdpviz.structure import labels as lab
from fsdpviz.structure.intervals import complement, union_intervals
from fsdpviz.trace import schema

WINDOWS: Final[schema.Schema] = {
    "rank": "int32",
    "lane": "string",
    "step": "int32",
    "unit": "string",
    "phase": "string",
    "micro": "int32",  # the pass of the step (labels.LABELS)
    "start_ns": "int64",  # window: opening label start
    "end_ns": "int64",  # window: closing label end
    "region_start_ns": "int64",  # compute region
    "region_end_ns": "int64",
    "excl_end_ns": "int64",  # where the window stops hiding its parent's time (deferred post-backward)
}
PIECES: Final[schema.Schema] = {
    "rank": "int32",
    "lane": "string",
    "step": "int32",
    "unit": "string",
    "phase": "string",
    "micro": "int32",
    "start_ns": "int64",
    "end_ns": "int64",
}


def _first_after(left: pd.DataFrame, right: pd.DataFrame, left_on: str, right_on: str,
                 by: list[str], direction: Literal["backward", "forward"]) -> pd.DataFrame:
    """``merge_asof`` that tolerates empty frames. Right-hand integers become nullable ``Int64``:
    a float64 NaN would round nanosecond times on the wall clock (1.7e18) to 256 ns."""
    ints = {c: "Int64" for c in right.columns
            if c not in by and c != right_on and pd.api.types.is_integer_dtype(right[c])}
    right = right.astype(ints)
    if left.empty:
        return left.assign(**{c: pd.Series(dtype=right[c].dtype) for c in right.columns if c not in by})
    lsorted = left.sort_values(left_on, kind="stable")
    rsorted = right.assign(**{f"_{right_on}": right[right_on].astype("Int64")}).sort_values(right_on, kind="stable")
    merged = pd.merge_asof(lsorted, rsorted, left_on=left_on, right_on=right_on, by=by, direction=direction,
                           allow_exact_matches=True)
    # the right key as matched (merge_asof returns the left key under the right's name)
    if right_on != left_on:
        merged[right_on] = merged.pop(f"_{right_on}")
    else:
        merged = merged.drop(columns=[f"_{right_on}"])
    return merged


def _fsdp2_windows(labels: pd.DataFrame) -> pd.DataFrame:
    f2 = labels[(labels["family"] == lab.FAMILY_FSDP2).to_numpy()]
    key = ["rank", "lane", "unit"]
    frames = []
    # forward: pre_forward -> first post_forward of the same unit on the same lane after it
    # (a pre_forward marked backward is activation-checkpoint recomputation: not a forward window)
    pre = f2.loc[(f2["action"] == lab.PRE_FORWARD) & (f2["phase"] == vocabulary.FORWARD),
                 key + ["step", "micro", "start_ns", "end_ns"]]
    post = f2.loc[f2["action"] == lab.POST_FORWARD, key + ["start_ns", "end_ns"]].rename(
        columns={"start_ns": "post_start_ns", "end_ns": "post_end_ns"})
    fwd = _first_after(pre, post, "end_ns", "post_start_ns", key, "forward").dropna(subset=["post_start_ns"])
    # a unit of several modules (fully_shard([a, b])) runs its pre-forward hook on each: the first opens
    # the window, the others run inside it and end at the same post_forward, one window in all (as two,
    # the second module's compute counted twice)
    fwd = fwd.sort_values("start_ns", kind="stable").drop_duplicates(key + ["step", "micro", "post_start_ns"],
                                                                     keep="first")
    if len(fwd):
        fwd = fwd.assign(phase=vocabulary.FORWARD, region_start_ns=fwd["end_ns"],
                         region_end_ns=fwd["post_start_ns"], end_ns=fwd["post_end_ns"])
        fwd["excl_end_ns"] = fwd["end_ns"]
        frames.append(fwd)
    # backward: post-backward labels belong to the latest pre_backward of the unit before them
    pre_b = f2.loc[f2["action"] == lab.PRE_BACKWARD, ["rank", "unit", "lane", "step", "micro", "start_ns", "end_ns"]]
    pre_b = pre_b.assign(pre_id=np.arange(len(pre_b)))
    posts = f2.loc[f2["action"].isin(list(lab.POST_BACKWARD_ACTIONS)).to_numpy(), ["rank", "unit", "start_ns", "end_ns"]]
    callbacks = f2.loc[f2["action"] == lab.ROOT_POST_BACKWARD, ["rank", "start_ns", "end_ns"]]
    if len(pre_b):
        owner = _first_after(posts.rename(columns={"start_ns": "p_start", "end_ns": "p_end"}),
                             pre_b[["rank", "unit", "start_ns", "pre_id"]], "p_start", "start_ns",
                             ["rank", "unit"], "backward").dropna(subset=["pre_id"])
        # a post label inside the root's callback: the region ends where the callback starts
        cb = _first_after(owner[["rank", "p_start"]].reset_index(), callbacks.rename(
            columns={"start_ns": "cb_start", "end_ns": "cb_end"}), "p_start", "cb_start", ["rank"], "backward")
        cb = cb.set_index("index").reindex(owner.index)
        in_cb = (cb["cb_end"] > owner["p_start"]).fillna(False).to_numpy(dtype=bool)
        cb_start = cb["cb_start"].fillna(0).to_numpy(dtype=np.int64)
        owner = owner.assign(region_cut=np.where(in_cb, cb_start, owner["p_start"].to_numpy(np.int64)),
                             excl_cut=np.where(in_cb, cb_start, owner["p_end"].to_numpy(np.int64)))
        agg = owner.groupby("pre_id").agg(region_end_ns=("region_cut", "min"), end_ns=("p_end", "max"),
                                          excl_end_ns=("excl_cut", "max"))
        bwd = pre_b.join(agg.astype("Int64").add_suffix("_post"), on="pre_id")
        bwd = bwd.dropna(subset=["region_end_ns_post"])
        bwd = bwd.assign(phase=vocabulary.BACKWARD, region_start_ns=bwd["end_ns"],
                         region_end_ns=bwd["region_end_ns_post"], end_ns=bwd["end_ns_post"],
                         excl_end_ns=bwd["excl_end_ns_post"])
        frames.append(bwd)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(WINDOWS))


def _fsdpviz_windows(labels: pd.DataFrame) -> pd.DataFrame:
    # a forward range marked backward is recomputation inside backward: not a window of its own
    fv = labels[((labels["family"] == lab.FAMILY_FSDPVIZ)
                 & labels["action"].isin([vocabulary.FORWARD, vocabulary.BACKWARD])
                 & (labels["phase"] == labels["action"])).to_numpy()]
    return fv.assign(phase=fv["action"], region_start_ns=fv["start_ns"], region_end_ns=fv["end_ns"],
                     excl_end_ns=fv["end_ns"])


def unit_windows(labels: pd.DataFrame) -> pd.DataFrame:
    """WINDOWS: one row per unit, pass and occurrence, from FSDP2 labels and fsdpviz ranges."""
    parts = [p for p in (_fsdp2_windows(labels), _fsdpviz_windows(labels)) if len(p)]
    if not parts:
        return schema.make_empty(WINDOWS)
    out = pd.concat([p[list(WINDOWS)] for p in parts], ignore_index=True)
    out = out[out["region_end_ns"] >= out["region_start_ns"]]
    out = out.sort_values(["rank", "lane", "start_ns"], kind="stable").reset_index(drop=True)
    return schema.conform(out, WINDOWS, table="windows")


def first_backward_ns(windows: pd.DataFrame) -> pd.Series:
    """The start of each pass's first backward window, (rank, step, micro) -> ns: what comes at or after
    it in that pass is backward. Per pass, not per step: under gradient accumulation the next
    micro-batch's forward comes after this one's backward."""
    rows = windows[(windows["phase"] == vocabulary.BACKWARD).to_numpy()]
    return rows.groupby(["rank", "step", "micro"])["start_ns"].min()


def overhead_labels(labels: pd.DataFrame) -> pd.DataFrame:
    """Framework ranges that are never a unit's own compute."""
    framework = labels["family"].isin([lab.FAMILY_FSDP2, lab.FAMILY_FSDP1, lab.FAMILY_HOOKS]).to_numpy()
    return labels[framework | rules.fsdpviz_collective(labels, fetch=True)]


def compute_pieces(windows: pd.DataFrame, labels: pd.DataFrame,
                   ancestors: dict[str, set[str]] | None = None) -> pd.DataFrame:
    """PIECES: each window's compute region minus the windows of units that claim part of it (see
    the module docstring) and minus framework labels. ``ancestors``: :func:`unit_ancestors`."""
    if windows.empty:
        return schema.make_empty(PIECES)
    ancestors = unit_ancestors(windows) if ancestors is None else ancestors
    overhead = overhead_labels(labels)
    over_groups = overhead.groupby(["rank", "lane"], sort=False).indices
    ov_s = overhead["start_ns"].to_numpy(np.int64)
    ov_e = overhead["end_ns"].to_numpy(np.int64)
    rows: list[tuple] = []
    # Whole columns as numpy once (units and phases as integer codes): the loop below runs once per
    # window, tens of thousands of times on a big run, and must not touch pandas.
    all_start = windows["start_ns"].to_numpy(np.int64)
    all_excl = windows["excl_end_ns"].to_numpy(np.int64)
    all_lo = windows["region_start_ns"].to_numpy(np.int64)
    all_hi = windows["region_end_ns"].to_numpy(np.int64)
    all_step = windows["step"].to_numpy()
    all_micro = windows["micro"].to_numpy()
    all_units = windows["unit"].to_numpy(dtype=object)
    all_phases = windows["phase"].to_numpy(dtype=object)
    unit_code, unit_names = pd.factorize(all_units)
    phase_code = pd.factorize(all_phases)[0]
    # is_ancestor[a, d]: unit a encloses unit d in forward
    names = [str(u) for u in unit_names]
    is_ancestor = np.array([[a in ancestors.get(d, ()) for d in names] for a in names],
                           dtype=bool).reshape(len(names), len(names))
    for key, w_idx in windows.groupby(["rank", "lane"], sort=False).indices.items():
        rank, lane = cast(tuple[int, str], key)
        o = over_groups.get((rank, lane), np.zeros(0, dtype=np.int64))
        u_s, u_e = union_intervals(ov_s[o], ov_e[o])
        w_start, w_excl = all_start[w_idx], all_excl[w_idx]
        order = np.argsort(w_start, kind="stable")
        sorted_start = w_start[order]
        units, phases = unit_code[w_idx], phase_code[w_idx]
        for j, (lo, hi) in enumerate(zip(all_lo[w_idx].tolist(), all_hi[w_idx].tolist())):
            # windows of other units that open inside this region and are not its ancestors...
            a, b = np.searchsorted(sorted_start, (lo, hi), side="left")
            kids = order[a:b]
            kids = kids[(units[kids] != units[j]) & (phases[kids] == phases[j])
                        & ~is_ancestor[units[kids], units[j]]]
            # ...and those of its descendants that reach into it from before it opened
            early = order[:a]
            early = early[is_ancestor[units[j], units[early]] & (phases[early] == phases[j])
                          & (w_excl[early] > lo)]
            if len(early):
                kids = np.concatenate([kids, early])
            k0, k1 = np.searchsorted(u_e, lo, side="right"), np.searchsorted(u_s, hi, side="left")
            if len(kids) == 0 and k1 <= k0:  # nothing to cut out: the whole region
                if lo < hi:
                    row = w_idx[j]
                    rows.append((rank, lane, int(all_step[row]), all_units[row], all_phases[row],
                                 int(all_micro[row]), lo, hi))
                continue
            cut_s = np.concatenate([u_s[k0:k1], w_start[kids]])
            cut_e = np.concatenate([u_e[k0:k1], w_excl[kids]])
            row = w_idx[j]
            for s, e in complement(lo, hi, union_intervals(cut_s, cut_e)):
                rows.append((rank, lane, int(all_step[row]), all_units[row], all_phases[row], int(all_micro[row]),
                             s, e))
    frame = pd.DataFrame(rows, columns=list(PIECES))
    return schema.conform(frame, PIECES, table="pieces")


def unit_ancestors(windows: pd.DataFrame) -> dict[str, set[str]]:
    """unit -> the units whose windows enclose its own (its ancestors), read from the forward
    windows of the first rank and step that has any (nesting does not change between steps)."""
    fwd = windows[windows["phase"] == vocabulary.FORWARD]
    if fwd.empty:
        fwd = windows
    if fwd.empty:
        return {}
    first = fwd.sort_values(["rank", "step"], kind="stable").iloc[0]
    w = fwd[(fwd["rank"] == first["rank"]) & (fwd["step"] == first["step"])].drop_duplicates("unit")
    starts, ends = w["start_ns"].to_numpy(np.int64), w["end_ns"].to_numpy(np.int64)
    units = w["unit"].to_numpy(dtype=object)
    out: dict[str, set[str]] = {}
    for i, unit in enumerate(units):
        around = (starts <= starts[i]) & (ends >= ends[i]) & (units != unit)
        out[str(unit)] = {str(u) for u in units[around]}
    return out
