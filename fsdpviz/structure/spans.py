"""The per-unit timeline of one rank: the SPANS table.

Every span says what a unit did (all-gather, copy-in, copy-out, compute, reduce-scatter,
all-reduce, reshard), in which pass and step, on which lane and when:

- collectives (see ``collectives``) belong to the unit whose gather label
  (``FSDP::all_gather (u)``, ``fsdpviz::all_gather (u)``) or reduce label
  (``FSDP::post_backward_reduce (u)``, ``fsdpviz::reduce_scatter (u)``) encloses their issue point;
  a label naming several units (ZeRO-3 gathers and reduces buckets) gives each of them the span,
  with ``n_units`` saying how many shared it;
  the pass is the one of the innermost label around it that implies a pass (``pre_forward``,
  ``forward_prefetch``, ``pre_backward``, ``backward_prefetch``, ``fsdpviz::backward``...);
- every span carries the index of the step's forward/backward pass it belongs to (``micro``: 0, or
  the micro-batch under gradient accumulation, see ``labels``), from the CPU time it was issued at;
- copy-in is FSDP2's ``fsdp::all_gather_copy_in`` op, copy-out its ``FSDP::all_gather_copy_out (u)``
  label, reshard its ``FSDP::post_forward (u)`` / ``FSDP::post_backward_reshard (u)`` labels;
- compute is the work in the unit's compute pieces (see ``windows``);
- the optimizer step (``Optimizer.step#...``) is a compute span of no unit.

On a CPU rank a span is the CPU interval itself, except compute: from the first op's start to the
last op's end inside the piece (a piece with no op at all, Python glue between units, is no
span). On a GPU rank the work is the GPU work launched from that CPU interval (matched by
correlation id): one span per CPU interval and stream, from the first kernel's start to the last
one's end; kernels that are not compute by HTA's definition (NCCL, memcpy, memset) are never
compute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import numpy as np
import pandas as pd

from fsdpviz import vocabulary
from fsdpviz.structure import label_rules as rules
from fsdpviz.structure import labels as lab
from fsdpviz.structure.categorical import as_str, startswith
from fsdpviz.structure.collectives import COLLECTIVES, ISSUE_PREFIXES, find_collectives, gpu_ranks
from fsdpviz.structure.nesting import innermost_enclosing
from fsdpviz.structure.windows import compute_pieces, unit_ancestors, unit_windows
from fsdpviz.trace import schema

# What a GPU rank communicates and computes, as HTA 0.5.0 counts it (hta/utils/utils.py): comm =
# ^nccl.*Kernel; "not compute" = that, or a name containing Memcpy, or starting with Memset, or
# containing Sync (re.match semantics). The whole-step overlap and the units' compute read them.
HTA_COMM_RE: Final = re.compile(r"^nccl.*Kernel")
HTA_NOT_COMPUTE_RE: Final = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
GPU_WORK_KINDS: Final = (schema.KIND_KERNEL, schema.KIND_MEMCPY, schema.KIND_MEMSET)
COPY_IN_OP: Final = "fsdp::all_gather_copy_in"
UNIT_COLLECTIVES: Final[schema.Schema] = {
    **COLLECTIVES, "unit": "string", "phase": "string", "kind": "string", "n_units": "int32", "micro": "int32",
}
# Every all-gather a unit's own gather label issued, with what its arguments say of the data.
ISSUED_GATHERS: Final[schema.Schema] = {
    "rank": "int32",
    "step": "int32",
    "unit": "string",
    "bytes": "int64",  # the gathered (unsharded, padded) parameters
    "dtype": "string",  # their element type, "" if the trace does not say
}


@dataclass(kw_only=True, slots=True)
class UnitTables:
    """Per-unit tables of a set of ranks, each rank on its own clock."""

    spans: pd.DataFrame  # schema.SPANS
    windows: pd.DataFrame  # windows.WINDOWS
    pieces: pd.DataFrame  # windows.PIECES
    collectives: pd.DataFrame  # UNIT_COLLECTIVES: every collective, unit "" when of no unit
    gathers: pd.DataFrame  # ISSUED_GATHERS


def _points(rank: np.ndarray | int, lanes: np.ndarray, t: np.ndarray) -> pd.DataFrame:
    # object dtype: no per-row conversion to Arrow strings for hundreds of thousands of launches
    lane = lanes if isinstance(lanes, pd.Categorical) else pd.Series(lanes, dtype=object).to_numpy()
    return pd.DataFrame({"rank": rank, "lane": pd.Series(lane, dtype=lane.dtype if isinstance(
        lane, pd.Categorical) else object), "t_ns": t})


def _phase_at(labels: pd.DataFrame, ranks: np.ndarray, lanes: np.ndarray, t: np.ndarray,
              steps: np.ndarray, micros: np.ndarray) -> np.ndarray:
    """Phase of each point: the innermost enclosing label that implies one, else forward before
    the first backward label of its pass (``micros``), backward after it."""
    phased = labels[(labels["phase"] != "").to_numpy()].reset_index(drop=True)
    hit = innermost_enclosing(phased, _points(ranks, lanes, t))
    names = phased["phase"].to_numpy(dtype=object) if len(phased) else np.array([""], dtype=object)
    phase = np.where(hit >= 0, names[np.clip(hit, 0, None)], "")
    if (phase == "").any():
        late = lab.after_first_backward(phased, ranks, steps, micros, t)
        phase = np.where(phase == "", np.where(late, vocabulary.BACKWARD, vocabulary.FORWARD), phase)
    return phase


def attribute_collectives(coll: pd.DataFrame, labels: pd.DataFrame,
                          passes: pd.DataFrame | None = None) -> pd.DataFrame:
    """UNIT_COLLECTIVES: each collective with the unit, pass and span kind its labels give
    (``passes``: ``labels.pass_starts(labels)`` when the caller has it)."""
    if coll.empty:
        return schema.make_empty(UNIT_COLLECTIVES)
    passes = lab.pass_starts(labels) if passes is None else passes
    ranks = coll["rank"].to_numpy()
    comm_labels = labels[rules.gather(labels) | rules.reduce(labels)].reset_index(drop=True)
    lanes = as_str(coll["issue_lane"])
    t = coll["issue_ns"].to_numpy(np.int64)
    hit = innermost_enclosing(comm_labels, _points(ranks, lanes, t))
    found = hit >= 0
    safe = np.clip(hit, 0, None)
    if len(comm_labels):
        unit = np.where(found, comm_labels["unit"].to_numpy(dtype=object)[safe], "")
        gather = found & (comm_labels["action"].to_numpy(dtype=object)[safe] == lab.GATHER_ACTION)
        listing = found & (comm_labels["family"].to_numpy(dtype=object)[safe] == lab.FAMILY_FSDPVIZ)
    else:
        unit, gather = np.full(len(coll), "", dtype=object), np.zeros(len(coll), dtype=bool)
        listing = gather
    comm = as_str(coll["comm"])
    kind = np.select(
        [gather & (comm == vocabulary.ALL_GATHER),
         found & ~gather & (comm == vocabulary.REDUCE_SCATTER),
         found & ~gather & (comm == vocabulary.ALL_REDUCE)],
        [vocabulary.ALL_GATHER, vocabulary.REDUCE_SCATTER, vocabulary.ALL_REDUCE], default="")
    unit = np.where(kind != "", unit, "")
    micro = lab.pass_index(passes, ranks, coll["step"].to_numpy(), t)
    phase = _phase_at(labels, ranks, lanes, t, coll["step"].to_numpy(), micro)
    phase = np.where(kind == vocabulary.REDUCE_SCATTER, vocabulary.BACKWARD, phase)
    out = coll.assign(unit=unit, phase=np.where(kind != "", phase, ""), kind=kind, micro=micro)
    # An fsdpviz label naming several units (ZeRO-3 buckets, "a, b, c"): one row per unit. (An FSDP2
    # unit of several modules, fully_shard([a, b]), is one unit that FSDP2 itself names "a, b".)
    listed = [lab.listed_units(u) if many else [u] for u, many in zip(out["unit"].tolist(), listing)]
    out = out.assign(unit=listed, n_units=[len(u) for u in listed]).explode("unit", ignore_index=True)
    return schema.conform(out, UNIT_COLLECTIVES, table="unit collectives")


def issued_gathers(events: pd.DataFrame, labels: pd.DataFrame) -> pd.DataFrame:
    """ISSUED_GATHERS: the all-gathers issued (``c10d::*`` on a training thread, with sizes from their
    arguments) inside a gather label of one unit (``FSDP::all_gather (u)``, ``fsdpviz::all_gather (u)``;
    a ZeRO-3 bucket naming several units is no one unit's size). Read from the issuing side, they
    are there also where the collective itself left nothing in the trace (torch's fake process
    group, a backend the profiler does not see)."""
    ops = events[((events["kind"] == schema.KIND_CPU_OP) & (events["comm"] == vocabulary.ALL_GATHER)
                  & (events["comm_bytes"] > 0)).to_numpy() & startswith(events["name"], ISSUE_PREFIXES)]
    one_unit = ((labels["family"] == lab.FAMILY_FSDP2)
                | ~labels["unit"].astype(str).str.contains(", ", regex=False)).to_numpy()
    gathers = labels[rules.gather(labels) & one_unit].reset_index(drop=True)
    if ops.empty or gathers.empty:
        return schema.make_empty(ISSUED_GATHERS)
    hit = innermost_enclosing(gathers, _points(ops["rank"].to_numpy(), as_str(ops["lane"]),
                                                ops["start_ns"].to_numpy(np.int64)))
    ok = hit >= 0
    return schema.conform(pd.DataFrame({
        "rank": ops["rank"].to_numpy()[ok], "step": ops["step"].to_numpy()[ok],
        "unit": gathers["unit"].to_numpy(dtype=object)[hit[ok]],
        "bytes": ops["comm_bytes"].to_numpy()[ok], "dtype": as_str(ops["comm_dtype"])[ok],
    }), ISSUED_GATHERS, table="issued gathers")


def gpu_work(events: pd.DataFrame) -> pd.DataFrame:
    """GPU events with the rank, lane and time of the CPU call that launched them."""
    gpu = events[events["kind"].isin(list(GPU_WORK_KINDS)).to_numpy()]
    launches = events[((events["kind"] == schema.KIND_RUNTIME) & (events["correlation"] >= 0)).to_numpy()]
    launches = launches.drop_duplicates(["rank", "correlation"])
    by_corr = pd.DataFrame({"rank": launches["rank"].to_numpy(), "correlation": launches["correlation"].to_numpy(),
                            "launch_lane": pd.Series(as_str(launches["lane"]), dtype=object),
                            "launch_ns": pd.array(launches["start_ns"].to_numpy(), dtype="Int64")})
    names = gpu["name"]
    cats = names.cat.categories if isinstance(names.dtype, pd.CategoricalDtype) else pd.Index(names.unique())
    not_compute = {c: HTA_NOT_COMPUTE_RE.match(str(c)) is not None for c in cats}  # once per distinct name
    start = gpu["start_ns"].to_numpy(np.int64)
    work = pd.DataFrame({
        "rank": gpu["rank"].to_numpy(),
        "lane": pd.Series(as_str(gpu["lane"]), dtype=object),
        "start_ns": start,
        "end_ns": start + gpu["dur_ns"].to_numpy(np.int64),
        "correlation": gpu["correlation"].to_numpy(),
        "is_comm": (gpu["comm"] != "").to_numpy(),
        "is_compute": ~names.map(not_compute).astype(bool).to_numpy(),
    }).merge(by_corr, on=["rank", "correlation"], how="left")
    work = work[work["launch_ns"].notna().to_numpy()]
    return work.astype({"launch_ns": np.int64})


def _spans_from(cpu: pd.DataFrame, kind: str, gpu: pd.DataFrame | None, gpu_ranks: set[int],
                gpu_mask: str | None = None) -> pd.DataFrame:
    """Spans for CPU intervals ``cpu`` (rank, lane, step, unit, phase, start_ns, end_ns): the
    intervals themselves on CPU ranks; on GPU ranks the GPU work launched inside each, per stream."""
    if cpu.empty:
        return pd.DataFrame()
    cpu = cpu.reset_index(drop=True)
    on_gpu = cpu["rank"].isin(list(gpu_ranks)).to_numpy() if gpu is not None else np.zeros(len(cpu), bool)
    out = [cpu[~on_gpu].assign(kind=kind, bytes=schema.UNKNOWN_BYTES, issue_ns=cpu.loc[~on_gpu, "start_ns"])]
    if gpu is not None and on_gpu.any():
        host = cpu[on_gpu].reset_index(drop=True)
        work = gpu[gpu[gpu_mask].to_numpy()] if gpu_mask else gpu[~gpu["is_comm"].to_numpy()]
        hit = innermost_enclosing(host, _points(work["rank"].to_numpy(), work["launch_lane"].to_numpy(),
                                                work["launch_ns"].to_numpy()))
        work = work.assign(owner=hit)[hit >= 0]
        if len(work):
            agg = work.groupby(["owner", "lane"], sort=False).agg(start_ns=("start_ns", "min"),
                                                                   end_ns=("end_ns", "max"),
                                                                   issue_ns=("launch_ns", "min")).reset_index()
            meta = host.loc[agg["owner"].to_numpy(), ["rank", "step", "unit", "phase", "micro"]].reset_index(drop=True)
            mapped = pd.concat([meta, agg[["lane", "start_ns", "end_ns", "issue_ns"]]], axis=1)
            out.append(mapped.assign(kind=kind, bytes=schema.UNKNOWN_BYTES))
    return pd.concat([o for o in out if len(o)], ignore_index=True) if any(len(o) for o in out) else pd.DataFrame()


def _cpu_compute_spans(pieces: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """Compute spans of CPU ranks: per piece, from its first op's start to its last op's end (cut
    at the piece's end). Pieces without any op (Python glue between units) are no compute span."""
    if pieces.empty:
        return pd.DataFrame()
    pieces = pieces.reset_index(drop=True)
    ops = events[((events["kind"] == schema.KIND_CPU_OP)
                  & events["rank"].isin(pieces["rank"].unique().tolist())).to_numpy()]
    start = ops["start_ns"].to_numpy(np.int64)
    owner = innermost_enclosing(pieces, _points(ops["rank"].to_numpy(), as_str(ops["lane"]), start))
    inside = owner >= 0
    if not inside.any():
        return pd.DataFrame()
    frame = pd.DataFrame({"owner": owner[inside], "start_ns": start[inside],
                          "end_ns": start[inside] + ops["dur_ns"].to_numpy(np.int64)[inside]})
    agg = frame.groupby("owner").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max")).reset_index()
    meta = pieces.loc[agg["owner"].to_numpy(), ["rank", "lane", "step", "unit", "phase", "micro",
                                                "end_ns"]].reset_index(drop=True)
    out = meta.rename(columns={"end_ns": "piece_end_ns"}).assign(
        start_ns=agg["start_ns"].to_numpy(), end_ns=np.minimum(agg["end_ns"].to_numpy(), meta["end_ns"].to_numpy()))
    out = out.drop(columns=["piece_end_ns"])
    return out.assign(kind=vocabulary.COMPUTE, bytes=schema.UNKNOWN_BYTES, issue_ns=out["start_ns"])


def unit_tables(events: pd.DataFrame, lanes: pd.DataFrame, labels: pd.DataFrame) -> UnitTables:
    """Spans, windows, compute pieces and attributed collectives of every rank in ``events``."""
    windows = unit_windows(labels)
    pieces = compute_pieces(windows, labels, unit_ancestors(windows))
    passes = lab.pass_starts(labels)
    coll = attribute_collectives(find_collectives(events, lanes), labels, passes)
    on_gpu = gpu_ranks(events)
    gpu = gpu_work(events[events["rank"].isin(list(on_gpu)).to_numpy()]) if on_gpu else None
    parts = []

    unit_coll = coll[(coll["kind"] != "").to_numpy()]
    if len(unit_coll):
        parts.append(unit_coll[["rank", "step", "unit", "phase", "kind", "lane", "start_ns", "end_ns", "bytes",
                                "issue_ns", "n_units", "micro"]])

    # copy-in: FSDP2's copy-in op, inside the unit's gather label
    ops = events[((events["kind"] == schema.KIND_CPU_OP) & (events["name"] == COPY_IN_OP)).to_numpy()]
    if len(ops):
        gathers = labels[rules.gather(labels)].reset_index(drop=True)
        ranks_ = ops["rank"].to_numpy()
        lanes_ = as_str(ops["lane"])
        t = ops["start_ns"].to_numpy(np.int64)
        hit = innermost_enclosing(gathers, _points(ranks_, lanes_, t))
        ok = hit >= 0
        if ok.any():
            op_steps = ops["step"].to_numpy()
            micro = lab.pass_index(passes, ranks_, op_steps, t)
            copy_in = pd.DataFrame({
                "rank": ranks_[ok], "lane": lanes_[ok], "step": op_steps[ok],
                "unit": gathers["unit"].to_numpy(dtype=object)[hit[ok]],
                "phase": _phase_at(labels, ranks_, lanes_, t, op_steps, micro)[ok], "micro": micro[ok],
                "start_ns": t[ok], "end_ns": t[ok] + ops["dur_ns"].to_numpy(np.int64)[ok]})
            parts.append(_spans_from(copy_in, vocabulary.COPY_IN, gpu, on_gpu))

    def label_rows(mask: np.ndarray, phase: np.ndarray | str) -> pd.DataFrame:
        rows = labels[mask]
        return pd.DataFrame({"rank": rows["rank"].to_numpy(), "lane": rows["lane"].to_numpy(),
                             "step": rows["step"].to_numpy(), "unit": rows["unit"].to_numpy(), "phase": phase,
                             "micro": rows["micro"].to_numpy(), "start_ns": rows["start_ns"].to_numpy(),
                             "end_ns": rows["end_ns"].to_numpy()})

    fsdp2 = (labels["family"] == lab.FAMILY_FSDP2).to_numpy()
    copy_out_mask = rules.copy_out(labels)
    if copy_out_mask.any():
        rows = labels[copy_out_mask]
        phase = _phase_at(labels, rows["rank"].to_numpy(), rows["lane"].to_numpy(),
                          rows["start_ns"].to_numpy(np.int64), rows["step"].to_numpy(), rows["micro"].to_numpy())
        parts.append(_spans_from(label_rows(copy_out_mask, phase), vocabulary.COPY_OUT, gpu, on_gpu))
    for action, phase_name in lab.RESHARD_ACTIONS.items():
        mask = fsdp2 & (labels["action"] == action).to_numpy()
        if mask.any():  # resharding frees memory on the CPU side: always the label itself
            parts.append(_spans_from(label_rows(mask, phase_name), vocabulary.RESHARD, None, set()))

    if len(pieces):
        on_cpu = ~pieces["rank"].isin(list(on_gpu)).to_numpy()
        parts.append(_spans_from(pieces[~on_cpu], vocabulary.COMPUTE, gpu, on_gpu, "is_compute"))
        parts.append(_cpu_compute_spans(pieces[on_cpu], events))
    opt = events[((events["kind"] == schema.KIND_ANNOTATION)
                  & startswith(events["name"], rules.OPTIMIZER_STEP_PREFIX)).to_numpy()]
    if len(opt):
        end = (opt["start_ns"] + opt["dur_ns"]).to_numpy(np.int64)
        # a closure's forward and backward ran inside the range: they are the units', not the optimizer's
        start = lab.optimizer_own_starts(opt["rank"].to_numpy(), opt["start_ns"].to_numpy(np.int64), end, labels)
        steps_ = pd.DataFrame({"rank": opt["rank"].to_numpy(), "lane": as_str(opt["lane"]),
                               "step": opt["step"].to_numpy(), "unit": "", "phase": vocabulary.OPTIMIZER,
                               "micro": lab.pass_index(passes, opt["rank"].to_numpy(), opt["step"].to_numpy(), start),
                               "start_ns": start, "end_ns": end})
        parts.append(_spans_from(steps_, vocabulary.COMPUTE, gpu, on_gpu, "is_compute"))

    parts = [p for p in parts if len(p)]
    if parts:
        spans = pd.concat(parts, ignore_index=True)
        spans["n_units"] = spans["n_units"].fillna(1) if "n_units" in spans else 1
        spans = spans.sort_values(["rank", "step", "start_ns", "lane"], kind="stable").reset_index(drop=True)
        spans = schema.conform(spans, schema.SPANS, table="spans")
    else:
        spans = schema.make_empty(schema.SPANS)
    return UnitTables(spans=spans, windows=windows, pieces=pieces, collectives=coll,
                      gathers=issued_gathers(events, labels))
